#!/usr/bin/env bash
# Issue 29 on the GPU device: the kernels as other GPUs run them, and the cost
# of building for all of them.
#   ptx  builds with only compute_80 PTX embedded (-DCOLOSSUS_CUDA_ARCHS=80-virtual:
#        no machine code at all, proved with cuobjdump), so on this Hopper GPU the
#        driver JIT-compiles the code paths an A100 runs (__CUDA_ARCH__ 800); then
#        `colossus check` and the CUDA tests, under CUDA_FORCE_PTX_JIT=1 when the
#        torch wheel itself survives that (it needs PTX for every kernel it launches).
#   fat  times the kernels' build for the default architectures (sm_80/86/89/90 +
#        compute_90 PTX; on the ptx build when it is there) and lists what the
#        kernel library embeds.
# Usage (device): bash scripts/device_cuda_archs.sh ptx|fat (ptx first: fat reuses its build)
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
for lib in libutf8proc oniguruma; do
  pkg-config --exists "$lib" 2>/dev/null || export PKG_CONFIG_PATH="$PWD/.devdeps/$lib/lib/pkgconfig:${PKG_CONFIG_PATH:-}"
done
cuda_tests=(amp_test models_test moe_test optim_test test_sequence_parallel)
# The CUDA cases of those binaries (the rest need the CPU oracles' venv).
cuda_filter='*Cuda*:*CUDA*:GraphedTrainStep.*'

build() {  # dir archs tests targets...
  local dir=$1 archs=$2 tests=$3
  shift 3
  local start
  start=$(date +%s)
  cmake -S . -B "$dir" -G Ninja -DCOLOSSUS_CUDA=ON -DCOLOSSUS_CUDA_ARCHS="$archs" -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DCOLOSSUS_EXTRA_INCLUDE="$PWD/.devdeps/include" -DCOLOSSUS_TESTS="$tests" > "$out/$dir.configure.log" 2>&1 \
    || { tail -40 "$out/$dir.configure.log"; exit 1; }
  ninja -C "$dir" -k 0 -j "$(nproc)" "$@" > "$out/$dir.build.log" 2>&1 \
    || { grep -E -A12 "error|FAILED" "$out/$dir.build.log" | head -80; exit 1; }
  echo "$dir ($archs): clean build of $* in $(( $(date +%s) - start )) s on $(nproc) cores"
}

case "${1:-}" in
  ptx)
    build build-ptx 80-virtual ON colossus_cli "${cuda_tests[@]}"
    # What the binary embeds: PTX for compute_80 and no ELF (SASS) of ours.
    cuobjdump --list-ptx build-ptx/bin/colossus | sed -E 's/.*\.(sm_[0-9a-z]+)\.ptx.*/\1/' | sort | uniq -c | sed 's/^/  ptx /'
    elf=$(cuobjdump --list-elf build-ptx/bin/colossus 2>/dev/null | grep -c cubin || true)
    echo "  elf (machine code) files: $elf"
    [ "$elf" = 0 ] || { echo "expected no machine code in a compute_80-only build"; exit 1; }
    if CUDA_FORCE_PTX_JIT=1 python3 -c 'import torch; x = torch.randn(64, 64, device="cuda"); (x @ x).sum().item()' \
         > "$out/torch_force_jit.log" 2>&1; then
      export CUDA_FORCE_PTX_JIT=1
      echo "CUDA_FORCE_PTX_JIT=1: on (torch's own kernels JIT too)"
    else
      echo "CUDA_FORCE_PTX_JIT=1: off, the torch wheel fails under it ($(tail -1 "$out/torch_force_jit.log" | cut -c1-160));"
      echo "  our kernels are JIT-compiled from compute_80 PTX regardless: the binary holds no machine code for them"
    fi
    start=$(date +%s)
    build-ptx/bin/colossus check | tee "$out/check_ptx.txt"
    echo "colossus check (first run JIT-compiles the PTX): $(( $(date +%s) - start )) s"
    failed=0
    for t in "${cuda_tests[@]}"; do
      bin=$(find build-ptx -name "$t" -type f -perm -u+x | head -1)
      if bash scripts/mpirun_test.sh 1 "$bin" --gtest_color=no --gtest_filter="$cuda_filter" > "$out/$t.log" 2>&1; then
        echo "PASS $t"
        grep -E '^\[       OK|^\[  SKIPPED|^\[  PASSED' "$out/$t.log" | sed 's/^/    /'
      else
        failed=1
        echo "FAIL $t"
        tail -30 "$out/$t.log"
      fi
    done
    exit $failed
    ;;
  fat)
    # On the ptx call's build when it is there (the C++ side does not depend on
    # the list: only the .cu objects rebuild), else a clean one.
    dir=build-ptx
    [ -d "$dir" ] || build "$dir" 90 OFF colossus_cuda_kernels
    start=$(date +%s)
    cmake -S . -B "$dir" -DCOLOSSUS_CUDA_ARCHS="80-real;86-real;89-real;90" > /dev/null
    ninja -C "$dir" -j "$(nproc)" colossus_cuda_kernels > "$out/fat.build.log" 2>&1 || { tail -40 "$out/fat.build.log"; exit 1; }
    echo "the CUDA kernels for sm_80/86/89/90 + compute_90 PTX: $(( $(date +%s) - start )) s on $(nproc) cores"
    lib=$(find "$dir" -name 'libcolossus_cuda_kernels.a' | head -1)
    cuobjdump --list-elf "$lib" | sed -E 's/.*\.(sm_[0-9a-z]+)\.cubin.*/\1/' | sort | uniq -c | sed 's/^/  elf /'
    cuobjdump --list-ptx "$lib" | sed -E 's/.*\.(sm_[0-9a-z]+)\.ptx.*/\1/' | sort | uniq -c | sed 's/^/  ptx /'
    ;;
  *) echo "usage: $0 ptx|fat" >&2; exit 2 ;;
esac
