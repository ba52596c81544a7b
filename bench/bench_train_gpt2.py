"""The PyTorch peer of bench_train_gpt2: Hugging Face GPT2LMHeadModel trained
on the initial weights and batches that the C++ bench wrote, timed the same
way (synchronise after the warm-up steps and after the last timed step).

Variants (--variant):
  eager-amp    fp32 parameters, torch.autocast(bfloat16), AdamW(fused=True):
               bf16 compute with fp32 master weights, as Colossus does.
  eager-bf16   bf16 parameters, AdamW(fused=True) on them (no fp32 masters).
  compile-amp  eager-amp under torch.compile (compiled during the warm-up).

Usage: bench_train_gpt2.py --init DIR --data FILE --batch B --seq T --steps S
         --warmup W --phase-steps P --variant V [--device cuda|cpu]
Prints progress on stderr and one JSON object as the last line of stdout:
tokens_per_s, ms_per_step, the loss of every step, peak memory and the mean
device milliseconds of forward, backward and optimizer over P extra steps.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch
import transformers

IMPLS = {
    "eager-amp": "HF eager, fp32 params + autocast bf16",
    "eager-bf16": "HF eager, bf16 params",
    "compile-amp": "HF torch.compile, fp32 + autocast",
    "compile-bf16": "HF torch.compile, bf16 params",
}


def log(*args):
    print("[bench_train_gpt2.py]", *args, file=sys.stderr, flush=True)


class Marks:
    """Device time between points of the step: CUDA events (host clock on CPU)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event, time.perf_counter()
        return None, time.perf_counter()

    def device_ms(self, a, b):
        return a[0].elapsed_time(b[0]) if self.cuda else (b[1] - a[1]) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--phase-steps", type=int, default=0)
    ap.add_argument("--variant", choices=sorted(IMPLS), required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile-steps", type=int, default=0)
    ap.add_argument("--checkpoint", choices=["none", "full"], default="none")
    args = ap.parse_args()
    # Keep the log to what matters: no load progress bars or config warnings.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    # An explicit index: torch.cuda.set_device refuses a bare "cuda".
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)

    amp = args.variant.endswith("-amp")
    param_dtype = torch.float32 if amp else torch.bfloat16
    # GPT-2 or LLaMA: whichever config.json the C++ side saved.
    model = transformers.AutoModelForCausalLM.from_pretrained(args.init, dtype=param_dtype, attn_implementation="sdpa")
    model.to(device).train()
    if args.checkpoint == "full":
        # transformers' own activation checkpointing: every decoder layer reruns in backward.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tokens = np.fromfile(args.data, dtype="<i4").reshape(-1, args.batch, args.seq)
    data = torch.from_numpy(tokens.astype(np.int64)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if args.variant.startswith("compile") else model

    def forward(step):
        ids = data[step % data.shape[0]]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            return step_model(input_ids=ids, labels=ids).loss

    def update():
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    losses = []  # tensors; .item() only after the clock stops
    step = 0
    warm_start = time.perf_counter()
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync()
            start = time.perf_counter()
            log(f"{args.variant}: warm-up took {start - warm_start:.1f} s")
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
        loss = forward(step)
        loss.backward()
        update()
        losses.append(loss.detach())
        step += 1
    sync()
    elapsed = time.perf_counter() - start
    ms_per_step = elapsed * 1e3 / args.steps

    marks = Marks(device)
    names = ("forward+loss", "backward", "optimizer", "step")
    device_ms = dict.fromkeys(names, 0.0)
    host_ms = dict.fromkeys(names, 0.0)
    for _ in range(args.phase_steps):
        m0 = marks.mark()
        loss = forward(step)
        m1 = marks.mark()
        loss.backward()
        m2 = marks.mark()
        update()
        m3 = marks.mark()
        sync()
        step += 1
        for name, (a, b) in zip(names, ((m0, m1), (m1, m2), (m2, m3), (m0, m3))):
            device_ms[name] += marks.device_ms(a, b) / args.phase_steps
            host_ms[name] += (b[1] - a[1]) * 1e3 / args.phase_steps

    kernels = []
    if args.profile_steps > 0 and device.type == "cuda":
        # Device time per kernel name over a few more steps (the C++ side
        # categorises and prints them beside ours).
        sync()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.profile_steps):
                loss = forward(step)
                loss.backward()
                update()
                step += 1
            sync()
        totals = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                t = totals.setdefault(e.name, [0.0, 0])
                t[0] += e.time_range.elapsed_us() / 1e3
                t[1] += 1
        kernels = sorted(
            ({"name": n, "device_ms": ms / args.profile_steps, "calls": c / args.profile_steps} for n, (ms, c) in totals.items()),
            key=lambda k: -k["device_ms"],
        )

    result = {
        "variant": args.variant,
        "impl": IMPLS[args.variant] + (", gradient checkpointing" if args.checkpoint == "full" else ""),
        "ms_per_step": ms_per_step,
        "tokens_per_s": args.batch * args.seq * 1e3 / ms_per_step,
        "losses": [l.item() for l in losses],
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else 0.0,
        "phases_device_ms": device_ms if args.phase_steps else {},
        "phases_host_ms": host_ms if args.phase_steps else {},
        "kernels": kernels,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
