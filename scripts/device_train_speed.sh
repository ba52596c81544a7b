#!/usr/bin/env bash
# Issue 9's device call: configures against the image's torch (sm_90, tests
# on), builds the CLI, the training benchmark and the test binaries that hold
# CUDA tests, runs `colossus check` (every kernel's self-test against its
# reference) and the CUDA tests (they must pass, not skip), then trains each
# workload with Colossus, HF eager and HF torch.compile in the same call
# (bench_train_gpt2: same init, batches, dtype and optimizer) and prints one
# summary table last. Logs and each workload's JSON go to $OUT. Before the
# benchmarks, `colossus train` runs gpt2-124m 40 steps with and without
# train.cuda_graph and compares the two loss curves (the product path of the
# captured step).
# Needs .devdeps carried (scripts/pack_device_deps.sh). COLOSSUS_COMMIT labels rows.
# Usage (device): bash scripts/device_train_speed.sh [model:batch:seq ...]
#   default: gpt2-124m:16:1024 gpt2-124m:32:1024 llama-1b-like:8:2048
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
workloads=("$@")
[[ ${#workloads[@]} -eq 0 ]] && workloads=(gpt2-124m:16:1024 gpt2-124m:32:1024 llama-1b-like:8:2048)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
  --format=csv > "$out/nvidia-smi.csv" 2>&1 || true

stamp "configure + build"
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=ON > "$out/configure.log" 2>&1 \
  || { tail -40 "$out/configure.log"; exit 1; }
if ! ninja -C build-gpu -k 0 -j "$(nproc)" colossus_cli bench_train_gpt2 models_test amp_test moe_test > "$out/build.log" 2>&1; then
  grep -E -A12 "error|FAILED" "$out/build.log" | head -80
  [[ -x build-gpu/bin/bench_train_gpt2 ]] || exit 1
fi
stamp "colossus check"
check_rc=0
build-gpu/bin/colossus check > "$out/check.txt" 2>&1 || check_rc=$?
grep -E "FAIL|cross_entropy|adam|rms_norm|layer_norm|rope|swiglu|moe_permute" "$out/check.txt"
stamp "CUDA tests"
test_rc=0
for spec in "models_test:LinearCrossEntropy.Cuda*:FusedLayers.Cuda*" "amp_test:MixedPrecision.FusedCuda*:GraphedTrainStep.*" "moe_test:MoeDispatchCuda.*"; do
  bin=build-gpu/bin/${spec%%:*}
  "$bin" --gtest_color=no --gtest_filter="${spec#*:}" > "$out/${spec%%:*}.log" 2>&1 || test_rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rel_norm|Expected" "$out/${spec%%:*}.log" | head -20
  grep -q "SKIPPED" "$out/${spec%%:*}.log" && { echo "${spec}: skipped on the GPU"; test_rc=1; }
done

stamp "colossus train: eager step vs train.cuda_graph"
for graph in false true; do
  build-gpu/bin/colossus train examples/configs/gpt2_demo.toml --model.config.n_embd=768 --model.config.n_layer=12 \
    --model.config.n_head=12 --model.config.n_positions=1024 --data.seq_len=1024 --data.batch_size=16 \
    --data.builtin_bytes=4000000 --booster.mixed_precision=bf16 --booster.max_norm=0 --optimizer.name=hybrid_adam \
    --optimizer.lr=6e-4 --lr_scheduler.warmup_steps=10 --lr_scheduler.total_steps=40 --train.steps=40 \
    --train.log_every=10 --train.eval_every=0 --train.save_every=0 --train.sample_tokens=0 --train.tensorboard=false \
    --train.cuda_graph=$graph --train.output_dir=/tmp/train_graph_$graph > "/tmp/train_graph_$graph.log" 2>&1
  echo "train.cuda_graph=$graph: exit $?"
  tail -2 "/tmp/train_graph_$graph.log"
done
python3 - /tmp/train_graph_false/metrics.jsonl /tmp/train_graph_true/metrics.jsonl <<'PY' | tee "$out/train_graph.md"
import json, sys
def rows(p):
    return {r["step"]: r for r in map(json.loads, open(p)) if r.get("loss") is not None}
try:
    a, b = rows(sys.argv[1]), rows(sys.argv[2])
except OSError as e:
    print(f"train.cuda_graph comparison: missing metrics ({e})"); sys.exit(0)
print("| step | loss, eager step | loss, CUDA graph | rel diff | tok/s eager | tok/s graph |")
print("|---|---|---|---|---|---|")
worst = 0.0
for s in sorted(set(a) & set(b)):
    rel = abs(a[s]["loss"] - b[s]["loss"]) / abs(a[s]["loss"]); worst = max(worst, rel)
    print(f"| {s} | {a[s]['loss']:.5f} | {b[s]['loss']:.5f} | {rel:.1e} | {a[s].get('tokens_per_s', 0):.0f} | {b[s].get('tokens_per_s', 0):.0f} |")
print(f"train.cuda_graph loss curve vs eager: max rel diff {worst:.2e}: {'PASS' if worst <= 1e-2 else 'FAIL'} (<= 1e-2)")
PY

commit_flag=()
summary=()
for w in "${workloads[@]}"; do
  IFS=: read -r model batch seq <<< "$w"
  stamp "bench $model B=$batch T=$seq"
  json="$out/train_${model}_b${batch}.json"
  build-gpu/bin/bench_train_gpt2 --model "$model" --batch "$batch" --seq "$seq" --steps 20 --warmup 6 \
    --phase-steps 3 --profile-steps 2 --peers compile-amp,eager-amp --python python3 \
    --workdir "/tmp/bench_train_$model" --json "$json" > "$out/train_${model}_b${batch}.log" 2>&1
  echo "exit $?"
  sed -n '/device ms per step by kernel category/,/^$/p' "$out/train_${model}_b${batch}.log" | head -16
  grep -E "max relative difference" "$out/train_${model}_b${batch}.log"
  summary+=("$(grep -E '^\| (gpt2|llama)' "$out/train_${model}_b${batch}.log")")
done
stamp "done: colossus check exit $check_rc, CUDA tests exit $test_rc"
printf '%s\n' "${summary[@]}"
[[ $check_rc -eq 0 && $test_rc -eq 0 ]]
