#!/usr/bin/env python3
"""TRL's SFTTrainer on a PEFT LoRA model as the oracle for `[lora]` (tests only).

  lora_trl_oracle.py OUT_DIR
      Writes OUT_DIR/model/ and OUT_DIR/data.jsonl (as sft_trl_oracle.py),
      OUT_DIR/adapter/ (a PEFT LoRA adapter on every linear layer, r 8, alpha
      16, lora_B made nonzero so both matrices train from step 1) and
      OUT_DIR/trl_losses.json: the loss of each of 10 steps of SFTTrainer
      training that adapter (PeftModel.from_pretrained(is_trainable=True)) on
      the base frozen, with sft_trl_oracle.py's settings (batch 4, AdamW lr
      1e-3, constant, fp32, CPU).
      The same for an adapter that also trains biases and whole modules:
      OUT_DIR/model_bias/ (the tiny LLaMA with q/k/v/o biases),
      OUT_DIR/adapter_extras/ (LoRA on q_proj, v_proj with bias "all" and
      modules_to_save ["lm_head"]) and OUT_DIR/trl_losses_extras.json; and
      OUT_DIR/adapter_lora_only/ (bias "lora_only", untrained) for the key
      names PEFT saves.
"""
import json
import os
import pathlib
import sys

for name in list(os.environ):
    if name.startswith(("OMPI_", "PMIX_", "PMI_")) or name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                                  "MASTER_PORT"):
        del os.environ[name]

import peft
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from sft_trl_oracle import records, save_model, train_losses  # noqa: E402


def make_adapter(base_dir, out_dir, seed, **lora_options):
    """A PEFT LoRA adapter on the fp32 model in base_dir, A seeded, lora_B made
    nonzero so both matrices train from step 1, saved to out_dir."""
    base = transformers.LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    model = peft.get_peft_model(base, peft.LoraConfig(lora_dropout=0.0, task_type="CAUSAL_LM", **lora_options))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    model.save_pretrained(out_dir)


def adapter_losses(base_dir, adapter_dir, fast, data):
    """TRL's losses training the adapter (is_trainable) on its fp32 base."""
    base = transformers.LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return train_losses(peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=True), fast, data)


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    transformers.logging.set_verbosity_error()
    fast = save_model(out)
    data = records()
    (out / "data.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data), encoding="utf-8")
    make_adapter(out / "model", out / "adapter", 11, r=8, lora_alpha=16, target_modules="all-linear")
    (out / "trl_losses.json").write_text(json.dumps(adapter_losses(out / "model", out / "adapter", fast, data)))

    # Biases and whole modules beside the adapters (trained in place by Colossus).
    config = transformers.LlamaConfig.from_pretrained(out / "model")
    config.attention_bias = True
    torch.manual_seed(8)
    transformers.LlamaForCausalLM(config).save_pretrained(out / "model_bias", safe_serialization=True)
    fast.save_pretrained(out / "model_bias")
    for name, extras in (("adapter_extras", dict(bias="all", modules_to_save=["lm_head"])),
                         ("adapter_lora_only", dict(bias="lora_only"))):
        make_adapter(out / "model_bias", out / name, 12, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                     **extras)
    losses = adapter_losses(out / "model_bias", out / "adapter_extras", fast, data)
    (out / "trl_losses_extras.json").write_text(json.dumps(losses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
