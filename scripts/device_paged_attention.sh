#!/usr/bin/env bash
# One device call for the paged-attention CUDA kernels: configures and builds
# colossus + bench_paged_attention against the image's torch (as
# scripts/device_build.sh does, sm_90, without the tests), runs `colossus
# check` (the reshape_and_cache/cuda and paged_attention/cuda self-tests
# compare the kernels with the reference; a failure lists every failing case),
# then the decode benchmark. On a failed check it reruns the check under
# compute-sanitizer (memcheck) to name a bad access. Logs, the check JSON and
# the benchmark's RESULTS.md section + JSONL rows go to $OUT.
# Needs .devdeps carried (scripts/pack_device_deps.sh). COLOSSUS_COMMIT=<sha>
# labels the benchmark rows (the device copy has no git history).
# Usage (device): bash scripts/device_paged_attention.sh [bench_paged_attention flags...]
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
cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=OFF > "$out/configure.log" 2>&1 \
  || { tail -60 "$out/configure.log"; exit 1; }
stamp "build"
# -k 0: every failing file in one call.
if ! ninja -C build-gpu -k 0 -j "$(nproc)" colossus_cli bench_paged_attention > "$out/build.log" 2>&1; then
  echo "=== build failed; errors (full log: build.log) ==="
  grep -E -B3 -A25 "error|FAILED" "$out/build.log" | head -200
  [[ -x build-gpu/bin/colossus ]] || exit 1
  echo "=== colossus was built; going on without what failed ==="
fi
stamp "build done"
# Registers, shared memory and spills of the paged-attention kernels.
for obj in $(find build-gpu -name 'paged_*.cu.o'); do
  cuobjdump --dump-resource-usage "$obj" 2>/dev/null | c++filt
done > "$out/paged_attention_resources.txt" 2>&1
echo "resource usage (bf16, head_dim 64/128; all kernels in paged_attention_resources.txt):"
grep -E "Function|REG" "$out/paged_attention_resources.txt" \
  | grep -A1 -E "(decode_kernel<__nv_bfloat16, (64|128), 4>|prefill(_tc)?_kernel<__nv_bfloat16, (64|128)>)" | head -20 || true

stamp "colossus check"
build-gpu/bin/colossus check 2>&1 | tee "$out/check.txt"
check_rc=${PIPESTATUS[0]}
build-gpu/bin/colossus check --json > "$out/check.json" 2>&1 || true
if [[ $check_rc -ne 0 ]] && grep -qE "FAIL +kernel (paged_attention|reshape_and_cache)" "$out/check.txt"; then
  stamp "check failed: rerunning it under compute-sanitizer memcheck (first 10 errors)"
  timeout 240 compute-sanitizer --tool memcheck --print-limit 10 build-gpu/bin/colossus check \
    > "$out/sanitizer.txt" 2>&1
  grep -E -A12 "Invalid|Error|ERROR SUMMARY" "$out/sanitizer.txt" | head -120
fi

if [[ -x build-gpu/bin/bench_paged_attention ]]; then
  stamp "bench_paged_attention"
  commit_flag=()
  [[ -n "${COLOSSUS_COMMIT:-}" ]] && commit_flag=(--commit "$COLOSSUS_COMMIT")
  build-gpu/bin/bench_paged_attention --out-dir "$out" "${commit_flag[@]}" "$@" 2>&1 | tee "$out/bench_paged_attention.log"
  bench_rc=${PIPESTATUS[0]}
else
  echo "bench_paged_attention was not built"
  bench_rc=1
fi
stamp "done: check exit $check_rc, bench exit $bench_rc"
[[ $check_rc -eq 0 && $bench_rc -eq 0 ]]
