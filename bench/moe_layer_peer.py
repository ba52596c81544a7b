"""The peer of bench_moe_layer: transformers' own Qwen3MoeSparseMoeBlock (a
softmax top-k router with renormalised weights and SwiGLU experts, the math of
our SparseMoeBlock) at the bench's shapes, bf16 on CUDA, timed forward and
forward+backward with each experts implementation transformers ships that runs
here ("eager": its per-expert loop, "grouped_mm": torch._grouped_mm over the
sorted rows). Weights and tokens are drawn like the bench's (normal 0.02,
randn), so routing is as balanced; prints one JSON object:
{"HIDDENxINTERxEXPERTSxTOPKxTOKENS": {"eager": {"fwd_ms", "step_ms"}, ...}}.

  moe_layer_peer.py [--iters N] [--quick]
"""
import argparse
import json
import sys
import time

import torch
from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

FULL = [(4096, 14336, 8, 2, 8192), (2048, 1408, 64, 6, 8192), (2048, 768, 128, 8, 8192)]
QUICK = [(64, 128, 8, 2, 256), (64, 32, 32, 4, 256)]


def time_ms(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / iters


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    result = {}
    for hidden, inter, experts, top_k, tokens in QUICK if args.quick else FULL:
        key = f"{hidden}x{inter}x{experts}x{top_k}x{tokens}"
        result[key] = {}
        for impl in ("eager", "grouped_mm"):
            config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts,
                                    num_experts_per_tok=top_k, norm_topk_prob=True)
            config._experts_implementation = impl
            torch.manual_seed(0)
            block = Qwen3MoeSparseMoeBlock(config).to("cuda", torch.bfloat16)
            with torch.no_grad():
                for p in block.parameters():
                    p.normal_(0.0, 0.02)
            x = torch.randn(1, tokens, hidden, device="cuda", dtype=torch.bfloat16)
            grad = torch.randn_like(x) * 1e-2
            try:
                with torch.no_grad():
                    fwd = time_ms(lambda: block(x), args.iters)
                xg = x.detach().requires_grad_(True)
                step = time_ms(lambda: block(xg).backward(grad), args.iters)
            except Exception as error:  # an implementation this build lacks: say so, time the others
                print(f"{key} {impl}: {type(error).__name__}: {error}", file=sys.stderr)
                continue
            result[key][impl] = {"fwd_ms": fwd, "step_ms": step}
            print(f"{key} {impl}: fwd {fwd:.3f} ms, fwd+bwd {step:.3f} ms", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
