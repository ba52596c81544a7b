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
import tempfile

for name in list(os.environ):
    if name.startswith(("OMPI_", "PMIX_", "PMI_")) or name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                                  "MASTER_PORT"):
        del os.environ[name]

import peft
import torch
import transformers
from datasets import Dataset
from trl import SFTConfig

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from sft_trl_oracle import RecordingTrainer, records, save_model  # noqa: E402


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    transformers.logging.set_verbosity_error()
    fast = save_model(out)
    data = records()
    (out / "data.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data), encoding="utf-8")
    base = transformers.LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
    torch.manual_seed(11)
    model = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                      lora_dropout=0.0, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    model.save_pretrained(out / "adapter")

    base = transformers.LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, out / "adapter", is_trainable=True)
    RecordingTrainer.losses = []
    with tempfile.TemporaryDirectory() as work:
        args = SFTConfig(output_dir=work, max_length=64, per_device_train_batch_size=4, max_steps=10,
                         learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                         adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=0.0, report_to=[],
                         use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, logging_steps=1,
                         save_strategy="no", dataloader_drop_last=False, seed=1)
        trainer = RecordingTrainer(model=model, args=args, train_dataset=Dataset.from_list(data), processing_class=fast)
        trainer.train()
    assert len(RecordingTrainer.losses) == 10, RecordingTrainer.losses
    (out / "trl_losses.json").write_text(json.dumps(RecordingTrainer.losses))

    # Biases and whole modules beside the adapters (trained in place by Colossus).
    config = transformers.LlamaConfig.from_pretrained(out / "model")
    config.attention_bias = True
    torch.manual_seed(8)
    transformers.LlamaForCausalLM(config).save_pretrained(out / "model_bias", safe_serialization=True)
    fast.save_pretrained(out / "model_bias")
    for name, extras in (("adapter_extras", dict(bias="all", modules_to_save=["lm_head"])),
                         ("adapter_lora_only", dict(bias="lora_only"))):
        base = transformers.LlamaForCausalLM.from_pretrained(out / "model_bias", dtype=torch.float32)
        torch.manual_seed(12)
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                          lora_dropout=0.0, task_type="CAUSAL_LM", **extras))
        with torch.no_grad():
            for param_name, p in model.named_parameters():
                if "lora_B" in param_name:
                    p.normal_(0.0, 0.02)
        model.save_pretrained(out / name)
    base = transformers.LlamaForCausalLM.from_pretrained(out / "model_bias", dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, out / "adapter_extras", is_trainable=True)
    RecordingTrainer.losses = []
    with tempfile.TemporaryDirectory() as work:
        args.output_dir = work
        trainer = RecordingTrainer(model=model, args=args, train_dataset=Dataset.from_list(data), processing_class=fast)
        trainer.train()
    assert len(RecordingTrainer.losses) == 10, RecordingTrainer.losses
    (out / "trl_losses_extras.json").write_text(json.dumps(RecordingTrainer.losses))
    return 0


if __name__ == "__main__":
    sys.exit(main())
