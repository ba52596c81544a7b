#!/usr/bin/env bash
# One device call for issue 4's H200 table: builds bench_gemini_capacity
# against the image's torch (sm_90, no tests), then runs it: plain bf16 AdamW,
# Gemini static full optimizer offload and Gemini auto train llama-1b-like
# from the same weights (first-step losses compared, tokens/s), and the largest
# LLaMA-7B-shaped model each trains (3 steps, finite loss), each try in its own
# process. The RESULTS.md section and JSONL rows go to $OUT.
# Needs .devdeps carried (scripts/pack_device_deps.sh); COLOSSUS_COMMIT labels rows.
# Usage (device): bash scripts/device_gemini_capacity.sh [bench_gemini_capacity flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
free -g | head -2
stamp "configure"
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=${COLOSSUS_TESTS:-OFF} > "$out/configure.log" 2>&1 \
  || { tail -60 "$out/configure.log"; exit 1; }
stamp "build"
if ! ninja -C build-gpu -k 0 -j "$(nproc)" bench_gemini_capacity > "$out/gemini_build.log" 2>&1; then
  grep -E -B3 -A25 "error|FAILED" "$out/gemini_build.log" | head -200
  exit 1
fi
stamp "bench_gemini_capacity"
commit_flag=()
[[ -n "${COLOSSUS_COMMIT:-}" ]] && commit_flag=(--commit "$COLOSSUS_COMMIT")
build-gpu/bin/bench_gemini_capacity "${commit_flag[@]}" "$@" 2>&1 | tee "$out/bench_gemini_capacity.log"
rc=${PIPESTATUS[0]}
sed -n '/^## gemini_capacity/,$p' bench/RESULTS.md > "$out/gemini_RESULTS.md"
grep '"bench":"gemini_capacity"' bench/results.jsonl > "$out/gemini_results.jsonl" || true
stamp "done: bench exit $rc"
exit "$rc"
