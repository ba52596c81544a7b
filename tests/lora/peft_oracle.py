#!/usr/bin/env python3
"""PEFT (with transformers) as the test oracle for colossus/lora (tests only).

  peft_oracle.py make OUT_DIR
      Tiny random fp32 base models saved with save_pretrained into
      OUT_DIR/<family>/base (llama, gpt2). For each case below: a PEFT LoRA
      adapter over that base with seeded nonzero lora_A / lora_B, saved with
      PeftModel.save_pretrained into OUT_DIR/<case>/adapter, and
      OUT_DIR/<case>/reference.safetensors holding input_ids, logits, loss,
      merged_logits (after merge_and_unload) and grad.<adapter key> (the
      gradient of the loss for every lora_A / lora_B weight, keyed as in
      adapter_model.safetensors). Also OUT_DIR/bf16_layer.safetensors: one
      bf16 Linear with fp32 adapters (make_bf16_layer).

  peft_oracle.py check ADAPTER_DIR BASE_DIR LOGITS_FILE [ADAPTER_DIR BASE_DIR LOGITS_FILE ...]
      For each triple (one process, so torch and PEFT load once): loads BASE_DIR with from_pretrained and ADAPTER_DIR (written by
      Colossus) with PeftModel.from_pretrained; requires that PEFT's adapter
      state dict equals the file's tensors key for key, and that the logits
      for LOGITS_FILE's input_ids match its logits within TOLERANCE
      (relative to their largest magnitude). Prints the measured difference.
      Exit 1 if any fails.
"""
import argparse
import json
import pathlib
import sys

import peft
import torch
import transformers
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

TOLERANCE = 1e-5
BATCH, SEQ = 2, 12


def llama():
    return transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    initializer_range=0.2, rms_norm_eps=1e-5, attention_bias=True)


def gpt2():
    return transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2, bos_token_id=0,
                                   eos_token_id=0)


FAMILIES = {"llama": (llama, transformers.LlamaForCausalLM), "gpt2": (gpt2, transformers.GPT2LMHeadModel)}

# case -> (family, LoraConfig keyword arguments)
CASES = {
    "llama_qv": ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])),
    "llama_all_linear": ("llama", dict(r=4, lora_alpha=16, target_modules="all-linear")),
    "llama_rslora": ("llama", dict(r=8, lora_alpha=8, use_rslora=True,
                                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj"])),
    "gpt2_c_attn": ("gpt2", dict(r=4, lora_alpha=8, target_modules=["c_attn"])),
    # "c_proj" names both attn.c_proj and mlp.c_proj.
    "gpt2_all_linear": ("gpt2", dict(r=4, lora_alpha=12, target_modules="all-linear", use_rslora=True)),
}


def input_ids(vocab):
    generator = torch.Generator().manual_seed(7)
    return torch.randint(0, vocab, (BATCH, SEQ), generator=generator)


class OneLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(64, 48, bias=True)

    def forward(self, x):
        return self.proj(x)


def make_bf16_layer(out_dir: pathlib.Path) -> None:
    """One bf16 nn.Linear under PEFT's LoRA, whose adapters PEFT keeps in fp32
    (autocast_adapter_dtype): OUT_DIR/bf16_layer.safetensors with the base
    weight and bias, lora_A, lora_B, the input x, the output y and the
    gradients of y.float().sum() for lora_A and lora_B."""
    torch.manual_seed(5)
    model = peft.get_peft_model(OneLinear().to(torch.bfloat16),
                                peft.LoraConfig(r=4, lora_alpha=8, target_modules=["proj"]))
    layer = model.base_model.model.proj
    lora_a, lora_b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert lora_a.dtype == torch.float32 and lora_b.dtype == torch.float32, (lora_a.dtype, lora_b.dtype)
    generator = torch.Generator().manual_seed(6)
    with torch.no_grad():
        lora_b.copy_(torch.randn(lora_b.shape, generator=generator) * 0.1)
    x = torch.randn(3, 5, 64, generator=generator).to(torch.bfloat16)
    y = model(x)
    y.float().sum().backward()
    tensors = {"weight": layer.base_layer.weight, "bias": layer.base_layer.bias, "lora_A": lora_a, "lora_B": lora_b,
               "x": x, "y": y, "grad.lora_A": lora_a.grad, "grad.lora_B": lora_b.grad}
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, out_dir / "bf16_layer.safetensors")


def make(out_dir: pathlib.Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    make_bf16_layer(out_dir)
    for family, (build_config, model_class) in FAMILIES.items():
        torch.manual_seed(20261206)
        model_class(build_config()).save_pretrained(out_dir / family / "base", safe_serialization=True)
    for case, (family, lora_kwargs) in CASES.items():
        model_class = FAMILIES[family][1]
        base = model_class.from_pretrained(out_dir / family / "base", dtype=torch.float32)
        model = peft.get_peft_model(base, peft.LoraConfig(lora_dropout=0.0, task_type="CAUSAL_LM", **lora_kwargs))
        generator = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if ".lora_A." in name or ".lora_B." in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
        case_dir = out_dir / case
        model.save_pretrained(case_dir / "adapter")
        ids = input_ids(base.config.vocab_size)
        output = model(input_ids=ids, labels=ids)
        output.loss.backward()
        reference = {"input_ids": ids, "logits": output.logits.detach(), "loss": output.loss.detach()}
        for name, param in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                key = name.replace(".default.weight", ".weight")
                reference["grad." + key] = param.grad.detach().clone()
        merged = model.merge_and_unload()
        with torch.no_grad():
            reference["merged_logits"] = merged(input_ids=ids).logits
        save_file({k: v.contiguous() for k, v in reference.items()}, case_dir / "reference.safetensors")


def check(adapter_dir: str, base_dir: str, logits_file: str) -> int:
    config = json.loads((pathlib.Path(base_dir) / "config.json").read_text())
    model_class = transformers.GPT2LMHeadModel if config["model_type"] == "gpt2" else transformers.LlamaForCausalLM
    base = model_class.from_pretrained(base_dir, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, adapter_dir)
    ok = True
    saved = load_file(str(pathlib.Path(adapter_dir) / "adapter_model.safetensors"))
    loaded = get_peft_model_state_dict(model)
    if sorted(saved) != sorted(loaded):
        print(f"keys differ: only in file {sorted(set(saved) - set(loaded))}, "
              f"only in PEFT {sorted(set(loaded) - set(saved))}")
        ok = False
    else:
        for key in saved:
            if not torch.equal(saved[key].to(loaded[key].dtype), loaded[key]):
                print(f"{key}: loaded values differ from the file")
                ok = False
    reference = load_file(logits_file)
    with torch.no_grad():
        logits = model(input_ids=reference["input_ids"]).logits
    diff = ((logits - reference["logits"]).abs().max() / reference["logits"].abs().max()).item()
    print(f"{pathlib.Path(adapter_dir).name}: max relative logits difference {diff:.3g}")
    if not diff <= TOLERANCE:
        ok = False
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make").add_argument("out_dir", type=pathlib.Path)
    check_parser = sub.add_parser("check")
    check_parser.add_argument("triples", nargs="+", metavar="ADAPTER_DIR BASE_DIR LOGITS_FILE")
    args = parser.parse_args()
    if args.command == "make":
        make(args.out_dir)
        return 0
    if len(args.triples) % 3 != 0:
        parser.error("check takes ADAPTER_DIR BASE_DIR LOGITS_FILE triples")
    failures = [check(*args.triples[i:i + 3]) for i in range(0, len(args.triples), 3)]
    return 1 if any(failures) else 0


if __name__ == "__main__":
    sys.exit(main())
