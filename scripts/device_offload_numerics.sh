#!/usr/bin/env bash
# Gemini with the optimizer offloaded to the CPU against DDP on the GPU, fp32
# (issue 27, point 1). It differed by 2e-4..5e-4 over 50 steps with clipping
# (every other layout <= 2.3e-7), for adamw and hybrid_adam alike, so not the
# update's arithmetic: the clip factor's norm was taken by ATen's fp32 CPU
# reduction (1e-5 relative off at 1M elements), where the device run's is a
# GPU tree reduction; amp::vector_norm now reduces CPU tensors in rows
# combined in fp64. Without clipping adamw still differs: its host update is
# ATen's CPU lerp_/addcmul_/addcdiv_, whose CUDA kernels contract to FMAs.
# Trains a small GPT-2 50 steps, fp32, DDP vs Gemini static for each case;
# prints a table; exits 1 when a hybrid_adam case (CPU and CUDA updates
# bit-identical) leaves DDP's curve by more than 1e-5.
# CASES="opt:max_norm:frac ..." picks other cases (frac 0: Gemini without offload).
# Usage (device): bash scripts/device_offload_numerics.sh   (needs .devdeps carried)
#   CPU dry run of the configs: COLOSSUS_BIN=build/bin/colossus STEPS=2 bash scripts/device_offload_numerics.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work=/tmp/offload_numerics
mkdir -p "$work"
if [[ -z ${COLOSSUS_BIN:-} ]]; then
  OUT="$work" COLOSSUS_TESTS=OFF bash scripts/device_build.sh > "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
  grep -E "^build:" "$work/build.log"
fi
bin=${COLOSSUS_BIN:-build-gpu/bin/colossus}
steps=${STEPS:-50}
cat > "$work/gpt2.toml" <<TOML
[model]
preset = "gpt2-tiny"
init_seed = 0
[model.config]
n_embd = 128
n_head = 8
n_layer = 4
n_positions = 128
[data]
source = "builtin"
tokenizer = "byte"
builtin_bytes = 400000
seq_len = 128
batch_size = 16
cache_dir = "$work/data"
[optimizer]
lr = 1e-3
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
[lr_scheduler]
name = "cosine"
warmup_steps = 5
min_lr_ratio = 0.1
[train]
steps = $steps
seed = 42
log_every = 1
eval_every = 0
eval_batches = 0
save_every = 0
tensorboard = false
sample_tokens = 0
TOML
# Cases: optimizer:max_norm:offload_optim_frac (a frac of 0 is Gemini without offload).
cases=(${CASES:-hybrid_adam:1.0:1.0 hybrid_adam:0:1.0 adamw:1.0:1.0 adamw:1.0:0})
for case in "${cases[@]}"; do
  IFS=: read -r opt clip frac <<< "$case"
  for layout in ddp gemini; do
    args=(--plugin.name=ddp --booster.max_norm=$clip)
    [[ $layout == gemini ]] && args=(--plugin.name=gemini --plugin.placement_policy=static
                                     --plugin.offload_optim_frac=$frac --plugin.precision=fp32 --plugin.max_norm=$clip)
    "$bin" train "$work/gpt2.toml" --optimizer.name=$opt "${args[@]}" \
      --train.output_dir="$work/${case//:/_}_$layout" > "$work/${case//:/_}_$layout.log" 2>&1
    echo "$case $layout: exit $?"
  done
done
python3 - "$work" "${cases[@]}" <<'PY'
import json, sys
w = sys.argv[1]
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if r.get("loss") is not None]
failed = []
print("| optimizer | max_norm | offload_optim_frac | max rel loss diff, Gemini vs DDP (fp32) | at step |")
print("|---|---|---|---|---|")
for case in sys.argv[2:]:
    opt, clip, frac = case.split(":")
    tag = case.replace(":", "_")
    try:
        a, b = losses(f"{w}/{tag}_ddp/metrics.jsonl"), losses(f"{w}/{tag}_gemini/metrics.jsonl")
    except OSError as e:
        print(f"| {opt} | {clip} | {frac} | missing ({e}) | |"); continue
    rel = [abs(x - y) / abs(x) for x, y in zip(a, b)]
    if len(a) != len(b) or not rel:
        print(f"| {opt} | {clip} | {frac} | {len(a)} vs {len(b)} losses | |"); failed.append(case); continue
    i = max(range(len(rel)), key=rel.__getitem__)
    # hybrid_adam's CPU and CUDA updates are bit-identical, so the offloaded
    # curve must follow DDP's to reduction order (issue 27: 1e-5 over 50
    # steps). adamw's host update is ATen's CPU ops, which round unlike its
    # CUDA kernels: reported, not bounded.
    bound = 1e-5 if opt == "hybrid_adam" else None
    verdict = "" if bound is None else (" PASS" if rel[i] <= bound else " **FAIL**")
    if bound is not None and rel[i] > bound: failed.append(case)
    print(f"| {opt} | {clip} | {frac} | {rel[i]:.2e}{verdict} | {i + 1} |")
if failed:
    print("FAILED:", " ".join(failed)); sys.exit(1)
PY
