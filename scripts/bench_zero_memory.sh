#!/usr/bin/env bash
# Memory per rank of DDP, ZeRO-1, ZeRO-2, Gemini (ZeRO-3 chunks) and Gemini
# with full CPU offload on 1, 2 and 4 CPU ranks over MPI
# (bench/bench_zero_memory.cpp): prints a table with the ratio to DDP and,
# with --record, appends it to bench/RESULTS.md and one JSON row per layout
# and rank count to bench/results.jsonl.
#   scripts/bench_zero_memory.sh [BUILD_DIR] [--record]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
record=${2:-}
bin=$build/bin/bench_zero_memory
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for precision in fp32 bf16; do
  for ranks in 1 2 4; do
    for plugin in ddp zero1 zero2 gemini gemini_offload; do
      "$root/scripts/mpirun_test.sh" "$ranks" "$bin" --plugin "$plugin" --precision "$precision" | grep '^{' >>"$out"
    done
  done
done
python3 - "$out" "$root" "$record" <<'EOF'
import json, sys, datetime, subprocess, platform
rows = [json.loads(l) for l in open(sys.argv[1])]
root, record = sys.argv[2], sys.argv[3] == "--record"
mib = lambda b: b / 2**20
ddp = {(r["precision"], r["ranks"]): r for r in rows if r["plugin"] == "ddp"}
peer = lambda r: ddp[(r["precision"], r["ranks"])]
def tensors(r): return r["params_bytes"] + r["grads_bytes"] + r["masters_bytes"] + r["optimizer_state_bytes"]
lines = ["| precision | ranks | layout | params MiB | grads MiB | fp32 masters MiB | optimizer state MiB | total tensors MiB | x of DDP | device MiB | host MiB | gathered peak MiB | RSS MiB |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    ratio = tensors(r) / tensors(peer(r))
    r["ratio"] = ratio
    lines.append(f"| {r['precision']} | {r['ranks']} | {r['plugin']} | {mib(r['params_bytes']):.1f} | {mib(r['grads_bytes']):.1f} | "
                 f"{mib(r['masters_bytes']):.1f} | {mib(r['optimizer_state_bytes']):.1f} | {mib(tensors(r)):.1f} | "
                 f"{ratio:.2f} | {mib(tensors(r) - r.get('host_bytes', 0)):.1f} | {mib(r.get('host_bytes', 0)):.1f} | "
                 f"{mib(r.get('gathered_peak_bytes', 0)):.1f} | {mib(r['rss_bytes']):.0f} |")
table = "\n".join(lines)
print(table)
if not record:
    sys.exit(0)
date = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
cpu = "AMD EPYC, 2 cores" if "AMD" in open("/proc/cpuinfo").read() else platform.processor()
config = (f"GPT-2 {rows[0]['model_params']/1e6:.2f}M params (4 layers, width 256, vocab 8192), fp32 or bf16 (+ fp32 masters), AdamW, "
          "one step (B=2 per rank, T=128), measured after the step before zero_grad; DDP with gradient_as_bucket_view; "
          "ZeRO reduce_bucket_size_in_m=1; Gemini static placement, min_chunk_size_m=0.25, search_range_m=1, "
          "gemini_offload = offload_optim_frac=offload_param_frac=1; per-rank maximum over ranks")
with open(f"{root}/bench/RESULTS.md", "a") as f:
    f.write(f"## zero_memory — {date}\n\nmachine: {cpu}, CPU ranks over MPI (OpenMPI, oversubscribed); commit {commit}\n"
            f"command: `scripts/bench_zero_memory.sh BUILD_DIR --record` (CPU build, CMake -DCOLOSSUS_CUDA=OFF)\nconfig: {config}\n\n{table}\n\n"
            "Tensor bytes are what each layout holds per rank: DDP keeps full params, grads and AdamW moments; "
            "ZeRO-1 keeps full params and grads but 1/N of the fp32 masters and moments; ZeRO-2 also keeps only 1/N "
            "of the grads (reduce-scattered during backward; fp32 chunks). With fp32 params the master is the rank's own "
            "chunk of the params (0 extra bytes); with bf16, DDP keeps full fp32 masters, ZeRO 1/N. The gradient chunk is "
            "fp32 (it is the master's .grad), so at 1 rank ZeRO holds more gradient bytes than DDP (ZeRO-1: param.grad and "
            "the chunk; bf16: an fp32 chunk against bf16 grads), hence >1x there; from 2 ranks on the sharding wins. Gemini (ZeRO-3) also keeps only "
            "its 1/N shard of the parameters between uses (fp32: the shard is the master); whole chunks exist only while a segment "
            "runs (gathered peak: the most chunks gathered at once, transient). gemini_offload places every shard (parameters, "
            "gradients, masters, moments) in host memory: device MiB 0 (on CPU ranks host and device are one memory, so this is "
            "the placement's accounting, and RSS does not drop). RSS includes the process baseline "
            "(libtorch, MPI) and allocator caching, so it moves little at this model size.\n")
with open(f"{root}/bench/results.jsonl", "a") as f:
    for r in rows:
        f.write(json.dumps({"bench": "zero_memory", "commit": commit, "config": config, "date": date,
                            "machine": f"{cpu}, {r['ranks']} CPU rank(s) over MPI",
                            "metric": "tensor_bytes_per_rank", "impl": r["plugin"], "value": tensors(r),
                            "peer": "ddp", "peer_value": tensors(peer(r)), "ratio": r["ratio"],
                            "rss_bytes": r["rss_bytes"], "ranks": r["ranks"], "precision": r["precision"],
                            "device_bytes": tensors(r) - r.get("host_bytes", 0), "host_bytes": r.get("host_bytes", 0),
                            "gathered_peak_bytes": r.get("gathered_peak_bytes", 0)}, sort_keys=True) + "\n")
EOF
