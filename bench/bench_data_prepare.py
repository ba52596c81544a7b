#!/usr/bin/env python3
"""colossus data prepare against the Python `tokenizers` package's batch encoder.

Makes a seeded JSONL corpus (English-like words, numbers, punctuation, some
CJK and accented text, ~MB given by --mb), trains a byte-level BPE of 16K
tokens on it with `tokenizers`, then times, on the same machine and threads:
  colossus: `colossus data prepare corpus.jsonl --tokenizer DIR --output OUT`
  peer:     reading the same JSONL and Tokenizer.encode_batch over it, in
            batches of 1024 records (Rust threads, RAYON_NUM_THREADS = threads)
and checks the two produced the same ids (every document's ids then eos).
Prints a table and appends to bench/RESULTS.md and bench/results.jsonl.
Usage: .venv/bin/python bench/bench_data_prepare.py [--mb 40] [--threads 2] [--bin build/bin/colossus]
"""
import argparse
import datetime
import json
import os
import pathlib
import random
import shutil
import struct
import subprocess
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


def make_corpus(path, mb, seed=0):
    rng = random.Random(seed)
    words = ("the of and to in a is that for it as was with be by on not he this are or his from at which but "
             "have an they you were her she there one all we can their has been if more when will would who so no "
             "model token train data parallel shard gradient optimizer memory").split()
    extra = ["été", "naïve", "世界", "数据", "42", "3.14", "2026", "(note)", "—", "don't", "e.g.", "\n"]
    size = 0
    with open(path, "w", encoding="utf-8") as f:
        while size < mb * 1e6:
            n = rng.randint(20, 400)
            text = " ".join(rng.choice(words) if rng.random() > 0.08 else rng.choice(extra) for _ in range(n))
            line = json.dumps({"text": text.capitalize() + "."}, ensure_ascii=False)
            f.write(line + "\n")
            size += len(line.encode()) + 1


def train_tokenizer(corpus, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=16384, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    def sample():
        with open(corpus, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if i >= 5000:
                    break
                yield json.loads(line)["text"]
    tok.train_from_iterator(sample(), trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                               "bos_token": "<|endoftext|>"}))
    return tok


def read_shards(out):
    ids = []
    for shard in sorted(out.glob("*.tokens")):
        data = shard.read_bytes()
        magic, version, width, count, vocab = struct.unpack("<8sIIQQ", data[:32])
        fmt = "<%d%s" % (count, "H" if width == 2 else "I")
        ids.extend(struct.unpack(fmt, data[32:32 + count * width]))
    return ids


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=float, default=40)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--bin", default=str(REPO / "build/bin/colossus"))
    args = p.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench_data_prepare_"))
    try:
        corpus = work / "corpus.jsonl"
        make_corpus(corpus, args.mb)
        tok = train_tokenizer(corpus, work / "tokenizer")
        eos = tok.token_to_id("<|endoftext|>")

        start = time.perf_counter()
        subprocess.run([args.bin, "data", "prepare", str(corpus), "--tokenizer", str(work / "tokenizer"), "--output",
                        str(work / "out"), "--threads", str(args.threads)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ours_s = time.perf_counter() - start

        start = time.perf_counter()
        peer_ids = []
        with open(corpus, encoding="utf-8") as f:
            batch = []
            for line in f:
                batch.append(json.loads(line)["text"])
                if len(batch) == 1024:
                    for enc in tok.encode_batch(batch, add_special_tokens=False):
                        peer_ids.extend(enc.ids)
                        peer_ids.append(eos)
                    batch = []
            for enc in tok.encode_batch(batch, add_special_tokens=False):
                peer_ids.extend(enc.ids)
                peer_ids.append(eos)
        peer_s = time.perf_counter() - start

        ours_ids = read_shards(work / "out")
        same = ours_ids == peer_ids
        tokens = len(peer_ids)
        ours_rate, peer_rate = tokens / ours_s, tokens / peer_s
        machine = f"CPU, {os.cpu_count()} threads"
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
        config = (f"{args.mb:.0f} MB JSONL, {tokens} tokens, byte-level BPE 16K (tokenizers-trained), "
                  f"{args.threads} threads")
        table = ["| bench | config | metric | colossus data prepare | peer: tokenizers encode_batch | ratio |",
                 "|---|---|---|---|---|---|",
                 f"| data_prepare | {config} | tokens_per_s | {ours_rate:,.0f} | {peer_rate:,.0f} | "
                 f"{ours_rate / peer_rate:.2f} |",
                 f"| data_prepare | same | ids equal to the peer's | {'yes' if same else 'NO'} | | |"]
        print("\n".join(table))
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        with open(REPO / "bench/RESULTS.md", "a") as f:
            f.write(f"\n\n## data_prepare — {date}\n\nmachine: {machine}; commit {commit}\n"
                    f"command: `.venv/bin/python bench/bench_data_prepare.py --mb {args.mb:g} --threads {args.threads}`\n\n"
                    + "\n".join(table) + "\n")
        with open(REPO / "bench/results.jsonl", "a") as f:
            f.write(json.dumps(dict(date=date[:10], commit=commit, machine=machine, bench="data_prepare",
                                    config=config, metric="tokens_per_s", value=ours_rate,
                                    peer="tokenizers encode_batch", peer_value=peer_rate,
                                    ratio=ours_rate / peer_rate)) + "\n")
        if not same:
            raise SystemExit("colossus data prepare and tokenizers gave different ids")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
