#!/usr/bin/env bash
# A short device call for the decode kernels alone: builds colossus_cli,
# bench_gemv and bench_inference (sm_90, no tests), runs the decode kernels'
# `colossus check` entries, bench_gemv, and bench_inference's batch-1 and
# batch-8 decode with the kernel breakdown (no transformers peer, no
# prefill / mix / throughput parts). Writes each result to $OUT as soon as it
# exists, so a call cut short still returns what ran.
# Usage (device): COLOSSUS_COMMIT=<sha> bash scripts/device_decode_quick.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCH_CUDA_ARCH_LIST=9.0
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
commit_flag=()
[[ -n "${COLOSSUS_COMMIT:-}" ]] && commit_flag=(--commit "$COLOSSUS_COMMIT")
for lib in libutf8proc oniguruma; do
  pkg-config --exists "$lib" 2>/dev/null || export PKG_CONFIG_PATH="$PWD/.devdeps/$lib/lib/pkgconfig:${PKG_CONFIG_PATH:-}"
done
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCOLOSSUS_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=OFF > "$out/configure.log" 2>&1 \
  || { tail -40 "$out/configure.log"; exit 1; }
ninja -C build-gpu -k 0 -j "$(nproc)" bench_gemv bench_inference colossus_cli > "$out/build.log" 2>&1 \
  || { grep -E -A20 "error|FAILED" "$out/build.log" | head -80; exit 1; }
stamp "built"
build-gpu/bin/colossus check > "$out/check.txt" 2>&1
check_rc=$?
grep -E "FAIL|gemv|rope_qkv_cache|swiglu|paged_attention|engine_cuda_graph" "$out/check.txt"
stamp "check exit $check_rc"
timeout 60 build-gpu/bin/bench_gemv --no-record --out-dir "$out" "${commit_flag[@]}" > "$out/bench_gemv.log" 2>&1
gemv_rc=$?
grep "^|" "$out/bench_gemv.log"
stamp "bench_gemv exit $gemv_rc"
timeout 120 build-gpu/bin/bench_inference --no-python --no-record --out-dir "$out" --decode-batches 8 --prefill-lens "" \
  --mix-requests 0 --requests 32 "${commit_flag[@]}" > "$out/bench_inference.log" 2>&1
inf_rc=$?
grep -E "^colossus|^\| |all kernels" "$out/bench_inference.log" | head -40
stamp "bench_inference exit $inf_rc"
[[ $check_rc -eq 0 && $gemv_rc -eq 0 && $inf_rc -eq 0 ]]
