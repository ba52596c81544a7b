#!/usr/bin/env python3
"""transformers' MixtralForCausalLM as the oracle for Colossus' Mixtral (tests only).

  mixtral_oracle.py make OUT_DIR
      For each case: a random tiny HF Mixtral saved with save_pretrained into
      OUT_DIR/<case>/, plus reference.safetensors with input_ids, labels,
      logits, loss (with router_aux_loss_coef * aux_loss), aux_loss and, for
      every parameter under its checkpoint name (block_sparse_moe.experts.M.w1/w2/w3,
      as save_pretrained writes them), "grad.<name>".

  mixtral_oracle.py check DIR...
      DIR was written by Colossus' save_pretrained and holds cpp_logits.safetensors
      (input_ids, logits, aux_loss). Requires a clean from_pretrained load and
      logits / aux loss within TOLERANCE. Exit 1 if not.
"""
import argparse
import pathlib
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

from expert_grads import MIXTRAL_NAMES, checkpoint_grads

TOLERANCE = 1e-4
BATCH, SEQ = 2, 16


def mixtral(**overrides):
    settings = dict(vocab_size=96, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                    initializer_range=0.2, rms_norm_eps=1e-5, num_local_experts=4, num_experts_per_tok=2,
                    output_router_logits=True, router_aux_loss_coef=0.05)
    settings.update(overrides)
    return transformers.MixtralConfig(**settings)


CASES = {
    "mixtral_top2": mixtral,
    "mixtral_top1": lambda: mixtral(num_experts_per_tok=1, num_local_experts=8, num_key_value_heads=4),
    # Mixtral honours sliding_window on every layer, as Mistral: 6 of the 16 tokens.
    "mixtral_window": lambda: mixtral(sliding_window=6),
}


def make(out_dir: pathlib.Path) -> None:
    for case, build_config in CASES.items():
        torch.manual_seed(20240607)
        config = build_config()
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        model.eval()
        case_dir = out_dir / case
        model.save_pretrained(case_dir, safe_serialization=True)
        input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
        labels = input_ids.clone()
        labels[0, :3] = -100
        out = model(input_ids=input_ids, labels=labels)
        out.loss.backward()
        tensors = {"input_ids": input_ids, "labels": labels, "logits": out.logits.detach().contiguous(),
                   "loss": out.loss.detach().reshape(1), "aux_loss": out.aux_loss.detach().reshape(1)}
        tensors.update(checkpoint_grads(model, config.intermediate_size, MIXTRAL_NAMES,
                                        rename=lambda name: name.replace(".mlp.", ".block_sparse_moe.")))
        save_file(tensors, str(case_dir / "reference.safetensors"))


def check(dirs) -> int:
    failures = 0
    for d in map(pathlib.Path, dirs):
        model, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
        problems = {k: v for k, v in info.items() if v}
        ref = load_file(str(d / "cpp_logits.safetensors"))
        model.eval()
        with torch.no_grad():
            out = model(input_ids=ref["input_ids"], output_router_logits=True)
        diff = (out.logits - ref["logits"]).abs().max().item() if out.logits.shape == ref["logits"].shape else float("inf")
        aux_diff = abs(out.aux_loss.item() - ref["aux_loss"].item())
        ok = not problems and diff <= TOLERANCE and aux_diff <= TOLERANCE
        print(f"{d.name}: {type(model).__name__} max|logits diff| = {diff:.3g}, |aux diff| = {aux_diff:.3g}"
              f"{'' if not problems else f' loading problems: {problems}'} -> {'ok' if ok else 'FAIL'}")
        failures += not ok
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make").add_argument("out_dir", type=pathlib.Path)
    sub.add_parser("check").add_argument("dirs", nargs="+")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.command == "make":
        make(args.out_dir)
        return 0
    return check(args.dirs)


if __name__ == "__main__":
    sys.exit(main())
