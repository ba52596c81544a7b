#!/usr/bin/env bash
# One device call: `colossus train` end to end on one GPU. Builds the CLI
# against the image's torch (scripts/device_build.sh), trains a GPT-2 124M-size
# model on the built-in corpus in bf16 (fp32 masters, fused HybridAdam, async
# checkpoints) twice (run-to-run spread on the GPU), resumes a third run from
# its step-20 checkpoint and compares the losses, then samples with
# `colossus generate` on the GPU. A crashing run is rerun under cuda-gdb. Needs .devdeps carried (scripts/pack_device_deps.sh).
# Usage (device): bash scripts/device_train_smoke.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
COLOSSUS_TESTS=OFF bash scripts/device_build.sh > "$out/device_build.log" 2>&1 \
  || { tail -60 "$out/device_build.log"; exit 1; }
grep -E "^build:|PASS|FAIL" "$out/device_build.log" | head -20
bin=build-gpu/bin/colossus
model=(--model.config.n_embd=768 --model.config.n_layer=12 --model.config.n_head=12 --model.config.n_positions=1024
       --data.seq_len=1024 --data.batch_size=16 --data.builtin_bytes=8000000 --booster.mixed_precision=bf16
       --optimizer.name=hybrid_adam --optimizer.lr=6e-4 --lr_scheduler.warmup_steps=10 --lr_scheduler.total_steps=60
       --train.log_every=10 --train.eval_every=20 --train.async_save=true --train.sample_tokens=0)
# Runs one training command; on a crash, cuda-gdb (there is no gdb on the
# device image) reruns it in batch mode for a backtrace.
train() {
  local name=$1; shift
  local start=$(date +%s)
  "$bin" train examples/configs/gpt2_demo.toml "${model[@]}" "$@" > "/tmp/train_$name.log" 2>&1
  local rc=$?
  echo "run $name: $(( $(date +%s) - start )) s, exit $rc; $(grep -E '60/60|20/20' "/tmp/train_$name.log" | tail -1)"
  if [ $rc -gt 128 ] && command -v cuda-gdb > /dev/null; then
    cuda-gdb -batch -ex run -ex bt --args "$bin" train examples/configs/gpt2_demo.toml "${model[@]}" "$@" \
      > "/tmp/gdb_$name.log" 2>&1
    grep -E "^#|signal" "/tmp/gdb_$name.log" | head -30
  fi
}
train a --train.output_dir=/tmp/gpu_a --train.steps=60 --train.save_every=20
train b --train.output_dir=/tmp/gpu_b --train.steps=60 --train.save_every=20 --train.async_save=false
train first --train.output_dir=/tmp/gpu_split --train.steps=20
train resumed --train.output_dir=/tmp/gpu_split --train.steps=60 --resume
cp /tmp/gpu_a/metrics.jsonl /tmp/metrics_a.jsonl; cp /tmp/gpu_b/metrics.jsonl /tmp/metrics_b.jsonl
cp /tmp/gpu_split/metrics.jsonl /tmp/metrics_split.jsonl
"$bin" generate /tmp/gpu_a --device cuda --dtype bf16 --prompt "Once upon a time" --max_new_tokens 120 \
  --temperature 0.6 --top_k 20 > "$out/generate.log" 2>&1
echo "generate exit $?"; tail -3 "$out/generate.log"
python3 - /tmp/metrics_a.jsonl /tmp/metrics_b.jsonl /tmp/metrics_split.jsonl <<'PY'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if r.get("loss") is not None}
a, b, split = (losses(p) for p in sys.argv[1:4])
rel = lambda x, y: "" if x is None or y is None else f"{abs(x - y) / abs(y):.1e}"
print("| step | run a (async saves) | run b (sync saves) | a vs b | stopped at 20, resumed | resumed vs a |")
print("|---|---|---|---|---|---|")
for s in sorted(a):
    print(f"| {s} | {a[s]:.5f} | {b.get(s, float('nan')):.5f} | {rel(b.get(s), a[s])} | {split.get(s, float('nan')):.5f} | {rel(split.get(s), a[s])} |")
PY
