#!/usr/bin/env python3
"""The peer of scripts/device_post_training.sh: models and data for the
post-training benchmarks, and HF transformers + PEFT training the same LoRA
on the same batches.

  post_training_peer.py make DIR --shape llama3-8b|llama-1b|tiny [--device cuda]
      DIR/model/: a random LLaMA of that shape in bf16 with sft_oracle.py's
      byte-level tokenizer; DIR/data.jsonl: 4000 prompt/completion records of
      varied length (8 to 600 words), the same every time.
  post_training_peer.py peft DIR --steps N --batch B --seq S --r R [--device cuda]
      LoRA r R (alpha 2R, every linear layer) over DIR/model in bf16, AdamW on
      the adapters, one example a row padded to the longest (TRL's collator),
      the records in file order; prints one JSON line: tokens_per_s (real
      tokens, steps after the first two), peak_mib (torch.cuda.max_memory_reserved),
      loss.
  post_training_peer.py padding DIR --batch B --seq S
      The share of a padded batch's tokens that are padding, over the first
      100 batches (what packing removes); one JSON line.
"""
import argparse
import json
import pathlib
import random
import sys
import time

import torch
import transformers

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers


def tokenizer(out: pathlib.Path):
    """A byte-level BPE (320 tokens, <s> </s> <pad>) trained here: no download, no datasets package."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<s>", "</s>", "<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>")

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}
WORDS = "the quick brown fox jumps over lazy dog colossus trains models in c++ on many gpus fast".split()


def make(args):
    out = pathlib.Path(args.dir)
    (out / "model").mkdir(parents=True, exist_ok=True)
    fast = tokenizer(out)
    fast.save_pretrained(out / "tokenizer")
    config = transformers.LlamaConfig(max_position_embeddings=4096, bos_token_id=fast.bos_token_id,
                                      eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
                                      **SHAPES[args.shape])
    torch.manual_seed(0)
    with torch.device(args.device):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out / "model", safe_serialization=True)
    fast.save_pretrained(out / "model")
    rng = random.Random(0)
    lines = []
    for _ in range(4000):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 120)))
        completion = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 480)))
        lines.append(json.dumps({"prompt": prompt + " ", "completion": completion}))
    (out / "data.jsonl").write_text("\n".join(lines) + "\n")


def examples(dir_, fast, seq):
    for line in (pathlib.Path(dir_) / "data.jsonl").read_text().splitlines():
        r = json.loads(line)
        ids = fast(r["prompt"] + r["completion"] + fast.eos_token)["input_ids"][:seq]
        prompt_len = len(fast(r["prompt"])["input_ids"])
        yield ids, prompt_len


def batches(dir_, fast, seq, batch):
    rows = []
    for ids, prompt_len in examples(dir_, fast, seq):
        rows.append((ids, prompt_len))
        if len(rows) == batch:
            yield rows
            rows = []


def peft_run(args):
    import peft
    device = torch.device(args.device)
    fast = transformers.AutoTokenizer.from_pretrained(pathlib.Path(args.dir) / "model")
    model = transformers.LlamaForCausalLM.from_pretrained(pathlib.Path(args.dir) / "model", dtype=torch.bfloat16,
                                                          attn_implementation="sdpa").to(device)
    model = peft.get_peft_model(model, peft.LoraConfig(r=args.r, lora_alpha=2 * args.r, target_modules="all-linear",
                                                       lora_dropout=0.0, task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=device.type == "cuda")
    tokens, start, loss = 0, None, float("nan")
    for step, rows in enumerate(batches(args.dir, fast, args.seq, args.batch)):
        if step == args.steps:
            break
        if step == 2:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start, tokens = time.perf_counter(), 0
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), fast.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (row, prompt_len) in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
            labels[i, prompt_len:len(row)] = torch.tensor(row[prompt_len:])
            tokens += len(row)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device))
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss = out.loss.item()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_reserved() / 2**20 if device.type == "cuda" else float("nan")
    print(json.dumps({"tokens_per_s": tokens / seconds, "peak_mib": peak, "loss": loss}))


def padding(args):
    fast = transformers.AutoTokenizer.from_pretrained(pathlib.Path(args.dir) / "model")
    real = padded = 0
    for step, rows in enumerate(batches(args.dir, fast, args.seq, args.batch)):
        if step == 100:
            break
        width = max(len(ids) for ids, _ in rows)
        real += sum(len(ids) for ids, _ in rows)
        padded += width * len(rows)
    print(json.dumps({"padding_share": 1 - real / padded, "real_tokens": real}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["make", "peft", "padding"])
    parser.add_argument("dir")
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--r", type=int, default=16)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    {"make": make, "peft": peft_run, "padding": padding}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
