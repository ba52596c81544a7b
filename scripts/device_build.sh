#!/usr/bin/env bash
# Builds Colossus on the GPU device machine against the image's torch
# (2.11.0+cu130), then runs `colossus check` and the CUDA tests, printing a
# summary last. Header-only dependencies the image lacks (toml++) travel in
# .devdeps/ (made by scripts/pack_device_deps.sh on the CPU machine).
# Usage (device): bash scripts/device_build.sh [extra ninja targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
# utf8proc and Oniguruma from .devdeps where the image has none (scripts/pack_device_deps.sh).
for lib in libutf8proc oniguruma; do
  pkg-config --exists "$lib" 2>/dev/null || export PKG_CONFIG_PATH="$PWD/.devdeps/$lib/lib/pkgconfig:${PKG_CONFIG_PATH:-}"
done

start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCOLOSSUS_CUDA=ON -DCOLOSSUS_CUDA_ARCHS="${COLOSSUS_CUDA_ARCHS:-90}" -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS=${COLOSSUS_TESTS:-ON} > "$out/configure.log" 2>&1 \
  || { tail -40 "$out/configure.log"; exit 1; }
# -k 0: report every failing file in one call, the device time is scarce.
ninja -C build-gpu -k 0 -j "$(nproc)" colossus_cli collectives_demo "$@" > "$out/build.log" 2>&1 \
  || { grep -E -A12 "error|FAILED" "$out/build.log" | head -80; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
build-gpu/bin/colossus check | tee "$out/check.txt"
build-gpu/bin/colossus check --json > "$out/check.json" || true
