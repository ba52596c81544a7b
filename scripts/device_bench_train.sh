#!/usr/bin/env bash
# One device call for the GPU training benchmark (issue 3's acceptance): builds
# bench_train_gpt2 against the image's torch (scripts/device_build.sh, which
# also runs `colossus check`), then runs it: Colossus trains gpt2-124m in bf16
# and the PyTorch peers (bench/bench_train_gpt2.py) train the same model on the
# same init and batches. The table comes last; logs and the results JSON go
# to $OUT. Needs .devdeps carried (scripts/pack_device_deps.sh).
# Usage (device): bash scripts/device_bench_train.sh [bench_train_gpt2 flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
  --format=csv > "$out/nvidia-smi.csv" 2>&1 || true
# Tests are not needed here; configuring without them also skips GTest.
if ! COLOSSUS_TESTS=OFF bash scripts/device_build.sh bench_train_gpt2; then
  # Others' work in progress in the tree may break targets we do not need:
  # fall back to building only the benchmark.
  echo "device_build.sh failed; building bench_train_gpt2 alone"
  start=$(date +%s)
  ninja -C build-gpu -j "$(nproc)" bench_train_gpt2 > "$out/build_bench.log" 2>&1 \
    || { grep -E -A12 "error|FAILED" "$out/build_bench.log" | head -60; exit 1; }
  echo "build (bench alone): $(( $(date +%s) - start )) s"
fi
start=$(date +%s)
build-gpu/bin/bench_train_gpt2 --python python3 --workdir /tmp/bench_train_gpt2 \
  --json "$out/bench_train_gpt2.json" "$@" 2>&1 | tee "$out/bench_train_gpt2.log"
rc=${PIPESTATUS[0]}
echo "bench: $(( $(date +%s) - start )) s, exit $rc"
exit "$rc"
