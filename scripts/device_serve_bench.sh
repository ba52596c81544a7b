#!/usr/bin/env bash
# `colossus serve` under bench/serve_bench.py (vLLM benchmark_serving's table:
# request and token throughput, TTFT / TPOT / ITL / e2e mean, median, p99) on
# one GPU. One device call: builds colossus_cli against the image's torch
# (build-gpu, sm_90, no tests; .devdeps carried, made by
# scripts/pack_device_deps.sh), writes a llama-1b-like model directory with
# seeded random bf16 weights (transformers' LlamaForCausalLM: hidden 2048, 16
# layers, 32/8 heads, SwiGLU 8192, vocab 32000) and a 32000-token byte-level
# BPE tokenizer whose tokens past the 256 bytes are ASCII words (" w123"), so
# every streamed token is whole text and serve_bench.py times it; then starts
# `colossus serve` on 127.0.0.1 with its defaults (GPU, the model's bf16, CUDA
# graphs, gpu_memory_utilization 0.9, max_batch_size 256, max_num_batched_tokens
# 8192, lengths up to the model's context: checked from its log) and two sizes
# (--max_context_len_to_capture 2048, a thread per concurrent stream), waits
# for /health, warms it up (64 short requests, not recorded), and replays
# bench_inference's ShareGPT-shaped mix (--write-mix: the requests of the
# decode stage's mix table) with serve_bench.py at 8, 32 and inf requests/s
# with --record (each rate's request count sized so all fit in ~250 s; a rate
# that would start too late is skipped and says so). Then /metrics is scraped
# once (vllm:* lines kept) and the server is stopped with SIGTERM, which must
# end it with exit 0. Every step's exit code is checked; the summary is printed
# last and the script exits 1 if any step failed.
# $OUT gets: serve.log, serve_bench_<rate>.{log,json}, metrics.txt,
# metrics_vllm.txt, serve_RESULTS.md + serve_results.jsonl (what --record
# appended to bench/), summary.md.
# COLOSSUS_COMMIT=<sha> labels the rows (the device copy has no git history).
# SERVE_BENCH_SKIP_BUILD=1 uses build-gpu/bin/colossus as it is when it
# exists (scripts/device_round.sh built it already).
# `--cpu` runs the same flow on this machine's CPU build (build/bin/colossus,
# .venv's python) with a tiny model and a few requests, without --record: a
# dry run of the script.
# Usage (device): bash scripts/device_serve_bench.sh        (CPU: --cpu)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/colossus-out}
work=${SERVE_BENCH_WORK:-/tmp/colossus_serve_bench}
mkdir -p "$out" "$work"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
# Seconds left of the call's 600 (15 s kept for stopping the server and the
# copy-back); SERVE_BENCH_BUDGET_S when the call ran other work first.
left() { echo $(( ${SERVE_BENCH_BUDGET_S:-585} - ($(date +%s) - t0) )); }
failures=()
fail() { failures+=("$*"); echo "FAIL: $*"; }

cpu=0
[[ "${1:-}" == "--cpu" ]] && cpu=1
if (( cpu )); then
  bin=build/bin/colossus
  python=.venv/bin/python
  model_shape='{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 2000}'
  serve_args=(--max_batch_size 8 --max_input_len 64 --max_output_len 16 --threads 64)
  mix_args=(--max-input 48 --max-output 16 --token-low 300 --token-high 2000)
  mix_bin=build/bin/bench_inference
  engine_mix_args=(--vocab 2000 --mix-requests 24 --mix-system-len 16 --mix-max-input 32 --mix-max-output 16)
  # rate:requests
  rates=(8:12 32:16 inf:24)
  record=()
  bench_timeout=120
