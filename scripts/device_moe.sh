#!/usr/bin/env bash
# One device call for issue 7's MoE layer benchmark: configures and builds
# bench_moe_layer against the image's torch (as scripts/device_paged_attention.sh:
# sm_90, no tests), then runs it: the Mixtral-style layer (router, sorted
# dispatch, grouped-GEMM experts, combine) against the per-expert loop and a
# naive transformers-style loop, forward and forward+backward, bf16. The bench
# fails if the three disagree. Logs and the RESULTS.md section + JSONL rows go
# to $OUT. Needs .devdeps carried (scripts/pack_device_deps.sh).
# COLOSSUS_COMMIT=<sha> labels the rows (the device copy has no git history).
# Usage (device): bash scripts/device_moe.sh [bench_moe_layer flags...]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0
out=${OUT:-/tmp/colossus-out}
# BUILD_DIR: reuse a configured build of this call (e.g. device_cuda_archs.sh's build-ptx).
build=${BUILD_DIR:-build-gpu}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp "configure"
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B ${build} -G Ninja -DCOLOSSUS_CUDA=ON -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=OFF > "$out/configure.log" 2>&1 \
  || { tail -60 "$out/configure.log"; exit 1; }
stamp "build"
if ! ninja -C ${build} -k 0 -j "$(nproc)" bench_moe_layer > "$out/moe_build.log" 2>&1; then
  echo "=== build failed (full log: moe_build.log) ==="
  grep -E -B3 -A25 "error|FAILED" "$out/moe_build.log" | head -200
  exit 1
fi
stamp "bench_moe_layer"
commit_flag=()
[[ -n "${COLOSSUS_COMMIT:-}" ]] && commit_flag=(--commit "$COLOSSUS_COMMIT")
# The peer first: transformers' own block at the same shapes, same call.
peer_flag=()
stamp "moe_layer_peer.py (transformers)"
quick=(); [[ " $* " == *" --quick "* ]] && quick=(--quick)
if python3 bench/moe_layer_peer.py "${quick[@]}" > "$out/moe_peer.json" 2> "$out/moe_peer.log"; then
  peer_flag=(--peer "$out/moe_peer.json")
  cat "$out/moe_peer.log"
else
  echo "moe_layer_peer.py failed:"; tail -20 "$out/moe_peer.log"
fi
${build}/bin/bench_moe_layer "${commit_flag[@]}" "${peer_flag[@]}" "$@" 2>&1 | tee "$out/bench_moe_layer.log"
rc=${PIPESTATUS[0]}
# The section and rows the bench appended, for copying back into the repository.
sed -n '/^## moe_layer/,$p' bench/RESULTS.md > "$out/moe_RESULTS.md"
grep '"bench":"moe_layer"' bench/results.jsonl > "$out/moe_results.jsonl" || true
stamp "done: bench exit $rc"
exit "$rc"
