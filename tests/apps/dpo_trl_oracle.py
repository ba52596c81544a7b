#!/usr/bin/env python3
"""TRL's DPOTrainer as the oracle for `train.task = "dpo"` (tests only).

  dpo_trl_oracle.py OUT_DIR
      Writes OUT_DIR/model/ (the tiny LLaMA and tokenizer of sft_trl_oracle.py),
      OUT_DIR/pairs.jsonl (40 prompt/chosen/rejected records, plain strings)
      and OUT_DIR/chat_pairs.jsonl (40 conversational ones through the model's
      chat template), and for each OUT_DIR/<name>.trl.json: per step of 10 steps
      of DPOTrainer in file order (batch 4 pairs, beta 0.1, sigmoid loss, the
      reference model a frozen copy, max_length 64, AdamW lr 1e-3 betas (0.9,
      0.999) eps 1e-8 no weight decay, constant LR, no clipping, fp32, CPU) the
      loss, the mean chosen and rejected rewards, the reward accuracy and margin.
      OUT_DIR/adapter/ (a PEFT LoRA adapter on every linear layer, lora_B
      nonzero) and OUT_DIR/lora_pairs.trl.json: the same on pairs.jsonl with the
      policy that adapter continued (PeftModel, is_trainable) and the reference
      the policy as it started (TRL loads a "ref" copy of the adapter).
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
from torch.utils.data import SequentialSampler
from trl import DPOConfig, DPOTrainer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from sft_trl_oracle import WORDS, save_model  # noqa: E402


def pairs():
    out = []
    for i in range(40):
        a, b, c = WORDS[i % 12], WORDS[(3 * i + 1) % 12], WORDS[(7 * i + 2) % 12]
        out.append({"prompt": f"What is {a} and {b}? ", "chosen": f"The {c} is {a}{' ' + b * (i % 3)}.",
                    "rejected": f"No {b} {c}{'!' * (i % 4)}"})
    return out


def chat_pairs():
    out = []
    for i in range(40):
        a, b, c = WORDS[i % 12], WORDS[(3 * i + 1) % 12], WORDS[(7 * i + 2) % 12]
        prompt = [{"role": "user", "content": f"What is {a} and {b}?"}]
        if i % 3 == 0:
            prompt.insert(0, {"role": "system", "content": f"Answer in {b}."})
        out.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": f"The {c} is {a}."}],
                    "rejected": [{"role": "assistant", "content": f"No {b * (1 + i % 2)}!"}]})
    return out


class RecordingTrainer(DPOTrainer):
    steps = []

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        value = loss[0] if isinstance(loss, tuple) else loss
        metrics = self._metrics["train"]
        RecordingTrainer.steps.append({
            "loss": value.detach().item(), "rewards_chosen": metrics["rewards/chosen"][-1],
            "rewards_rejected": metrics["rewards/rejected"][-1], "rewards_accuracy": metrics["rewards/accuracies"][-1],
            "rewards_margin": metrics["rewards/margins"][-1]})
        return loss


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    transformers.logging.set_verbosity_error()
    fast = save_model(out)
    base = transformers.LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
    torch.manual_seed(11)
    adapted = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                        lora_dropout=0.0, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    adapted.save_pretrained(out / "adapter")
    for name, data, lora in (("pairs", pairs(), False), ("chat_pairs", chat_pairs(), False),
                             ("lora_pairs", pairs(), True)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data),
                                          encoding="utf-8")
        RecordingTrainer.steps = []
        with tempfile.TemporaryDirectory() as work:
            args = DPOConfig(output_dir=work, max_length=64, per_device_train_batch_size=4, max_steps=10, beta=0.1,
                             loss_type=["sigmoid"], learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0,
                             weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=0.0,
                             report_to=[], use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
                             logging_steps=1, save_strategy="no", dataloader_drop_last=False, seed=1)
            model = transformers.LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
            if lora:
                model = peft.PeftModel.from_pretrained(model, out / "adapter", is_trainable=True)
            trainer = RecordingTrainer(model=model, args=args, train_dataset=Dataset.from_list(data),
                                       processing_class=fast)
            trainer.train()
        assert len(RecordingTrainer.steps) == 10, RecordingTrainer.steps
        (out / f"{name}.trl.json").write_text(json.dumps(RecordingTrainer.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
