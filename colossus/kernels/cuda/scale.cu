// CUDA kernel for scale_and_check_finite; no torch headers here by design.
#include "colossus/kernels/scale.h"

#include <cuda_runtime.h>

namespace colossus::kernels {

namespace {

__global__ void scale_and_check_kernel(float* data, int64_t n, float scale, int32_t* found) {
  int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x * 4;
  bool bad = false;
  for (int64_t base = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4; base < n; base += stride) {
    if (base + 3 < n && (reinterpret_cast<uintptr_t>(data + base) % 16) == 0) {
      float4 v = *reinterpret_cast<float4*>(data + base);
      bad |= !isfinite(v.x) || !isfinite(v.y) || !isfinite(v.z) || !isfinite(v.w);
      v.x *= scale; v.y *= scale; v.z *= scale; v.w *= scale;
      *reinterpret_cast<float4*>(data + base) = v;
    } else {
      for (int64_t i = base; i < base + 4 && i < n; ++i) {
        bad |= !isfinite(data[i]);
        data[i] *= scale;
      }
    }
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x % 32) == 0) *found = 1;
}

}  // namespace

void scale_and_check_finite_cuda(float* data, int64_t n, float scale, int32_t* found_nonfinite, void* stream) {
  if (n == 0) return;
  int threads = 256;
  int64_t blocks = (n / 4 + threads - 1) / threads;
  if (blocks > 132 * 8) blocks = 132 * 8;
  if (blocks < 1) blocks = 1;
  scale_and_check_kernel<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(
      data, n, scale, found_nonfinite);
}

}  // namespace colossus::kernels
