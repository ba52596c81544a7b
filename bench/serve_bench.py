"""Serving benchmark client for `colossus serve` (or any OpenAI-compatible
server): replays a seeded chat-like request mix over HTTP at a request rate
and prints the table vLLM's benchmark_serving prints (request and token
throughput; TTFT, TPOT, ITL and end-to-end latency mean / median / p99).

Request mix (seeded, stated so runs compare): prompt lengths are lognormal
with median 160 tokens (sigma 0.8) and output lengths lognormal with median
190 tokens (sigma 0.7), the shape of ShareGPT conversations, clipped to
[--min-input, --max-input] and [--min-output, --max-output]. Prompts are
random token ids in [--token-low, --token-high) (so no tokenizer is needed),
each request streams with ignore_eos and stream_options.include_usage, so it
generates exactly its output length (through the `openai` package, or,
where it is missing, a standard-library client making the same requests).
Arrivals are a Poisson process at
--request-rate requests/s (inf: all at once).

--mix FILE replays the requests bench_inference --write-mix wrote (the
engine benchmark's ShareGPT-shaped mix, shared system prompts included, so
prefix caching has the same prefixes to reuse) instead of drawing them: the
server's table and the engine's are then of the same requests.

Every response is checked: HTTP 200, a finish_reason of "length", and the
usage's completion_tokens equal to the requested length; the run exits 1 if
any is not.

  serve_bench.py --base-url http://127.0.0.1:8000/v1 --model NAME
                 [--num-requests 1000] [--request-rate inf] [--seed 0]
                 [--max-concurrency N] [--json OUT.json]
                 [--record --label TEXT --commit SHA --machine TEXT]

--record appends a section to bench/RESULTS.md and rows to
bench/results.jsonl (bench "serve", one row per metric).
"""
import argparse
import asyncio
import datetime
import json
import math
import os
import sys
import time
import types
import urllib.parse

import numpy as np

try:
    import openai
except ImportError:  # the standard-library client below does the same requests
    openai = None


def request_mix(args):
    rng = np.random.default_rng(args.seed)
    if args.mix:
        # The engine's own requests (bench_inference --write-mix), the first --num-requests of them.
        with open(args.mix) as f:
            requests = json.load(f)["requests"][:args.num_requests]
        if not requests:
            raise SystemExit(f"--mix {args.mix}: no requests in the file")
        args.num_requests = len(requests)
        prompts = [r["prompt"] for r in requests]
        outputs = [r["max_tokens"] for r in requests]
    else:
        inputs = np.clip(np.round(rng.lognormal(math.log(160), 0.8, args.num_requests)), args.min_input, args.max_input)
        outputs = np.clip(np.round(rng.lognormal(math.log(190), 0.7, args.num_requests)), args.min_output,
                          args.max_output)
        prompts = [rng.integers(args.token_low, args.token_high, int(n)).tolist() for n in inputs]
    if math.isinf(args.request_rate):
        arrivals = np.zeros(args.num_requests)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / args.request_rate, args.num_requests))
    return [(float(t), p, int(o)) for t, p, o in zip(arrivals, prompts, outputs)]


