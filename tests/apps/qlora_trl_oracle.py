#!/usr/bin/env python3
"""TRL's SFTTrainer on a QLoRA model (bitsandbytes NF4 base + PEFT) as the
oracle for `[lora] quantize = "nf4"` (tests only).

  qlora_trl_oracle.py OUT_DIR
      Writes OUT_DIR/model/ (a tiny LLaMA with hidden 64 and intermediate 128,
      so every linear input is a multiple of bitsandbytes' CPU block of 64, and
      sft_oracle.py's tokenizer), OUT_DIR/data.jsonl (sft_trl_oracle.py's
      records), OUT_DIR/adapter/ (a PEFT LoRA adapter on every linear layer, r
      8, lora_B nonzero) and OUT_DIR/trl_losses.json: the loss of each of 10
      steps of SFTTrainer training that adapter on the base loaded in 4-bit NF4
      with double quantisation and fp32 compute (BitsAndBytesConfig), with
      sft_trl_oracle.py's other settings.
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
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "data"))
from sft_oracle import tokenizer  # noqa: E402
from sft_trl_oracle import RecordingTrainer, records  # noqa: E402


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    transformers.logging.set_verbosity_error()
    fast = tokenizer(out)
    torch.manual_seed(7)
    config = transformers.LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                                      pad_token_id=fast.pad_token_id, initializer_range=0.2)
    transformers.LlamaForCausalLM(config).save_pretrained(out / "model", safe_serialization=True)
    fast.save_pretrained(out / "model")
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

    quantized = transformers.LlamaForCausalLM.from_pretrained(
        out / "model", dtype=torch.float32, device_map="cpu",
        quantization_config=transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                            bnb_4bit_use_double_quant=True,
                                                            bnb_4bit_compute_dtype=torch.float32))
    model = peft.PeftModel.from_pretrained(quantized, out / "adapter", is_trainable=True)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