else
  bin=build-gpu/bin/colossus
  python=python3
  model_shape='{"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                "num_key_value_heads": 8, "vocab_size": 32000}'
  # vLLM-style defaults for the rest (max_batch_size 256, max_num_batched_tokens
  # 8192, lengths up to the model's 4096 positions): checked below.
  serve_args=(--max_context_len_to_capture 2048 --threads 1100)
  # The warm-up: serve_bench.py's own mix, token ids past the byte tokens.
  mix_args=(--token-low 300 --token-high 32000)
  mix_bin=build-gpu/bin/bench_inference
  # The measured runs: bench_inference's mix (the decode stage's (f) table), replayed.
  engine_mix_args=(--vocab 32000 --mix-requests 1000)
  # ~50 s at 8/s and ~25 s at 32/s of arrivals (plus the longest request's
  # tail), then 1000 at once; ~150 s in all on an H100.
  rates=(8:400 32:800 inf:1000)
  # SERVE_BENCH_RATES="8:200 32:400 inf:600" for a shorter run.
  [[ -n "${SERVE_BENCH_RATES:-}" ]] && read -r -a rates <<< "$SERVE_BENCH_RATES"
  machine=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  record=(--record --commit "${COLOSSUS_COMMIT:-unknown}" --machine "1x ${machine:-CUDA GPU}"
          --label "colossus serve, llama-1b-like (1.10B, seeded random bf16 weights), CUDA graphs, max_batch_size 256")
  bench_timeout=200
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
    --format=csv 2>&1 | tee "$out/nvidia-smi.csv"
fi

# serve_bench.py needs numpy; without the openai package it uses its
# standard-library client (the GPU image has no openai). Without numpy only
# the server's start, one completion and /metrics are checked.
have_client=1
if ! "$python" -c "import numpy" 2> "$out/python_imports.txt"; then
  have_client=0
  fail "no numpy for $python ($(tail -1 "$out/python_imports.txt")): serve_bench.py cannot run"
fi

if (( ! cpu )) && [[ ${SERVE_BENCH_SKIP_BUILD:-0} == 1 && -x build-gpu/bin/colossus ]]; then
  stamp "build-gpu/bin/colossus already built (SERVE_BENCH_SKIP_BUILD=1): not rebuilt"
elif (( ! cpu )); then
  stamp "configure"
  torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  # utf8proc and Oniguruma from .devdeps where the image has none (as scripts/device_build.sh).
  for lib in libutf8proc oniguruma; do
    pkg-config --exists "$lib" 2>/dev/null || export PKG_CONFIG_PATH="$PWD/.devdeps/$lib/lib/pkgconfig:${PKG_CONFIG_PATH:-}"
  done
  cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCOLOSSUS_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=OFF > "$out/configure.log" 2>&1 \
    || { tail -60 "$out/configure.log"; exit 1; }
  stamp "build colossus_cli"
  if ! ninja -C build-gpu -k 0 -j "$(nproc)" colossus_cli bench_inference > "$out/build.log" 2>&1; then
    echo "=== build failed; errors (full log: build.log) ==="
    grep -E -B3 -A25 "error|FAILED" "$out/build.log" | head -200
    exit 1
  fi
  stamp "build done"
fi
[[ -x "$bin" ]] || { echo "no $bin (build it first: ninja -C build colossus_cli)"; exit 1; }

# The model directory: random weights through transformers (seeded), the
# tokenizer written by hand (tokenizer.json in the tokenizers format).
model_dir=$work/llama-1b-like
stamp "model directory $model_dir"
if ! "$python" - "$model_dir" "$model_shape" > "$out/make_model.log" 2>&1 <<'PY'
import json, os, sys
import torch, transformers

out, shape = sys.argv[1], json.loads(sys.argv[2])
vocab = shape["vocab_size"]
config = transformers.LlamaConfig(**shape, max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                                  tie_word_embeddings=False, bos_token_id=256, eos_token_id=256, pad_token_id=None)
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
with torch.device(device):
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(out)

# GPT-2's byte alphabet: byte b -> one printable character.
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

alphabet = bytes_to_unicode()
eos = "<|endoftext|>"
tokens = {alphabet[b]: b for b in range(256)}
tokens[eos] = 256  # in the vocabulary too, as GPT-2's, so the added token keeps its id
# 257..vocab-1: ' w<n>' in the byte alphabet ('Ġ' is the space): whole ASCII words.
for i in range(257, vocab):
    tokens[alphabet[ord(" ")] + f"w{i}"] = i
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
tokenizer = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": 256, "content": eos, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True}],
    "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
              "vocab": tokens, "merges": []},
}
with open(os.path.join(out, "tokenizer.json"), "w") as f:
    json.dump(tokenizer, f)
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eos, "eos_token": eos,
               "model_max_length": 4096}, f)