class StdlibClient:
    """The one call this benchmark makes, streamed completions, over asyncio
    sockets (HTTP/1.1, chunked or plain body, server-sent events), for
    machines without the openai package. Chunks come back as objects with the
    attributes the openai client's have (usage.completion_tokens,
    choices[i].text, choices[i].finish_reason)."""

    def __init__(self, base_url, api_key, timeout):
        parsed = urllib.parse.urlsplit(base_url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.path = parsed.path.rstrip("/") + "/completions"
        self.api_key, self.timeout = api_key, timeout

    async def stream(self, body):
        reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.timeout)
        try:
            data = json.dumps(body).encode()
            writer.write((f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                          f"Authorization: Bearer {self.api_key}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data)
            await writer.drain()
            status = (await reader.readline()).decode().split()
            headers = {}
            while (line := (await reader.readline()).decode().strip()):
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
            if len(status) < 2 or status[1] != "200":
                raise RuntimeError(f"HTTP {' '.join(status[1:])}: {(await reader.read()).decode()[:300]}")
            chunked = headers.get("transfer-encoding", "").lower() == "chunked"
            buffer = b""
            while True:
                if chunked:
                    size = int((await reader.readline()).strip() or b"0", 16)
                    if size == 0:
                        break
                    piece = await reader.readexactly(size)
                    await reader.readline()
                else:
                    piece = await reader.read(65536)
                    if not piece:
                        break
                buffer += piece
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    for line in event.decode().splitlines():
                        if line.startswith("data:") and line[5:].strip() != "[DONE]":
                            yield json.loads(line[5:], object_hook=lambda d: types.SimpleNamespace(**d))
        finally:
            writer.close()


async def stream_completion(client, args, prompt, max_tokens):
    body = dict(model=args.model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True})
    if isinstance(client, StdlibClient):
        body["ignore_eos"] = True
        async for chunk in client.stream(body):
            yield chunk
        return
    extra = {"ignore_eos": True}
    async for chunk in await client.completions.create(**body, extra_body=extra):
        yield chunk


async def one_request(client, args, prompt, max_tokens, semaphore):
    async with semaphore:
        start = time.perf_counter()
        token_times, usage, finish, error = [], None, None, None
        try:
            async for chunk in stream_completion(client, args, prompt, max_tokens):
                now = time.perf_counter()
                if getattr(chunk, "usage", None) is not None:
                    usage = chunk.usage
                for choice in getattr(chunk, "choices", None) or []:
                    if choice.text:
                        token_times.append(now)
                    if choice.finish_reason:
                        finish = choice.finish_reason
        except Exception as e:  # counted as a failed request, reported below
            error = f"{type(e).__name__}: {e}"
        end = time.perf_counter()
    if error is None and (usage is None or usage.completion_tokens != max_tokens or finish != "length"):
        error = (f"asked for {max_tokens} tokens, got usage {usage and usage.completion_tokens}, "
                 f"finish_reason {finish!r}")
    return {"start": start, "end": end, "token_times": token_times, "prompt_tokens": len(prompt),
            "output_tokens": max_tokens, "error": error}


async def run(args):
    mix = request_mix(args)
    api_key = os.environ.get("OPENAI_API_KEY", "unused")
    if args.client == "openai" and openai is None:
        raise SystemExit("--client openai: the openai package is not installed (pip install openai, or --client stdlib)")
    if openai is not None and args.client != "stdlib":
        client = openai.AsyncOpenAI(base_url=args.base_url, api_key=api_key, max_retries=0, timeout=args.timeout)
    else:
        client = StdlibClient(args.base_url, api_key, args.timeout)
    semaphore = asyncio.Semaphore(args.max_concurrency if args.max_concurrency > 0 else len(mix))
    begin = time.perf_counter()
    tasks = []
    for arrival, prompt, max_tokens in mix:
        delay = begin + arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one_request(client, args, prompt, max_tokens, semaphore)))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - begin
    if not isinstance(client, StdlibClient):
        await client.close()
    return results, duration


def percentiles(values_ms):
    if not values_ms:
        return {"mean": float("nan"), "median": float("nan"), "p99": float("nan")}
    a = np.asarray(values_ms)
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p99": float(np.percentile(a, 99))}


def summarize(results, duration):
    ok = [r for r in results if r["error"] is None]
    ttft = [(r["token_times"][0] - r["start"]) * 1e3 for r in ok if r["token_times"]]
    tpot = [(r["end"] - r["token_times"][0]) * 1e3 / (r["output_tokens"] - 1)
            for r in ok if r["token_times"] and r["output_tokens"] > 1]
    itl = [(b - a) * 1e3 for r in ok for a, b in zip(r["token_times"], r["token_times"][1:])]
    e2e = [(r["end"] - r["start"]) * 1e3 for r in ok]
    inputs = sum(r["prompt_tokens"] for r in ok)
    outputs = sum(r["output_tokens"] for r in ok)
    return {"successful_requests": len(ok), "failed_requests": len(results) - len(ok), "duration_s": duration,
            "total_input_tokens": inputs, "total_generated_tokens": outputs,
            "request_throughput": len(ok) / duration, "output_tokens_per_s": outputs / duration,
            "total_tokens_per_s": (inputs + outputs) / duration, "ttft_ms": percentiles(ttft),
            "tpot_ms": percentiles(tpot), "itl_ms": percentiles(itl), "e2e_ms": percentiles(e2e)}


