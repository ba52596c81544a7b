"""torch.optim.AdamW on CPU, foreach=True and fused=True, for bench_cpu_adam.

Usage: bench_cpu_adam.py NUMEL TENSORS STEPS WARMUP THREADS
Prints one JSON object: {"foreach": ms, "fused": ms, "torch": version}, the
median milliseconds of one optimizer step over STEPS steps after WARMUP.
Same sizes, hyper-parameters and thread count as the C++ side.
"""
import gc
import json
import statistics
import sys
import time

import torch


def run(sizes, steps, warmup, **mode):
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(n, generator=gen).requires_grad_() for n in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **mode)
    for _ in range(warmup):
        opt.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - start) * 1e3)
    del opt, params
    gc.collect()
    return statistics.median(times)


def main():
    numel, tensors, steps, warmup, threads = (int(a) for a in sys.argv[1:6])
    torch.set_num_threads(threads)
    sizes = [numel // tensors + (1 if i < numel % tensors else 0) for i in range(tensors)]
    result = {
        "foreach": run(sizes, steps, warmup, foreach=True),
        "fused": run(sizes, steps, warmup, fused=True),
        "torch": torch.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
