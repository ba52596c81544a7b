#!/usr/bin/env bash
# One device call for issue 8's inference benchmark: configures and builds
# colossus_cli, bench_paged_attention and bench_inference against the image's
# torch (as scripts/device_paged_attention.sh: sm_90, no tests), runs
# `colossus check` (the paged-attention kernel self-tests among them; a failing
# kernel check is rerun under compute-sanitizer, time permitting),
# bench_paged_attention (only when the build left time for it), then
# bench_inference (llama-1b-like bf16: batch-1 decode against the HBM roofline
# and transformers' generate, batch-8/32/128 decode against the roofline,
# 512- and 2048-token prefill against the FLOP floor, 256 mixed requests
# against transformers, a 1000-request ShareGPT-shaped mix with prefix caching
# on and off, the kernels of a batch-1 decode step; the peer is
# bench/bench_inference.py run by the bench, which cuts its timeout to the
# time left: --time-limit). Logs, the check output and
# both benchmarks' RESULTS.md sections + JSONL rows go to $OUT; the inference
# table is printed last. Needs .devdeps carried (scripts/pack_device_deps.sh).
# COLOSSUS_COMMIT=<sha> labels the rows (the device copy has no git history).
# Usage (device): bash scripts/device_inference.sh [bench_inference flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
# Seconds left of the call's 600 (10 s kept for the copy-back).
left() { echo $(( 590 - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
  --format=csv 2>&1 | tee "$out/nvidia-smi.csv"
commit_flag=()
[[ -n "${COLOSSUS_COMMIT:-}" ]] && commit_flag=(--commit "$COLOSSUS_COMMIT")

stamp "configure"
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=OFF > "$out/configure.log" 2>&1 \
  || { tail -60 "$out/configure.log"; exit 1; }
stamp "build"
# -k 0: every failing file in one call; the benches first in the list of targets.
if ! ninja -C build-gpu -k 0 -j "$(nproc)" bench_inference bench_paged_attention colossus_cli > "$out/build.log" 2>&1; then
  echo "=== build failed; errors (full log: build.log) ==="
  grep -E -B3 -A25 "error|FAILED" "$out/build.log" | head -200
  [[ -x build-gpu/bin/bench_inference ]] || exit 1
  echo "=== bench_inference was built; going on without what failed ==="
fi
stamp "build done"

check_rc=0
if [[ -x build-gpu/bin/colossus ]]; then
  stamp "colossus check"
  timeout 120 build-gpu/bin/colossus check > "$out/check.txt" 2>&1
  check_rc=$?
  grep -E "FAIL|paged_attention|reshape_and_cache" "$out/check.txt" | head -30
  tail -3 "$out/check.txt"
  if [[ $check_rc -ne 0 ]] && grep -qE "FAIL +kernel (paged_attention|reshape_and_cache)" "$out/check.txt" \
     && (( $(left) > 420 )); then
    stamp "check failed: rerunning it under compute-sanitizer memcheck (first 10 errors)"
    timeout 150 compute-sanitizer --tool memcheck --print-limit 10 build-gpu/bin/colossus check \
      > "$out/sanitizer.txt" 2>&1
    grep -E -A12 "Invalid|Error|ERROR SUMMARY" "$out/sanitizer.txt" | head -80
  fi
else
  echo "colossus was not built: no check"
  check_rc=1
fi

# The call has 600 s in all: bench_inference needs ~200-330 s (100-150 s of it
# the transformers peer), so the kernel bench runs only when the build left
# more than that, and bench_inference cuts the peer's timeout to what is left
# of --time-limit (our rows are still written without it).
pa_rc=0
if [[ ! -x build-gpu/bin/bench_paged_attention ]]; then
  echo "bench_paged_attention was not built"
  pa_rc=1
elif (( $(left) < 400 )); then
  echo "bench_paged_attention skipped: $(left) s left, bench_inference first (not a failure)"
else
  stamp "bench_paged_attention"
  timeout $(( $(left) - 340 )) build-gpu/bin/bench_paged_attention --out-dir "$out" "${commit_flag[@]}" \
    --batches 1,64,256 --contexts 512,4096 --iters 20 > "$out/bench_paged_attention.log" 2>&1
  pa_rc=$?
  grep -E "^\|" "$out/bench_paged_attention.log" | head -30
fi

stamp "bench_inference ($(left) s left)"
timeout $(left) build-gpu/bin/bench_inference --python python3 --workdir /tmp/bench_inference --out-dir "$out" \
  --time-limit $(( $(left) - 10 )) "${commit_flag[@]}" "$@" > "$out/bench_inference.log" 2>&1
inf_rc=$?
# No table and time left: rerun without the CUDA-graph runs (the engine's
# newest path), so the eager numbers and the peer still come back.
if [[ $inf_rc -ne 0 && $inf_rc -ne 124 ]] && ! grep -q "^| workload" "$out/bench_inference.log" && (( $(left) > 150 )); then
  stamp "bench_inference exit $inf_rc without a table; rerunning with --cuda-graph off"
  mv "$out/bench_inference.log" "$out/bench_inference_failed.log"
  tail -20 "$out/bench_inference_failed.log"
  timeout $(left) build-gpu/bin/bench_inference --python python3 --workdir /tmp/bench_inference --out-dir "$out" \
    --time-limit $(( $(left) - 10 )) --cuda-graph off "${commit_flag[@]}" "$@" > "$out/bench_inference.log" 2>&1
  inf_rc=$?
fi
stamp "done: check exit $check_rc, bench_paged_attention exit $pa_rc, bench_inference exit $inf_rc"
echo "=== bench_inference (full log: bench_inference.log) ==="
grep -v "^\[bench_inference.py\]" "$out/bench_inference.log" | tail -80
[[ $check_rc -eq 0 && $pa_rc -eq 0 && $inf_rc -eq 0 ]]