def table(s, args):
    lines = [f"{'=' * 14} Serving Benchmark Result {'=' * 14}",
             f"{'Successful requests:':<40}{s['successful_requests']:>12}",
             f"{'Failed requests:':<40}{s['failed_requests']:>12}",
             f"{'Request rate (req/s):':<40}{args.request_rate:>12}",
             f"{'Benchmark duration (s):':<40}{s['duration_s']:>12.2f}",
             f"{'Total input tokens:':<40}{s['total_input_tokens']:>12}",
             f"{'Total generated tokens:':<40}{s['total_generated_tokens']:>12}",
             f"{'Request throughput (req/s):':<40}{s['request_throughput']:>12.2f}",
             f"{'Output token throughput (tok/s):':<40}{s['output_tokens_per_s']:>12.2f}",
             f"{'Total Token throughput (tok/s):':<40}{s['total_tokens_per_s']:>12.2f}"]
    for key, title in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                       ("itl_ms", "Inter-token Latency"), ("e2e_ms", "End-to-end Latency")):
        short = key.split("_")[0].upper()
        lines.append(f"{'-' * 15}{title}{'-' * 15}")
        lines.append(f"{f'Mean {short} (ms):':<40}{s[key]['mean']:>12.2f}")
        lines.append(f"{f'Median {short} (ms):':<40}{s[key]['median']:>12.2f}")
        lines.append(f"{f'P99 {short} (ms):':<40}{s[key]['p99']:>12.2f}")
    lines.append("=" * 53)
    return "\n".join(lines)


def record(s, args):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mix = (f"bench_inference's ShareGPT-shaped mix with shared system prompts ({os.path.basename(args.mix)})"
           if args.mix else "ShareGPT-like lognormal mix")
    config = f"{args.label}: {args.num_requests} requests, rate {args.request_rate}/s, {mix} (seed {args.seed})"
    with open(os.path.join(root, "bench", "RESULTS.md"), "a", encoding="utf-8") as f:
        f.write(f"\n## serve — {date}\n\nmachine: {args.machine}; commit {args.commit}\n"
                f"command: `{' '.join(sys.argv)}`\nconfig: {config}\n\n```\n{table(s, args)}\n```\n")
    rows = [("output_tokens_per_s", s["output_tokens_per_s"]), ("total_tokens_per_s", s["total_tokens_per_s"]),
            ("ttft_ms_mean", s["ttft_ms"]["mean"]), ("ttft_ms_p99", s["ttft_ms"]["p99"]),
            ("tpot_ms_mean", s["tpot_ms"]["mean"]), ("tpot_ms_p99", s["tpot_ms"]["p99"]),
            ("e2e_ms_mean", s["e2e_ms"]["mean"])]
    with open(os.path.join(root, "bench", "results.jsonl"), "a", encoding="utf-8") as f:
        for metric, value in rows:
            f.write(json.dumps({"date": date, "commit": args.commit, "machine": args.machine, "bench": "serve",
                                "config": config, "metric": metric, "value": value, "peer": None,
                                "peer_value": None, "ratio": None}) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--request-rate", type=float, default=float("inf"))
    ap.add_argument("--max-concurrency", type=int, default=0, help="0: unbounded")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", help="replay this file's requests (bench_inference --write-mix) instead of drawing them")
    ap.add_argument("--min-input", type=int, default=4)
    ap.add_argument("--max-input", type=int, default=1024)
    ap.add_argument("--min-output", type=int, default=4)
    ap.add_argument("--max-output", type=int, default=1024)
    ap.add_argument("--token-low", type=int, default=100)
    ap.add_argument("--token-high", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--client", choices=["auto", "openai", "stdlib"], default="auto",
                    help="auto: the openai package where installed, else the standard-library client")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--label", default="colossus serve")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--machine", default="unknown")
    args = ap.parse_args()
    for name in ("num_requests", "min_input", "min_output"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not (args.request_rate > 0) or args.max_input < args.min_input or args.max_output < args.min_output \
            or args.token_high <= args.token_low:
        ap.error("--request-rate must be > 0, and each max / high at least its min / low")
    results, duration = asyncio.run(run(args))
    summary = summarize(results, duration)
    print(table(summary, args))
    for r in results:
        if r["error"]:
            print("failed:", r["error"], file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    if args.record:
        record(summary, args)
    return 0 if summary["failed_requests"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
