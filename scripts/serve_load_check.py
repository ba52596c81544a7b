#!/usr/bin/env python3
"""`colossus serve` under load, then stopped by SIGTERM with requests in flight.

Starts the server (loopback, any free port), runs every distinct request once
on its own (the reference), then drives --requests requests from --clients
concurrent clients: /v1/completions and /v1/chat/completions, streamed and
not, greedy and seeded-sampled. Checks every response (greedy ones equal to
their single-request text and token count; streams end with [DONE]; sampled
ones well-formed and within max_tokens), then that /metrics shows every KV
block free and nothing running once the load has ended. Last it starts
--inflight long requests, sends SIGTERM while they run, and checks that the
server exits 0 within --stop-timeout seconds and that every in-flight client
got a complete response or a clean error (none hangs).

Standard library only, so it runs with any python3 (the project's .venv in
CI, the GPU image's interpreter on the device).

Usage: serve_load_check.py --bin build/bin/colossus --model DIR [--requests 256
       --clients 64 --max-tokens 32 --inflight 32] [--report out.json]
       [-- extra `colossus serve` flags]
Prints a table and "serve load check: PASS" (exit 0), or the failures (exit 1).
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over",
    "1 2 3 4 5 6 7",
    "Hello",
    "In the beginning the model had no data, and then",
    "Q: What is 12 plus 30? A:",
    "A long time ago in a small village there lived",
    "def add(a, b):",
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the colossus binary")
    p.add_argument("--model", required=True, help="model directory to serve")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32, help="most tokens a load request asks for")
    p.add_argument("--inflight", type=int, default=32, help="requests running when SIGTERM arrives")
    p.add_argument("--inflight-tokens", type=int, default=0, help="their max_tokens (0: the server's max_output_len)")
    p.add_argument("--stop-timeout", type=float, default=30.0, help="seconds the server may take to exit after SIGTERM")
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--min-agree-chars", type=int, default=0,
                   help="0: greedy texts must equal their single-request text exactly (fp32). N > 0 (bf16, where "
                        "a batch's GEMM tiling can flip a near-tie argmax): a greedy text that differs must still "
                        "agree on its first N characters; exact and divergent counts are both reported")
    p.add_argument("--log", default="", help="server log file (default: a temporary file)")
    p.add_argument("--report", default="", help="write the results as JSON here")
    p.add_argument("serve_args", nargs="*", help="extra flags for `colossus serve` (after --)")
    return p.parse_args()


class Server:
    def __init__(self, args):
        self.log_path = args.log or tempfile.mkstemp(prefix="colossus_serve_", suffix=".log")[1]
        self.log_file = open(self.log_path, "w")
        cmd = [args.bin, "serve", args.model, "--host", "127.0.0.1", "--port", "0", "--served_model_name", "m",
               "--quiet"] + args.serve_args
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.port = 0
        start = time.time()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"colossus serve exited ({self.proc.returncode}) before it was ready:\n{self.log()}")
            if not self.port:
                m = re.search(r"serving '.*' on http://127\.0\.0\.1:(\d+)", self.log())
                if m:
                    self.port = int(m.group(1))
            if self.port:
                try:
                    if request(self.port, "GET", "/health", timeout=2)[0] == 200:
                        return
                except OSError:
                    pass
            if time.time() - start > args.ready_timeout:
                self.proc.kill()
                raise RuntimeError(f"colossus serve was not ready after {args.ready_timeout} s:\n{self.log()}")
            time.sleep(0.1)

    def log(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


def request(port, method, path, body=None, timeout=600):
    """One HTTP request; returns (status, body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        return res.status, res.read().decode("utf-8", errors="replace")
    finally:
        conn.close()


def metrics(port):
    """Prometheus text -> {name: value summed over its label sets}."""
    status, text = request(port, "GET", "/metrics", timeout=30)
    if status != 200:
        raise RuntimeError(f"/metrics gave {status}")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            name = key.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def body_of(case):
    body = {"model": "m", "stream": case["stream"]}
    if case["max_tokens"] is not None:
        body["max_tokens"] = case["max_tokens"]
    if case.get("ignore_eos"):
        body["ignore_eos"] = True
    if case["stream"]:
        body["stream_options"] = {"include_usage": True}
    if case["sampled"]:
        body.update(temperature=0.8, top_k=20, seed=case["seed"])
    else:
        body["temperature"] = 0
    if case["chat"]:
        body["messages"] = [{"role": "user", "content": case["prompt"]}]
    else:
        body["prompt"] = case["prompt"]
    return body


def run_case(port, case, timeout=600):
    """Sends one case; returns {"text", "completion_tokens", "finish_reason"} or raises with what was wrong."""
    path = "/v1/chat/completions" if case["chat"] else "/v1/completions"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body_of(case)), headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        if not case["stream"]:
            text = res.read().decode("utf-8")
            if res.status != 200:
                raise ValueError(f"HTTP {res.status}: {text[:300]}")
            choice = json.loads(text)["choices"][0]
            usage = json.loads(text)["usage"]
            return {"text": choice["message"]["content"] if case["chat"] else choice["text"],
                    "completion_tokens": usage["completion_tokens"], "finish_reason": choice["finish_reason"]}
        if res.status != 200:
            raise ValueError(f"HTTP {res.status}: {res.read()[:300]!r}")
        text, finish, tokens, done = "", None, None, False
        for raw in res:  # SSE: "data: {...}" lines
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                raise ValueError(f"stream error event: {event['error']}")
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                text += choice["delta"].get("content", "") if case["chat"] else choice.get("text", "")
                finish = choice.get("finish_reason") or finish
        if not done:
            raise ValueError("the stream ended without [DONE]")
        return {"text": text, "completion_tokens": tokens, "finish_reason": finish}
    finally:
        conn.close()


