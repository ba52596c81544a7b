#!/usr/bin/env bash
# One device call for decode speed (issue 26): builds colossus_cli,
# bench_gemv and bench_inference against the image's torch (sm_90, no
# tests), runs `colossus check` (the decode kernels' self-tests among the
# rest: rope_qkv_cache, gemv, swiglu, paged_attention), bench_gemv (the GEMV
# against cuBLAS on the llama-1b-like decode shapes), then bench_inference
# with the flags given (decode / prefill / mix tables, the batch-1 kernel
# breakdown, the transformers peer). Logs and every RESULTS.md section +
# JSONL rows go to $OUT. Needs .devdeps carried (scripts/pack_device_deps.sh).
# COLOSSUS_COMMIT=<sha> labels the rows (the device copy has no git history).
# Usage (device): bash scripts/device_decode.sh [bench_inference flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
# Seconds left of the call's 600; DECODE_BUDGET_S when other work shares the call.
left() { echo $(( ${DECODE_BUDGET_S:-585} - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$out/nvidia-smi.csv"
python3 -c "import openai, numpy; print('client packages: openai', openai.__version__)" 2>&1 | tail -1
commit_flag=()
[[ -n "${COLOSSUS_COMMIT:-}" ]] && commit_flag=(--commit "$COLOSSUS_COMMIT")
for lib in libutf8proc oniguruma; do
  pkg-config --exists "$lib" 2>/dev/null || export PKG_CONFIG_PATH="$PWD/.devdeps/$lib/lib/pkgconfig:${PKG_CONFIG_PATH:-}"
done

stamp "configure + build"
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCOLOSSUS_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=OFF > "$out/configure.log" 2>&1 \
  || { tail -60 "$out/configure.log"; exit 1; }
if ! ninja -C build-gpu -k 0 -j "$(nproc)" bench_gemv bench_inference colossus_cli > "$out/build.log" 2>&1; then
  echo "=== build failed (full log: build.log) ==="
  grep -E -B3 -A25 "error|FAILED" "$out/build.log" | head -150
  exit 1
fi
stamp "build done"

stamp "colossus check"
timeout 150 build-gpu/bin/colossus check > "$out/check.txt" 2>&1
check_rc=$?
grep -E "FAIL|rope_qkv_cache|gemv|swiglu|paged_attention|reshape_and_cache|activation_checkpoint" "$out/check.txt" | head -30
tail -2 "$out/check.txt"

stamp "bench_gemv"
timeout 90 build-gpu/bin/bench_gemv --no-record --out-dir "$out" "${commit_flag[@]}" > "$out/bench_gemv.log" 2>&1
gemv_rc=$?
cat "$out/bench_gemv.log" | tail -30

stamp "bench_inference ($(left) s left)"
timeout $(left) build-gpu/bin/bench_inference --python python3 --workdir /tmp/bench_inference --out-dir "$out" \
  --no-record --peer-timeout $(( $(left) - 60 )) "${commit_flag[@]}" "$@" > "$out/bench_inference.log" 2>&1
inf_rc=$?
stamp "done: check exit $check_rc, bench_gemv exit $gemv_rc, bench_inference exit $inf_rc"
grep -v "^\[bench_inference.py\]" "$out/bench_inference.log" | tail -70
[[ $check_rc -eq 0 && $gemv_rc -eq 0 && $inf_rc -eq 0 ]]
