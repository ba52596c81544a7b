#!/usr/bin/env bash
# Gemini with the optimizer offloaded to the CPU against DDP on the GPU, fp32
# (issue 27, point 1). It differed by 2e-4..5e-4 over 50 steps with clipping
# (every other layout <= 2.3e-7), for adamw and hybrid_adam alike, so not the
# update's arithmetic: the clip factor's norm was taken by ATen's fp32 CPU
# reduction (1e-5 relative off at 1M elements), where the device run's is a
# GPU tree reduction; amp::vector_norm now reduces CPU tensors in rows
# combined in fp64. Without clipping adamw still differs: its host update is
# ATen's CPU lerp_/addcmul_/addcdiv_, whose CUDA kernels contract to FMAs.
# The drift left without clipping (3.6e-3 by step 47, the same with nothing
# offloaded) was Gemini's loss: logits and a separate cross-entropy where
# DDP fuses the head into the loss, so every gradient differed in the last
# place from step 1 (PROBE=1 showed the moments differing after step 1 and
# a DDP-vs-DDP control at 0). Gemini now ends in the same fused loss, and
# the hybrid_adam runs match DDP bit for bit over 50 steps.
# Trains a small GPT-2 50 steps, fp32, DDP vs Gemini static for each case;
# prints a table; exits 1 when a hybrid_adam case (CPU and CUDA updates
# bit-identical) leaves DDP's curve by more than 1e-5.
# CASES="opt:max_norm:frac[:key=value,...] ..." picks other cases (frac 0:
# Gemini without offload; frac "ddp": a second DDP run, the run-to-run
# control; frac "zero": ZeRO-2 fp32 instead of Gemini; a max_norm of 1e9
# clips never but takes the clipping code path; key=value overrides go to
# both runs, e.g. model.config.tie_word_embeddings=false). DETERMINISTIC=1
# runs every case with train.deterministic (deterministic kernels).
# The table gives the diff at steps 1, 10, 20, 30, 40 beside the worst one:
# rounding differences amplified by the dynamics grow step by step, a
# code-path difference appears at once.
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
  IFS=: read -r opt clip frac extra <<< "$case"
  for layout in ddp gemini; do
    args=(--plugin.name=ddp --booster.max_norm=$clip)
    if [[ $layout == gemini && $frac == zero ]]; then
      args=(--plugin.name=low_level_zero --plugin.stage=2 --plugin.precision=fp32 --booster.max_norm=$clip)
    elif [[ $layout == gemini && $frac != ddp ]]; then
      args=(--plugin.name=gemini --plugin.placement_policy=static
            --plugin.offload_optim_frac=$frac --plugin.precision=fp32 --plugin.max_norm=$clip)
    fi
    [[ -n $extra ]] && for kv in ${extra//,/ }; do args+=("--$kv"); done
    [[ ${DETERMINISTIC:-0} == 1 ]] && args+=(--train.deterministic=true)
    # PROBE=1: a checkpoint every step, kept, for the per-step comparison below.
    [[ ${PROBE:-0} == 1 ]] && args+=(--train.save_every=1 --train.keep_last=0)
    dir="$work/${case//:/_}_$layout"
    rm -rf "$dir"
    "$bin" train "$work/gpt2.toml" --optimizer.name=$opt "${args[@]}" --train.output_dir="$dir" > "$dir.log" 2>&1
    status=$?
    echo "$case $layout: exit $status"
    [[ $status -eq 0 ]] || tail -5 "$dir.log"
  done
done
if [[ ${PROBE:-0} == 1 ]]; then
  # Which step first differs, and where: the parameters and both moments of
  # every checkpoint, DDP's against Gemini's, bit for bit.
  python3 - "$work" "${cases[@]}" <<'PY'
import os, sys
import numpy as np
from safetensors.numpy import load_file
w = sys.argv[1]
for case in sys.argv[2:]:
    tag = case.replace(":", "_")
    root = {side: f"{w}/{tag}_{side}/checkpoints" for side in ("ddp", "gemini")}
    steps = sorted(d for d in os.listdir(root["ddp"]) if d.startswith("step-"))
    print(f"probe {case}: {len(steps)} checkpoints")
    shown = 0
    for d in steps:
        diffs, same = [], []
        for part in ("model/model.safetensors", "optimizer/optimizer.safetensors"):
            a = load_file(f"{root['ddp']}/{d}/{part}")
            b = load_file(f"{root['gemini']}/{d}/{part}")
            for k in sorted(a):
                x, y = a[k], b.get(k)
                if y is None or x.shape != y.shape:
                    diffs.append(f"{k}: missing or shape {x.shape} vs {None if y is None else y.shape}"); continue
                if x.dtype.kind != "f": continue
                bad = np.flatnonzero(x.view(np.uint32 if x.itemsize == 4 else np.uint16)
                                     != y.view(np.uint32 if y.itemsize == 4 else np.uint16))
                if not bad.size: same.append(k)
                if bad.size:
                    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
                    rel = np.abs(flat_x[bad] - flat_y[bad]) / np.maximum(np.abs(flat_x[bad]), 1e-30)
                    diffs.append(f"{k} {x.shape}: {bad.size} of {x.size} differ, max rel {rel.max():.2e}, "
                                 f"first at flat {bad[:4].tolist()} ddp {flat_x[bad[:2]].tolist()} gemini {flat_y[bad[:2]].tolist()}")
        print(f"  {d}: {'identical' if not diffs else str(len(diffs)) + ' tensors differ'}")
        if diffs: print("    bit-identical: " + (" ".join(same) if same else "none"))
        for line in diffs[:int(os.environ.get("PROBE_LINES", "12"))]: print("    " + line)
        if diffs:
            shown += 1
            if shown == 2: break
PY
fi
python3 - "$work" "${cases[@]}" <<'PY'
import json, sys
w = sys.argv[1]
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if r.get("loss") is not None]
failed = []
marks = [1, 10, 20, 30, 40]
print("| optimizer | max_norm | offload_optim_frac | max rel loss diff, Gemini vs DDP (fp32) | at step | at steps "
      + ", ".join(map(str, marks)) + " | DDP loss at 1, 40, 50 |")
print("|---|---|---|---|---|---|---|")
for case in sys.argv[2:]:
    opt, clip, frac = case.split(":")[:3]
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
    bound = 1e-5 if opt == "hybrid_adam" and frac != "ddp" else None
    verdict = "" if bound is None else (" PASS" if rel[i] <= bound else " **FAIL**")
    if bound is not None and rel[i] > bound: failed.append(case)
    trail = ", ".join(f"{rel[m - 1]:.1e}" for m in marks if m <= len(rel))
    ends = ", ".join(f"{a[m - 1]:.4f}" for m in (1, 40, 50) if m <= len(a))
    print(f"| {opt} | {clip} | {frac} | {rel[i]:.2e}{verdict} | {i + 1} | {trail} | {ends} |")
if failed:
    print("FAILED:", " ".join(failed)); sys.exit(1)
PY