def make_cases(n, max_tokens):
    """n requests over a set of distinct greedy cases (each also run alone) and seeded sampled ones."""
    cases = []
    for i in range(n):
        cases.append({"chat": i % 4 == 3, "stream": i % 3 == 0, "sampled": i % 8 == 5,
                      "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 4 + (i * 7) % max(1, max_tokens - 3),
                      "seed": i})
    return cases


def key_of(case):
    return (case["chat"], case["prompt"], case["max_tokens"])


def parallel(cases, clients, fn):
    """fn(case) over cases from `clients` threads; returns [(result, error)] in case order."""
    results = [None] * len(cases)
    next_index = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(cases):
                return
            try:
                results[i] = (fn(cases[i]), None)
            except Exception as e:  # noqa: BLE001 -- every failure is reported per request
                results[i] = (None, f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main():
    args = parse_args()
    failures = []
    report = {"requests": args.requests, "clients": args.clients, "inflight": args.inflight}
    server = Server(args)
    port = server.port
    try:
        cases = make_cases(args.requests, args.max_tokens)
        # The reference: each distinct greedy case alone, one at a time.
        reference = {}
        for case in cases:
            if not case["sampled"] and key_of(case) not in reference:
                alone = dict(case, stream=False)
                reference[key_of(case)] = run_case(port, alone)
        report["distinct_greedy_cases"] = len(reference)

        t0 = time.time()
        results = parallel(cases, args.clients, lambda c: run_case(port, c))
        report["load_seconds"] = round(time.time() - t0, 2)
        ok = mismatched = errors = diverged = 0
        generated = 0
        first_divergence = []
        for case, (got, error) in zip(cases, results):
            if error:
                errors += 1
                failures.append(f"request {case}: {error}")
                continue
            generated += got["completion_tokens"] or 0
            if case["sampled"]:
                good = got["completion_tokens"] is not None and 0 < got["completion_tokens"] <= case["max_tokens"] \
                    and got["finish_reason"] in ("length", "stop")
            else:
                want = reference[key_of(case)]
                good = got["text"] == want["text"] and got["completion_tokens"] == want["completion_tokens"] \
                    and got["finish_reason"] == want["finish_reason"]
                if not good and args.min_agree_chars > 0 and got["completion_tokens"]:
                    common = os.path.commonprefix([got["text"], want["text"]])
                    first_divergence.append(len(common))
                    if len(common) >= min(args.min_agree_chars, len(want["text"])):
                        diverged += 1
                        good = True
            if good:
                ok += 1
            else:
                mismatched += 1
                want = reference.get(key_of(case))
                failures.append(f"request {case}: got {got}, single-request run gave {want}")
        report.update(load_exact=ok - diverged, load_diverged_after_agreeing=diverged,
                      first_divergence_chars=sorted(first_divergence)[:20])
        report.update(load_ok=ok, load_mismatched=mismatched, load_errors=errors, load_tokens=generated,
                      load_tokens_per_s=round(generated / max(report["load_seconds"], 1e-9), 1))

        # Every block back once the load has ended (freeing may trail the last response by a step).
        deadline = time.time() + 10
        while True:
            m = metrics(port)
            idle = m.get("colossus:kv_blocks_used", -1) == 0 and m.get("colossus:requests_running", -1) == 0 \
                and m.get("colossus:requests_waiting", -1) == 0
            if idle or time.time() > deadline:
                break
            time.sleep(0.1)
        report.update(kv_blocks_used_after_load=m.get("colossus:kv_blocks_used"),
                      kv_blocks_total=m.get("colossus:kv_blocks_total"),
                      requests_running_after_load=m.get("colossus:requests_running"))
        if not idle:
            failures.append("after the load /metrics shows " + ", ".join(
                f"{k} {m.get(k)}" for k in ("colossus:kv_blocks_used", "colossus:requests_running",
                                            "colossus:requests_waiting")))

        # SIGTERM with requests in flight.
        # Long requests (no max_tokens: the server's max_output_len; eos ignored) so they are still running.
        long_cases = [{"chat": i % 2 == 1, "stream": i % 2 == 0, "sampled": False, "prompt": PROMPTS[i % len(PROMPTS)],
                       "max_tokens": args.inflight_tokens or None, "seed": i, "ignore_eos": True}
                      for i in range(args.inflight)]
        inflight_results = [None] * len(long_cases)

        def send(i):
            try:
                inflight_results[i] = ("complete", run_case(port, long_cases[i], timeout=args.stop_timeout + 30))
            except Exception as e:  # noqa: BLE001
                inflight_results[i] = ("error", f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(long_cases))]
        for t in threads:
            t.start()
        deadline = time.time() + 30
        while time.time() < deadline and metrics(port).get("colossus:requests_running", 0) < 1:
            time.sleep(0.05)
        running_at_stop = metrics(port).get("colossus:requests_running", 0)
        t_stop = time.time()
        server.proc.send_signal(signal.SIGTERM)
        try:
            rc = server.proc.wait(timeout=args.stop_timeout)
        except subprocess.TimeoutExpired:
            rc = None
            failures.append(f"the server was still running {args.stop_timeout} s after SIGTERM")
            server.proc.kill()
            server.proc.wait()
        stop_seconds = time.time() - t_stop
        hung = 0
        for t in threads:
            t.join(timeout=30)
            hung += t.is_alive()
        complete = sum(1 for r in inflight_results if r and r[0] == "complete")
        cut = sum(1 for r in inflight_results if r and r[0] == "error")
        report.update(running_at_sigterm=running_at_stop, stop_seconds=round(stop_seconds, 2), exit_status=rc,
                      inflight_complete=complete, inflight_clean_error=cut, inflight_hung=hung,
                      inflight_max_tokens=args.inflight_tokens or "max_output_len")
        if rc != 0:
            failures.append(f"exit status after SIGTERM: {rc}")
        if running_at_stop < 1 and args.inflight > 0:
            failures.append("no request was running when SIGTERM was sent")
        if hung:
            failures.append(f"{hung} in-flight client(s) still waiting 30 s after the server exited")
        for case, r in zip(long_cases, inflight_results):
            if r and r[0] == "complete" and (r[1]["completion_tokens"] is None or r[1]["finish_reason"] != "length"):
                failures.append(f"in-flight request {case} completed with {r[1]}")
        log = server.log()
        if "SIGTERM: shutting down" not in log or "stopped" not in log:
            failures.append("the server log lacks 'SIGTERM: shutting down' / 'stopped'")
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()

    rows = [("requests / clients", f"{args.requests} / {args.clients}"),
            ("distinct greedy cases (run alone first)", report.get("distinct_greedy_cases")),
            ("load: ok / mismatched / errors", f"{report.get('load_ok')} / {report.get('load_mismatched')} / "
                                               f"{report.get('load_errors')}"),
            ("greedy: exact / diverged after agreeing (first divergence, chars)",
             f"{report.get('load_exact')} / {report.get('load_diverged_after_agreeing')} "
             f"({report.get('first_divergence_chars')})"),
            ("load: seconds, generated tokens/s", f"{report.get('load_seconds')}, {report.get('load_tokens_per_s')}"),
            ("KV blocks used after load (of total)", f"{report.get('kv_blocks_used_after_load')} "
                                                     f"(of {report.get('kv_blocks_total')})"),
            ("running at SIGTERM", report.get("running_at_sigterm")),
            ("stop after SIGTERM (s), exit status", f"{report.get('stop_seconds')}, {report.get('exit_status')}"),
            ("in flight: complete / clean error / hung", f"{report.get('inflight_complete')} / "
                                                          f"{report.get('inflight_clean_error')} / "
                                                          f"{report.get('inflight_hung')}")]
    print("| serve load check | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    report["failures"] = failures
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    if failures:
        print(f"serve load check: FAIL ({len(failures)} problem(s)); server log: {server.log_path}")
        for f in failures[:20]:
            print("  " + f)
        return 1
    print("serve load check: PASS")
    if not args.log:
        os.unlink(server.log_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
