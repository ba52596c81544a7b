#!/usr/bin/env bash
# Issue 9's device call: configures against the image's torch (sm_90, tests
# on), builds the CLI, the training benchmark and the test binaries that hold
# CUDA tests, runs `colossus check` (every kernel's self-test against its
# reference) and the CUDA tests (they must pass, not skip), then trains each
# workload with Colossus, HF eager and HF torch.compile in the same call
# (bench_train_gpt2: same init, batches, dtype and optimizer) and prints one
# summary table last. Logs and each workload's JSON go to $OUT.
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
for spec in "models_test:LinearCrossEntropy.Cuda*:FusedLayers.Cuda*" "amp_test:MixedPrecision.FusedCuda*" "moe_test:MoeDispatchCuda.*"; do
  bin=build-gpu/bin/${spec%%:*}
  "$bin" --gtest_color=no --gtest_filter="${spec#*:}" > "$out/${spec%%:*}.log" 2>&1 || test_rc=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rel_norm|Expected" "$out/${spec%%:*}.log" | head -20
  grep -q "SKIPPED" "$out/${spec%%:*}.log" && { echo "${spec}: skipped on the GPU"; test_rc=1; }
done

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