params = sum(p.numel() for p in model.parameters())
print(f"wrote {out}: {params / 1e9:.3f}B parameters, vocab {vocab}, on {device}")
PY
then
  tail -20 "$out/make_model.log"
  fail "the model directory could not be written (make_model.log)"
  printf '%s\n' "${failures[@]}"
  exit 1
fi
tail -1 "$out/make_model.log"

# The server: defaults for device, dtype and CUDA graphs; any free port.
stamp "colossus serve"
"$bin" serve "$model_dir" --host 127.0.0.1 --port 0 --served_model_name llama-1b-like --quiet "${serve_args[@]}" \
  > "$out/serve.log" 2>&1 &
server=$!
port=""
for _ in $(seq 1 600); do
  kill -0 "$server" 2> /dev/null || break
  port=$(grep -oE "on http://127\.0\.0\.1:[0-9]+" "$out/serve.log" | head -1 | sed 's/.*://')
  if [[ -n "$port" ]] && "$python" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
       "http://127.0.0.1:$port/health" 2> /dev/null; then
    break
  fi
  port=""
  sleep 0.5
done
if [[ -z "$port" ]]; then
  tail -30 "$out/serve.log"
  kill -KILL "$server" 2> /dev/null
  wait "$server" 2> /dev/null
  fail "colossus serve did not answer /health (serve.log)"
  printf '%s\n' "${failures[@]}"
  exit 1
fi
grep -E "^loaded|^serving|CUDA graphs off" "$out/serve.log"
stamp "ready on port $port"
base_url=http://127.0.0.1:$port
if (( ! cpu )) && ! grep -q "bf16, cuda:0, CUDA graphs" "$out/serve.log"; then
  fail "the defaults did not pick bf16 on cuda:0 with CUDA graphs (see the 'loaded' line)"
fi
if (( ! cpu )) && ! grep -q "max_model_len 4096, max_batch_size 256, .*max_num_batched_tokens 8192" "$out/serve.log"; then
  fail "the defaults did not give max_model_len 4096, max_batch_size 256, max_num_batched_tokens 8192 (see the 'serving' line)"
fi

# The measured requests: the engine benchmark's ShareGPT-shaped mix (shared
# system prompts, so prefix caching reuses what it does in bench_inference's
# table), written by bench_inference and replayed by serve_bench.py --mix.
mix_file=$work/engine_mix.json
if [[ -x "$mix_bin" ]] && "$mix_bin" --write-mix "$mix_file" "${engine_mix_args[@]}" > "$out/engine_mix.log" 2>&1; then
  cat "$out/engine_mix.log"
  measured_mix=(--mix "$mix_file")
else
  fail "bench_inference --write-mix failed or $mix_bin is not built (engine_mix.log): serve_bench.py's own mix instead"
  measured_mix=("${mix_args[@]}")
fi

