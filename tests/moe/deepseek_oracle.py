#!/usr/bin/env python3
"""transformers' DeepseekV2ForCausalLM / DeepseekV3ForCausalLM as the oracle for
Colossus' DeepSeek models (tests only).

  deepseek_oracle.py make OUT_DIR
      For each case: a random tiny HF model saved with save_pretrained into
      OUT_DIR/<case>/, plus reference.safetensors with input_ids, labels,
      logits, loss and, for every parameter under its checkpoint name
      (mlp.experts.M.{gate,up,down}_proj as save_pretrained writes them),
      "grad.<name>".

  deepseek_oracle.py check DIR...
      DIR was written by Colossus' save_pretrained and holds cpp_logits.safetensors
      (input_ids, logits). Requires a clean from_pretrained load and logits
      within TOLERANCE. Exit 1 if not.

  deepseek_oracle.py generate DIR --prompt 1,2,3[;4,5...] --new N
      Greedy generate() (its own MLA cache) in fp32; prints {"ids": prompt +
      N new tokens, "margin": smallest top-2 logit gap over the steps}.
"""
import argparse
import json
import pathlib
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

from expert_grads import checkpoint_grads

TOLERANCE = 1e-4
BATCH, SEQ = 2, 16
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}


def common(**overrides):
    settings = dict(vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                    n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1,
                    initializer_range=0.2, rms_norm_eps=1e-5)
    settings.update(overrides)
    return settings


def v2(**overrides):
    return transformers.DeepseekV2Config(**common(**{"q_lora_rank": None, "n_shared_experts": 2, **overrides}))


def v3(**overrides):
    return transformers.DeepseekV3Config(**common(**{"q_lora_rank": 16, "n_shared_experts": 1, "n_group": 4,
                                                      "topk_group": 2, "num_experts_per_tok": 3,
                                                      "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                                                      **overrides}))


CASES = {
    # V2-Lite's shape: plain q_proj, greedy softmax routing, yarn with mscale_all_dim.
    "v2_lite_yarn": lambda: v2(rope_parameters=dict(YARN)),
    # V2 with the q bottleneck, group-limited routing, attention and MLP biases.
    "v2_qlora_groups": lambda: v2(q_lora_rank=16, topk_method="group_limited_greedy", n_group=4, topk_group=2,
                                  routed_scaling_factor=1.5, attention_bias=True, mlp_bias=True),
    # V3: sigmoid noaux_tc routing in groups with a non-zero correction bias, interleaved RoPE, yarn.
    "v3_noaux_yarn": lambda: v3(rope_parameters=dict(YARN)),
    # V3 without the q bottleneck, rotate-half RoPE, no renormalisation.
    "v3_plain_rope": lambda: v3(q_lora_rank=None, rope_interleave=False, norm_topk_prob=False),
}


def make(out_dir: pathlib.Path) -> None:
    for case, build_config in CASES.items():
        torch.manual_seed(20240607)
        config = build_config()
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
            for name, b in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    b.copy_(0.2 * torch.randn_like(b))
        model.eval()
        case_dir = out_dir / case
        model.save_pretrained(case_dir, safe_serialization=True)
        input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
        labels = input_ids.clone()
        labels[0, :3] = -100
        out = model(input_ids=input_ids, labels=labels)
        out.loss.backward()
        tensors = {"input_ids": input_ids, "labels": labels, "logits": out.logits.detach().contiguous(),
                   "loss": out.loss.detach().reshape(1)}
        tensors.update(checkpoint_grads(model, config.moe_intermediate_size))
        save_file(tensors, str(case_dir / "reference.safetensors"))


def check(dirs) -> int:
    failures = 0
    for d in map(pathlib.Path, dirs):
        model, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
        problems = {k: v for k, v in info.items() if v}
        ref = load_file(str(d / "cpp_logits.safetensors"))
        model.eval()
        with torch.no_grad():
            out = model(input_ids=ref["input_ids"])
        diff = (out.logits - ref["logits"]).abs().max().item() if out.logits.shape == ref["logits"].shape else float("inf")
        ok = not problems and diff <= TOLERANCE
        print(f"{d.name}: {type(model).__name__} max|logits diff| = {diff:.3g}"
              f"{'' if not problems else f' loading problems: {problems}'} -> {'ok' if ok else 'FAIL'}")
        failures += not ok
    return 1 if failures else 0


def generate(args) -> int:
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    # Several prompts (";"-separated) each alone, one JSON line each: one
    # process and one model load for all of them.
    for text in args.prompt.split(";"):
        prompt = torch.tensor([[int(i) for i in text.split(",")]])
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=args.new, do_sample=False, temperature=None, top_k=None,
                                 top_p=None, output_scores=True, return_dict_in_generate=True)
        margins = [(lambda t: (t[0] - t[1]).item())(torch.topk(s[0].float(), 2).values) for s in out.scores]
        print(json.dumps({"ids": out.sequences[0].tolist(), "margin": min(margins)}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make").add_argument("out_dir", type=pathlib.Path)
    sub.add_parser("check").add_argument("dirs", nargs="+")
    g = sub.add_parser("generate")
    g.add_argument("model_dir")
    g.add_argument("--prompt", required=True)
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
