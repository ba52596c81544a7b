#!/usr/bin/env python3
"""bitsandbytes as the oracle for NF4 quantisation (tests only).

  nf4_oracle.py IN.safetensors OUT.safetensors
      For each tensor NAME of IN: bitsandbytes.functional.quantize_4bit(NAME,
      blocksize 64, nf4) without and with double quantisation (compress_statistics),
      written as NAME.packed / NAME.absmax / NAME.dequantized (fp32) and
      NAME.dq.packed / .dq.absmax / .dq.absmax_scale / .dq.offset / .dq.dequantized.
"""
import sys

import bitsandbytes.functional as F
import torch
from safetensors.torch import load_file, save_file


def main() -> int:
    tensors = load_file(sys.argv[1])
    out = {}
    for name, weight in tensors.items():
        q, state = F.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=False)
        out[f"{name}.packed"] = q.reshape(-1).contiguous()
        out[f"{name}.absmax"] = state.absmax.contiguous()
        state.dtype = torch.float32  # the products in fp32 (its bf16 CPU kernel rounds its own way)
        out[f"{name}.dequantized"] = F.dequantize_4bit(q, state).contiguous()
        q, state = F.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=True)
        out[f"{name}.dq.packed"] = q.reshape(-1).contiguous()
        out[f"{name}.dq.absmax"] = state.absmax.contiguous()
        out[f"{name}.dq.absmax_scale"] = state.state2.absmax.contiguous()
        out[f"{name}.dq.offset"] = state.offset.reshape(1).float().contiguous()
        state.dtype = torch.float32
        out[f"{name}.dq.dequantized"] = F.dequantize_4bit(q, state).contiguous()
    save_file(out, sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
