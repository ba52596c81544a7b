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

for name in list(os.environ):
    if name.startswith(("OMPI_", "PMIX_", "PMI_")) or name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                                  "MASTER_PORT"):
        del os.environ[name]

import peft
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_trl_oracle import make_adapter  # noqa: E402
from sft_trl_oracle import records, save_model, train_losses  # noqa: E402


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    transformers.logging.set_verbosity_error()
    fast = save_model(out, hidden_size=64, intermediate_size=128)
    data = records()
    (out / "data.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data), encoding="utf-8")
    make_adapter(out / "model", out / "adapter", 11, r=8, lora_alpha=16, target_modules="all-linear")

    quantized = transformers.LlamaForCausalLM.from_pretrained(
        out / "model", dtype=torch.float32, device_map="cpu",
        quantization_config=transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                            bnb_4bit_use_double_quant=True,
                                                            bnb_4bit_compute_dtype=torch.float32))
    model = peft.PeftModel.from_pretrained(quantized, out / "adapter", is_trainable=True)
    (out / "trl_losses.json").write_text(json.dumps(train_losses(model, fast, data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
