#!/usr/bin/env bash
# One device call for sequence parallelism on the GPU: configures and builds
# bench_ring_attention and test_sequence_parallel against the image's torch
# (as scripts/device_paged_attention.sh does, sm_90), runs the single-rank
# ring-attention tests (RingAttention.RunsOnCudaTensors: ring attention and
# its blockwise path on CUDA tensors, fp32 and bf16, against the fp64 CPU
# reference; then the other one-rank ring-attention tests on host tensors), then
# the benchmark: the ring-attention blockwise path (sp simulated on one GPU,
# zig-zag) against SDPA full attention, bf16, causal. Logs and the
# benchmark's RESULTS.md section + JSONL rows go to $OUT.
# Needs .devdeps carried (scripts/pack_device_deps.sh). COLOSSUS_COMMIT=<sha>
# labels the benchmark rows (the device copy has no git history).
# Usage (device): bash scripts/device_ring_attention.sh [bench_ring_attention flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
  --format=csv 2>&1 | tee "$out/nvidia-smi.csv"

stamp "configure"
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
targets=(bench_ring_attention test_sequence_parallel)
configure() {
  cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS="$1" > "$out/configure.log" 2>&1
}
if ! configure ON; then
  # Without GoogleTest on the image: the benchmark alone.
  echo "=== configure with tests failed (last lines below); configuring without tests ==="
  tail -20 "$out/configure.log"
  configure OFF || { tail -60 "$out/configure.log"; exit 1; }
  targets=(bench_ring_attention)
fi
stamp "build ${targets[*]}"
# -k 0: every failing file in one call.
if ! ninja -C build-gpu -k 0 -j "$(nproc)" "${targets[@]}" > "$out/build.log" 2>&1; then
  echo "=== build failed; errors (full log: build.log) ==="
  grep -E -B3 -A25 "error|FAILED" "$out/build.log" | head -200
  [[ -x build-gpu/bin/bench_ring_attention ]] || exit 1
  echo "=== the benchmark was built; going on without what failed ==="
fi
stamp "build done"

test_rc=1
test_bin=$(find build-gpu -name test_sequence_parallel -type f -perm -u+x | head -1)
if [[ -n "$test_bin" ]]; then
  # One MPI rank, as CTest starts them. The CUDA test must pass, not skip.
  stamp "RingAttention.RunsOnCudaTensors (ring attention and its blockwise path on CUDA tensors)"
  bash scripts/mpirun_test.sh 1 "$test_bin" --gtest_color=no --gtest_filter='RingAttention.RunsOnCudaTensors' 2>&1 \
    | tee "$out/test_cuda.log"
  if [[ ${PIPESTATUS[0]} -eq 0 ]] && grep -q "PASSED  \] 1 test" "$out/test_cuda.log" \
      && ! grep -q "SKIPPED" "$out/test_cuda.log"; then
    test_rc=0
  else
    echo "RingAttention.RunsOnCudaTensors did not pass on CUDA (skipped or failed)"
  fi
  stamp "the other one-rank ring-attention and layout tests (host tensors)"
  bash scripts/mpirun_test.sh 1 "$test_bin" --gtest_color=no --gtest_brief=1 \
    --gtest_filter='RingAttention.*:SequenceLayout.*:-RingAttention.RunsOnCudaTensors' 2>&1 \
    | tee "$out/test_sequence_parallel.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || test_rc=1
else
  echo "test_sequence_parallel was not built"
fi

stamp "bench_ring_attention"
commit_flag=()
[[ -n "${COLOSSUS_COMMIT:-}" ]] && commit_flag=(--commit "$COLOSSUS_COMMIT")
build-gpu/bin/bench_ring_attention --out-dir "$out" "${commit_flag[@]}" "$@" 2>&1 | tee "$out/bench_ring_attention.log"
bench_rc=${PIPESTATUS[0]}
stamp "done: tests exit $test_rc, bench exit $bench_rc"
[[ $test_rc -eq 0 && $bench_rc -eq 0 ]]
