#!/usr/bin/env bash
# One device call: `colossus train` end to end on one GPU. Builds the CLI
# against the image's torch (scripts/device_build.sh), trains a GPT-2 124M-size
# model on the built-in corpus in bf16 (fp32 masters, fused HybridAdam, async
# checkpoints), resumes a second run from its step-20 checkpoint and compares
# the losses with the uninterrupted run, then samples with `colossus generate`
# on the GPU. Needs .devdeps carried (scripts/pack_device_deps.sh).
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
start=$(date +%s)
"$bin" train examples/configs/gpt2_demo.toml "${model[@]}" --train.output_dir=/tmp/gpu_full --train.steps=60 \
  --train.save_every=20 2>&1 | tee "$out/train_full.log"
echo "full run: $(( $(date +%s) - start )) s, exit ${PIPESTATUS[0]}"
"$bin" train examples/configs/gpt2_demo.toml "${model[@]}" --train.output_dir=/tmp/gpu_split --train.steps=20 \
  > "$out/train_first.log" 2>&1
"$bin" train examples/configs/gpt2_demo.toml "${model[@]}" --train.output_dir=/tmp/gpu_split --train.steps=60 \
  --resume 2>&1 | tee "$out/train_resumed.log" | grep -E "resumed|60/60"
cp /tmp/gpu_full/metrics.jsonl "$out/metrics_full.jsonl"; cp /tmp/gpu_split/metrics.jsonl "$out/metrics_split.jsonl"
cp /tmp/gpu_full/loss.svg "$out/loss_gpu.svg" 2>/dev/null
"$bin" generate /tmp/gpu_full --device cuda --dtype bf16 --prompt "Once upon a time" --max_new_tokens 120 \
  --temperature 0.6 --top_k 20 2>&1 | tee "$out/generate.log"
python3 - "$out/metrics_full.jsonl" "$out/metrics_split.jsonl" <<'PY'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if r.get("loss") is not None}
full, split = losses(sys.argv[1]), losses(sys.argv[2])
print("| step | uninterrupted | stopped at 20, resumed | rel diff |")
print("|---|---|---|---|")
for s in sorted(full):
    b = split.get(s)
    print(f"| {s} | {full[s]:.5f} | {b if b is None else round(b, 5)} | {'' if b is None else f'{abs(b - full[s]) / abs(full[s]):.1e}'} |")
PY
