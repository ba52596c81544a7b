#!/usr/bin/env bash
# ZeRO-2 with cpu_offload against ZeRO-2 on the device, bf16 with HybridAdam:
# the offloaded run takes ZeRO-Offload's host path (bf16 gradients to pinned
# host memory, one fused CPU Adam pass writing the bf16 parameters back; see
# LowLevelZeroOptimizer) and must follow the same loss curve (tests/zero
# proves it bit-equal on CPU ranks; here the norms are reduced on the GPU in
# both). Prints each run's tokens/s, the offloaded/plain ratio and the
# largest per-step relative loss difference, beside the plain run's own
# run-to-run difference (it is run twice), as a table and JSON rows.
# Usage (device, after scripts/device_build.sh): bash scripts/device_zero_offload.sh
#   CPU dry run: COLOSSUS_BIN=build/bin/colossus PRESET=llama-tiny DEVICE=cpu STEPS=3 SEQ=64 BATCH=2 PYTHON=.venv/bin/python bash scripts/device_zero_offload.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/colossus-out}
work=${ZERO_OFFLOAD_WORK:-/tmp/zero_offload}
mkdir -p "$out" "$work"
bin=${COLOSSUS_BIN:-build-gpu/bin/colossus}
preset=${PRESET:-llama-1b-like}; max_norm=${MAX_NORM:-1.0}; steps=${STEPS:-20}; seq=${SEQ:-1024}; batch=${BATCH:-8}; device=${DEVICE:-cuda}
python=${PYTHON:-python3}
for tag in false true again; do
  offload=$([[ $tag == true ]] && echo true || echo false)
  cat > "$work/offload_$tag.toml" <<TOML
[model]
preset = "$preset"
init_seed = 0
[data]
source = "builtin"
tokenizer = "byte"
builtin_bytes = 4000000
seq_len = $seq
batch_size = $batch
cache_dir = "$work/data"
[optimizer]
name = "hybrid_adam"
lr = 3e-4
weight_decay = 0.1
[plugin]
name = "low_level_zero"
stage = 2
precision = "bf16"
max_norm = $max_norm
cpu_offload = $offload
[train]
steps = $steps
seed = 42
log_every = 1
eval_every = 0
eval_batches = 0
save = false
tensorboard = false
sample_tokens = 0
output_dir = "$work/run_$tag"
TOML
  rm -rf "$work/run_$tag"
  "$bin" train "$work/offload_$tag.toml" > "$work/offload_$tag.log" 2>&1 \
    || { echo "colossus train (cpu_offload = $offload) failed:"; tail -15 "$work/offload_$tag.log"; exit 1; }
done
$python - "$work" "$preset" "$seq" "$batch" "$steps" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
  "$([[ $device == cuda ]] && nvidia-smi --query-gpu=name --format=csv,noheader | head -1 || echo cpu)" "$max_norm" <<'PY' | tee "$out/zero_offload.md"
import json, sys, datetime
work, preset, seq, batch, steps, commit, machine, max_norm = sys.argv[1:9]
def run(tag):
    rows = [json.loads(l) for l in open(f"{work}/run_{tag}/metrics.jsonl") if '"loss"' in l and '"tokens_per_s"' in l]
    return [r["loss"] for r in rows], [r["tokens_per_s"] for r in rows[2:]] or [r["tokens_per_s"] for r in rows]
plain_loss, plain_rate = run("false")
off_loss, off_rate = run("true")
again_loss, _ = run("again")
worst = max(abs(a - b) / abs(b) for a, b in zip(off_loss, plain_loss))
noise = max(abs(a - b) / abs(b) for a, b in zip(again_loss, plain_loss))
p, o = sum(plain_rate) / len(plain_rate), sum(off_rate) / len(off_rate)
config = f"{preset}, bf16, HybridAdam, max_norm {max_norm}, batch {batch} x {seq}, {steps} steps"
print("| bench | config | metric | colossus (cpu_offload) | peer (ZeRO-2 on the GPU) | ratio |")
print("|---|---|---|---|---|---|")
print(f"| zero2_cpu_offload | {config} | tokens_per_s | {o:.0f} | {p:.0f} | {o / p:.3f} |")
print(f"| zero2_cpu_offload | {config} | max rel loss diff over {len(off_loss)} steps | {worst:.2e} | "
      f"{noise:.2e} (the plain run repeated: the GPU's run-to-run noise) | |")
date = datetime.date.today().isoformat()
with open(f"{work}/zero_offload.jsonl", "w") as f:
    f.write(json.dumps(dict(date=date, commit=commit, machine=machine, bench="zero2_cpu_offload", config=config,
                            metric="tokens_per_s", value=o, peer="zero2 on the device", peer_value=p, ratio=o / p)) + "\n")
    f.write(json.dumps(dict(date=date, commit=commit, machine=machine, bench="zero2_cpu_offload", config=config,
                            metric="max_rel_loss_diff", value=worst, peer="zero2 on the device, repeated",
                            peer_value=noise, ratio=None)) + "\n")
PY
cp "$work/zero_offload.jsonl" "$out/" 2>/dev/null || true
