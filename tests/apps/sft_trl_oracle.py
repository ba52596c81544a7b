#!/usr/bin/env python3
"""TRL's SFTTrainer as the oracle for `train.task = "sft"` (tests only).

  sft_trl_oracle.py OUT_DIR
      Writes OUT_DIR/model/ (a tiny LLaMA saved by transformers, with the
      byte-level BPE tokenizer of tests/data/sft_oracle.py), OUT_DIR/data.jsonl
      (40 prompt/completion records) and OUT_DIR/trl_losses.json: the loss of
      each of 10 steps of SFTTrainer on them in file order; OUT_DIR/chat.jsonl
      (40 conversations, some with a system turn or two assistant turns) and
      OUT_DIR/trl_chat_losses.json, the same with assistant_only_loss (the
      model's ChatML template marks assistant turns with {% generation %});
      both with batch 4, AdamW
      lr 1e-3 betas (0.9, 0.999) eps 1e-8 no weight decay, constant LR, no
      clipping, fp32 (SFTConfig defaults to bf16 autocast), CPU), taken from
      compute_loss unrounded.
"""
import json
import os
import pathlib
import sys
import tempfile

# Run from an MPI test rank: accelerate would take the launcher's variables
# for a distributed job of its own. The oracle is one process.
for name in list(os.environ):
    if name.startswith(("OMPI_", "PMIX_", "PMI_")) or name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                                  "MASTER_PORT"):
        del os.environ[name]

import torch
import transformers
from datasets import Dataset
from torch.utils.data import SequentialSampler
from trl import SFTConfig, SFTTrainer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "data"))
from sft_oracle import tokenizer  # noqa: E402

WORDS = ["fox", "dog", "quick", "brown", "lazy", "answer", "two", "four", "models", "trains", "café", "中文"]


def records():
    out = []
    for i in range(40):
        a, b, c = WORDS[i % 12], WORDS[(3 * i + 1) % 12], WORDS[(7 * i + 2) % 12]
        out.append({"prompt": f"What is {a} and {b}? ", "completion": f"The {c} is {a}{' ' + b * (i % 3)}."})
    return out


def chats():
    out = []
    for i in range(40):
        a, b, c = WORDS[i % 12], WORDS[(3 * i + 1) % 12], WORDS[(7 * i + 2) % 12]
        messages = [{"role": "user", "content": f"What is {a} and {b}?"},
                    {"role": "assistant", "content": f"The {c} is {a}."}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": f"Answer in {b * (1 + i % 2)}."})
        if i % 4 == 1:
            messages += [{"role": "user", "content": "And?"}, {"role": "assistant", "content": f"{b} {c}!"}]
        out.append({"messages": messages})
    return out


class RecordingTrainer(SFTTrainer):
    losses = []

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        value = loss[0] if isinstance(loss, tuple) else loss
        RecordingTrainer.losses.append(value.detach().item())
        return loss


def save_model(out: pathlib.Path, hidden_size=32, intermediate_size=64):
    """The tiny LLaMA (seeded) and its tokenizer in out/model; returns the tokenizer."""
    fast = tokenizer(out)
    torch.manual_seed(7)
    config = transformers.LlamaConfig(vocab_size=len(fast), hidden_size=hidden_size,
                                      intermediate_size=intermediate_size, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                                      pad_token_id=fast.pad_token_id, initializer_range=0.2)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(out / "model", safe_serialization=True)
    fast.save_pretrained(out / "model")
    return fast


def train_losses(model, fast, data, **options):
    """10 steps of SFTTrainer on `model` with this file's settings -> the losses."""
    RecordingTrainer.losses = []
    with tempfile.TemporaryDirectory() as work:
        args = SFTConfig(output_dir=work, max_length=64, per_device_train_batch_size=4, max_steps=10,
                         learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                         adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=0.0, report_to=[],
                         use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, logging_steps=1,
                         save_strategy="no", dataloader_drop_last=False, seed=1, **options)
        trainer = RecordingTrainer(model=model, args=args, train_dataset=Dataset.from_list(data), processing_class=fast)
        trainer.train()
    assert len(RecordingTrainer.losses) == 10, RecordingTrainer.losses
    return RecordingTrainer.losses


def main() -> int:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    transformers.logging.set_verbosity_error()
    fast = save_model(out)
    for name, data, options in (("data", records(), {}), ("chat", chats(), {"assistant_only_loss": True})):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data),
                                          encoding="utf-8")
        model = transformers.LlamaForCausalLM.from_pretrained(out / "model", dtype=torch.float32)
        losses_file = "trl_losses.json" if name == "data" else "trl_chat_losses.json"
        (out / losses_file).write_text(json.dumps(train_losses(model, fast, data, **options)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
