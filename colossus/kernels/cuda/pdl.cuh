// Programmatic dependent launch (Hopper, sm_90+): a kernel launched with
// programmatic stream serialization may start while the kernel before it is
// still draining; it runs only what does not depend on that kernel (the
// decode GEMV pulls its weight rows into L2), then waits in pdl_wait() until
// the previous grid has completed and its writes are visible. A kernel that
// calls pdl_launch_dependents() lets its successor be scheduled once every
// one of its blocks has started, not once they have all exited. On older
// GPUs, or a kernel launched without the attribute, both are no-ops.
// Decode at batch 1 is ~150 short kernels a step; each boundary costs the
// launch and the first memory round trip, which this overlaps.
// COLOSSUS_PDL=0 in the environment launches plainly (A/B measurement).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace colossus::kernels::pdl {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether the current device takes programmatic launches (compute
// capability 9.0+) and COLOSSUS_PDL is not "0". Cached per device.
inline bool enabled() {
  static const bool allowed = [] {
    const char* env = std::getenv("COLOSSUS_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  if (!allowed) return false;
  constexpr int kDevices = 64;
  static std::atomic<int> major_of[kDevices] = {};  // 0: not asked yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) return false;
  int major = major_of[device].load(std::memory_order_relaxed);
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    major_of[device].store(major, std::memory_order_relaxed);
  }
  return major >= 9;
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialization where enabled().
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  if (!enabled()) {
    kernel<<<grid, block, smem, stream>>>(static_cast<Args&&>(args)...);
    return;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

}  // namespace colossus::kernels::pdl