if (( have_client )); then
  stamp "warm-up: 64 short requests at once (not recorded)"
  timeout 120 "$python" bench/serve_bench.py --base-url "$base_url/v1" --model llama-1b-like --num-requests 64 \
    --request-rate inf --seed 100 --max-input 256 --max-output 32 "${mix_args[@]}" > "$out/serve_bench_warmup.log" 2>&1 \
    || fail "warm-up serve_bench.py: exit $? (serve_bench_warmup.log)"
  results_md_lines=$(wc -l < bench/RESULTS.md)
  results_jsonl_lines=$(wc -l < bench/results.jsonl)
  for spec in "${rates[@]}"; do
    rate=${spec%%:*} n=${spec##*:}
    if (( $(left) < 60 )); then
      fail "rate $rate not run: $(left) s left"
      continue
    fi
    limit=$(( $(left) - 30 < bench_timeout ? $(left) - 30 : bench_timeout ))
    stamp "serve_bench.py: $n requests at $rate/s (timeout $limit s)"
    timeout "$limit" "$python" bench/serve_bench.py --base-url "$base_url/v1" --model llama-1b-like --num-requests "$n" \
      --request-rate "$rate" --seed 0 "${measured_mix[@]}" --json "$out/serve_bench_$rate.json" "${record[@]}" \
      > "$out/serve_bench_$rate.log" 2>&1
    rc=$?
    cat "$out/serve_bench_$rate.log" | grep -v "^failed:" | tail -30
    grep -m5 "^failed:" "$out/serve_bench_$rate.log"
    (( rc == 0 )) || fail "serve_bench.py at $rate/s: exit $rc$( (( rc == 124 )) && echo ' (timed out)')"
  done
  if (( ${#record[@]} )); then
    tail -n +$(( results_md_lines + 1 )) bench/RESULTS.md > "$out/serve_RESULTS.md"
    tail -n +$(( results_jsonl_lines + 1 )) bench/results.jsonl > "$out/serve_results.jsonl"
  fi
else
  # No client: one completion through the standard library, so the server is still exercised.
  "$python" - "$base_url" > "$out/one_completion.txt" 2>&1 <<'PY' || fail "one completion without openai failed"
import json, sys, urllib.request
body = json.dumps({"model": "llama-1b-like", "prompt": [300, 301, 302], "max_tokens": 8, "ignore_eos": True}).encode()
request = urllib.request.Request(sys.argv[1] + "/v1/completions", body, {"Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=60))
assert reply["usage"]["completion_tokens"] == 8, reply
print("one completion:", reply["choices"][0]["text"])
PY
  cat "$out/one_completion.txt"
fi

stamp "/metrics"
if "$python" -c "import urllib.request, sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())" \
     "$base_url/metrics" > "$out/metrics.txt" 2>&1; then
  grep -E "^vllm:" "$out/metrics.txt" > "$out/metrics_vllm.txt"
  grep -E "^vllm:(num_requests_(running|waiting)|gpu_cache_usage_perc|prompt_tokens_total|generation_tokens_total|request_success_total)" \
    "$out/metrics_vllm.txt" | head -20
  [[ -s "$out/metrics_vllm.txt" ]] || fail "/metrics has no vllm:* lines"
else
  fail "/metrics could not be read (metrics.txt)"
fi

stamp "SIGTERM"
kill -TERM "$server"
for _ in $(seq 1 60); do
  kill -0 "$server" 2> /dev/null || break
  sleep 0.5
done
if kill -0 "$server" 2> /dev/null; then
  kill -KILL "$server"
  wait "$server" 2> /dev/null
  fail "colossus serve still ran 30 s after SIGTERM (killed)"
else
  wait "$server"
  rc=$?
  (( rc == 0 )) || fail "colossus serve exited $rc after SIGTERM"
  grep -q "^stopped" "$out/serve.log" || fail "serve.log does not end with 'stopped'"
fi

{
  echo "| rate (req/s) | requests | ok / failed | duration (s) | output tok/s | total tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) |"
  echo "|---|---|---|---|---|---|---|---|"
  for spec in "${rates[@]}"; do
    rate=${spec%%:*} n=${spec##*:}
    "$python" - "$out/serve_bench_$rate.json" "$rate" "$n" <<'PY' 2> /dev/null || echo "| ${spec%%:*} | ${spec##*:} | no result | | | | | |"
import json, sys
s = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {s['successful_requests']} / {s['failed_requests']} | {s['duration_s']:.1f} | "
      f"{s['output_tokens_per_s']:.0f} | {s['total_tokens_per_s']:.0f} | "
      f"{s['ttft_ms']['median']:.1f} / {s['ttft_ms']['p99']:.1f} | {s['tpot_ms']['median']:.2f} / {s['tpot_ms']['p99']:.2f} |")
PY
  done
  echo
  grep -E "^loaded .*KV cache" "$out/serve.log" | sed 's/^/- server: /'
  if (( ${#failures[@]} )); then printf -- '- FAIL: %s\n' "${failures[@]}"; else echo "- every step passed"; fi
} > "$out/summary.md"
stamp "done"
cat "$out/summary.md"
(( ${#failures[@]} == 0 ))
