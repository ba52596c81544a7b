#!/usr/bin/env python3
"""transformers' Qwen2MoeForCausalLM / Qwen3MoeForCausalLM as the oracle for
Colossus' Qwen MoE families (tests only).

  qwen_moe_oracle.py make OUT_DIR
      For each case: a random tiny HF model (sparse and dense layers mixed)
      saved with save_pretrained into OUT_DIR/<case>/, plus
      reference.safetensors with input_ids, labels, logits, loss (with
      router_aux_loss_coef * aux_loss), aux_loss and, for every parameter
      under its checkpoint name (mlp.experts.M.{gate,up,down}_proj, as
      save_pretrained writes them), "grad.<name>".

  qwen_moe_oracle.py check DIR...
      DIR was written by Colossus' save_pretrained and holds cpp_logits.safetensors
      (input_ids, logits, aux_loss). Requires a clean from_pretrained load, the
      per-expert names on disk, and logits / aux loss within TOLERANCE. Exit 1 if not.

  qwen_moe_oracle.py generate --prompts "1,2,3;4,5" --new N DIR...
      Greedy generate() of each DIR in fp32 (no eos) on each prompt alone;
      prints one JSON line per DIR: {"dir": DIR, "ids": [prompt + N new ids per
      prompt], "margin": the smallest top-2 logit gap over all steps}.
"""
import argparse
import json
import pathlib
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from expert_grads import checkpoint_grads

TOLERANCE = 1e-4
BATCH, SEQ = 2, 16
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-5,
              moe_intermediate_size=32, output_router_logits=True, router_aux_loss_coef=0.05)


def qwen2_moe(**overrides):
    settings = dict(COMMON, num_experts=4, num_experts_per_tok=2, shared_expert_intermediate_size=40,
                    mlp_only_layers=[1])
    settings.update(overrides)
    return transformers.Qwen2MoeConfig(**settings)


def qwen3_moe(**overrides):
    settings = dict(COMMON, head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                    mlp_only_layers=[1])
    settings.update(overrides)
    return transformers.Qwen3MoeConfig(**settings)


CASES = {
    # Layer 1 dense (mlp_only_layers); raw top-k weights (norm_topk_prob false, Qwen2-MoE's default).
    "qwen2_moe_mixed": qwen2_moe,
    # decoder_sparse_step 2: only layer 1 sparse; renormalised top-k; layer 0 slides over 6 of 16 tokens
    # (Qwen2MoeConfig's pattern: even layers below max_window_layers).
    "qwen2_moe_step_window": lambda: qwen2_moe(mlp_only_layers=[], decoder_sparse_step=2, norm_topk_prob=True,
                                               use_sliding_window=True, sliding_window=6, max_window_layers=2),
    "qwen3_moe_mixed": qwen3_moe,
    # Every layer sparse and sliding (window 6), biases on q/k/v/o, raw top-k weights.
    "qwen3_moe_window_bias": lambda: qwen3_moe(mlp_only_layers=[], norm_topk_prob=False, use_sliding_window=True,
                                               sliding_window=6, attention_bias=True, num_experts_per_tok=3),
}


def make(out_dir: pathlib.Path) -> None:
    for case, build_config in CASES.items():
        torch.manual_seed(20240611)
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
        tensors.update(checkpoint_grads(model, config.moe_intermediate_size))
        save_file(tensors, str(case_dir / "reference.safetensors"))


def stored_keys(d: pathlib.Path):
    keys = set()
    for f in d.glob("*.safetensors"):
        if f.name == "cpp_logits.safetensors":
            continue
        with safe_open(str(f), "pt") as s:
            keys.update(s.keys())
    return keys


def check(dirs) -> int:
    failures = 0
    for d in map(pathlib.Path, dirs):
        model, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
        problems = {k: v for k, v in info.items() if v}
        if not any(".experts.0.gate_proj.weight" in k for k in stored_keys(d)):
            problems["layout"] = "no per-expert experts.M.gate_proj.weight on disk"
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


def generate(args) -> int:
    failures = 0
    for model_dir in args.dirs:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.eval()
        model.generation_config.eos_token_id = None
        model.generation_config.bos_token_id = None
        model.generation_config.pad_token_id = 0
        all_ids, margins = [], []
        for text in args.prompts.split(";"):
            prompt = torch.tensor([[int(i) for i in text.split(",")]])
            with torch.no_grad():
                out = model.generate(prompt, max_new_tokens=args.new, do_sample=False, temperature=None, top_k=None,
                                     top_p=None, output_scores=True, return_dict_in_generate=True)
            ids = out.sequences[0].tolist()
            failures += len(ids) != prompt.shape[1] + args.new
            all_ids.append(ids)
            margins += [(lambda t: (t[0] - t[1]).item())(torch.topk(s[0].float(), 2).values) for s in out.scores]
        print(json.dumps({"dir": model_dir, "ids": all_ids, "margin": min(margins) if margins else 0.0}))
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make").add_argument("out_dir", type=pathlib.Path)
    sub.add_parser("check").add_argument("dirs", nargs="+")
    g = sub.add_parser("generate")
    g.add_argument("dirs", nargs="+")
    g.add_argument("--prompts", required=True)
    g.add_argument("--new", type=int, required=True)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.command == "make":
        make(args.out_dir)
        return 0
    if args.command == "generate":
        return generate(args)
    return check(args.dirs)


if __name__ == "__main__":
    sys.exit(main())
