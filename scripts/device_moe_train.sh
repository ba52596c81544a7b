#!/usr/bin/env bash
# Issue 25's GPU table, in parts that each fit one device call on one warm
# machine (the build stays in build-gpu between calls):
#   layer           transformers' Qwen3MoeSparseMoeBlock (eager loop and
#                   grouped_mm) against our MoE layer at the Mixtral-8x7B,
#                   DeepSeek-V2-Lite and Qwen3-30B-A3B expert shapes
#                   (scripts/device_moe.sh: bench/moe_layer_peer.py, then
#                   bench_moe_layer --peer).
#   MODEL:B:T       bench_train_gpt2 on a preset: Colossus trains it (bf16,
#                   fp32 masters, HybridAdam; the grouped-GEMM experts) and
#                   transformers trains the same weights on the same batches
#                   in the same call, eager (its default grouped_mm experts)
#                   and under torch.compile; the first losses must agree.
#                   The presets qwen3_moe-a3b-layer and deepseek_v2_lite-layer
#                   are one decoder layer of Qwen3-30B-A3B / DeepSeek-V2-Lite
#                   over a 2048-token vocabulary (the block dominates, and the
#                   phase marks give its forward+backward); qwen3_moe-small is
#                   a whole 0.9B-parameter (0.2B active) Qwen3-MoE.
# Each bench_train_gpt2 JSON becomes a RESULTS.md section and results.jsonl
# rows under $OUT (scripts/bench_train_rows.py), for copying into bench/.
# Needs .devdeps carried (scripts/pack_device_deps.sh). COLOSSUS_COMMIT labels rows.
# Usage (device): bash scripts/device_moe_train.sh [layer] [MODEL:B:T ...]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
commit=${COLOSSUS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
machine="1x $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'

stamp "configure + build (kept in build-gpu between calls)"
# utf8proc and Oniguruma from .devdeps where the image has none (as device_build.sh).
for lib in libutf8proc oniguruma; do
  pkg-config --exists "$lib" 2>/dev/null || export PKG_CONFIG_PATH="$PWD/.devdeps/$lib/lib/pkgconfig:${PKG_CONFIG_PATH:-}"
done
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=OFF > "$out/configure.log" 2>&1 \
  || { tail -40 "$out/configure.log"; exit 1; }
if ! ninja -C build-gpu -k 0 -j "$(nproc)" bench_moe_layer bench_train_gpt2 > "$out/build.log" 2>&1; then
  grep -E -A12 "error|FAILED" "$out/build.log" | head -80
  exit 1
fi

rc=0
jsons=()
for part in "$@"; do
  if [[ $part == layer ]]; then
    stamp "MoE layer against transformers' Qwen3MoeSparseMoeBlock"
    BUILD_DIR=build-gpu COLOSSUS_COMMIT=$commit bash scripts/device_moe.sh || rc=1
    continue
  fi
  IFS=: read -r model batch seq <<< "$part"
  stamp "train $model B=$batch T=$seq: colossus, HF eager, HF torch.compile"
  json="$out/moe_train_${model}.json"
  build-gpu/bin/bench_train_gpt2 --model "$model" --batch "$batch" --seq "$seq" --steps 12 --warmup 4 \
    --check-steps 4 --phase-steps 3 --cuda-graph off --peers eager-amp,compile-amp --peer-timeout 240 \
    --python python3 --workdir "/tmp/bench_moe_$model" --json "$json" > "$out/moe_train_${model}.log" 2>&1
  bench_rc=$?
  echo "bench exit $bench_rc"
  [[ $bench_rc -eq 0 ]] || { rc=1; tail -30 "$out/moe_train_${model}.log"; continue; }
  grep -E "warm-up took|max relative difference|^\|" "$out/moe_train_${model}.log"
  sed -n '/where a colossus step goes/,/^$/p' "$out/moe_train_${model}.log"
  jsons+=("$json")
done
if [[ ${#jsons[@]} -gt 0 ]]; then
  python3 scripts/bench_train_rows.py --bench moe_train --commit "$commit" --machine "$machine" \
    --title "issue 25: MoE blocks and a small MoE model, same weights and batches as transformers" \
    --command "bash scripts/device_moe_train.sh $*" --md "$out/moe_train_RESULTS.md" \
    --jsonl "$out/moe_train_results.jsonl" "${jsons[@]}" > /dev/null
fi
stamp "done: exit $rc"
exit "$rc"
