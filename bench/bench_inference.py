"""The transformers peer of bench_inference: LlamaForCausalLM loaded from the
HF directory the C++ bench wrote (same bf16 weights), sdpa attention, greedy
generate() on the same token ids.

  decode      batch 1: the bench's prompt, N new tokens (no eos, so exactly N;
              min_new_tokens too). Prefill is timed as generate(max_new_tokens=1);
              decode tokens/s = (N - 1) / (full generate - that). Variants
              (--variants): dynamic (DynamicCache), static (StaticCache, eager:
              disable_compile), compile (StaticCache with generate's automatic
              torch.compile; slow to warm up, opt-in).
  throughput  the bench's mixed requests in arrival order, in batches of
              --batch (left-padded; each batch runs to its longest requested
              output, as HF has no continuous batching); tokens counted as the
              requested lengths. Stops starting new batches after --max-seconds
              (the rate is then over the batches that ran; the JSON says how many).

Usage: bench_inference.py --model DIR --requests FILE [--device cuda|cpu]
         [--variants dynamic,static] [--batch 64] [--max-seconds 150]
Prints progress on stderr and one JSON object as the last line of stdout.
"""
import argparse
import json
import sys
import time

import torch
import transformers


def log(*args):
    print("[bench_inference.py]", *args, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--variants", default="dynamic,static")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with open(args.requests) as f:
        spec = json.load(f)

    t_load = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                              attn_implementation="sdpa")
    model.to(device).eval()
    log(f"loaded {args.model} in {time.perf_counter() - t_load:.1f} s")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def generate(ids, mask, new_tokens, variant):
        # No eos: every row runs exactly new_tokens (as the engine with ignore_eos).
        config = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=None,
            pad_token_id=0, bos_token_id=None, use_cache=True,
            cache_implementation=None if variant == "dynamic" else "static",
            disable_compile=variant != "compile")
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        sync()
        return out[:, ids.shape[1]:]

    def timed(fn):
        sync()
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out

    result = {"torch": torch.__version__, "transformers": transformers.__version__,
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "decode": {}}

    # Batch-1 decode.
    dec = spec["decode"]
    prompt = torch.tensor([dec["prompt"]], dtype=torch.long, device=device)
    warm = torch.tensor([dec["warmup_prompt"]], dtype=torch.long, device=device)
    ones = lambda t: torch.ones_like(t)  # noqa: E731
    n = dec["new_tokens"]
    for variant in [v for v in args.variants.split(",") if v]:
        t0 = time.perf_counter()
        # Warm-up (kernels, allocator; compile traces here): a shorter run,
        # except for compile, whose static cache must be as long as the timed one.
        generate(warm, ones(warm), n if variant == "compile" else min(n, 32), variant)
        log(f"{variant}: warm-up {time.perf_counter() - t0:.1f} s")
        prefill_s = min(timed(lambda: generate(prompt, ones(prompt), 1, variant))[0] for _ in range(3))
        total_s, tokens = timed(lambda: generate(prompt, ones(prompt), n, variant))
        decode_s = max(total_s - prefill_s, 1e-9)
        row = {"prefill_ms": prefill_s * 1e3, "total_s": total_s, "decode_s": decode_s,
               "decode_tokens_per_s": (n - 1) / decode_s, "tokens": tokens[0].tolist()}
        assert len(row["tokens"]) == n, f"{variant}: generated {len(row['tokens'])} tokens, wanted {n}"
        result["decode"][variant] = row
        log(f"{variant}: prefill {row['prefill_ms']:.1f} ms, decode {row['decode_tokens_per_s']:.1f} tok/s")
    if device.type == "cuda":
        torch.cuda.empty_cache()

    # Throughput over the mixed requests, in arrival order, fixed-size batches.
    if not args.skip_throughput:
        reqs = spec["throughput"]
        batches = [reqs[i:i + args.batch] for i in range(0, len(reqs), args.batch)]

        def run_batch(batch):
            width = max(len(r["prompt"]) for r in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for i, r in enumerate(batch):  # left padding
                ids[i, width - len(r["prompt"]):] = torch.tensor(r["prompt"])
                mask[i, width - len(r["prompt"]):] = 1
            longest = max(r["new_tokens"] for r in batch)
            generate(ids.to(device), mask.to(device), longest, "dynamic")
            return sum(r["new_tokens"] for r in batch), longest

        # Warm-up: a small batch of the longest prompts' width.
        run_batch([dict(r, new_tokens=8) for r in batches[0][:8]])
        sync()
        start = time.perf_counter()
        tokens = requests_done = steps = 0
        for b in batches:
            if time.perf_counter() - start > args.max_seconds:
                break
            got, longest = run_batch(b)
            tokens += got
            steps += longest
            requests_done += len(b)
            log(f"throughput: {requests_done}/{len(reqs)} requests, {time.perf_counter() - start:.1f} s")
        elapsed = time.perf_counter() - start
        result["throughput"] = {"batch": args.batch, "requests": requests_done, "of": len(reqs),
                                "generated_tokens": tokens, "seconds": elapsed, "decode_steps": steps,
                                "tokens_per_s": tokens / elapsed, "cache": "dynamic"}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
