// Device helpers shared by the CUDA kernels (norm.cu, rope.cu, swiglu.cu,
// cross_entropy.cu, moe_permute.cu, nf4.cu): fp32 <-> element conversions, 16-byte vector loads/stores as
// floats, and a block-wide sum. No torch headers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace colossus::kernels::fused {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
// v rounded to T's precision (what storing and reloading it would give).
template <typename T>
__device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

// kSize consecutive elements of T (16 bytes) held as floats.
template <typename T>
struct Vec {
  static constexpr int kSize = 16 / sizeof(T);
  float v[kSize];
  // p: 16-byte aligned.
  __device__ __forceinline__ void load(const T* p) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kSize; ++i) v[i] = to_float(e[i]);
  }
  __device__ __forceinline__ void store(T* p) const {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kSize; ++i) e[i] = from_float<T>(v[i]);
    *reinterpret_cast<uint4*>(p) = raw;
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kSize; ++i) v[i] = 0.f;
  }
};

// Sums each of the N values over the block (blockDim.x a multiple of 32);
// every thread gets the totals, added in the same order in every thread. All
// threads of the block must call it (it has barriers).
template <int N>
__device__ __forceinline__ void block_sum(float (&v)[N]) {
  __shared__ float scratch[N][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v[i] += __shfl_xor_sync(0xffffffffu, v[i], offset);
    if (lane == 0) scratch[i][warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float total = 0.f;
    for (int w = 0; w < warps; ++w) total += scratch[i][w];
    v[i] = total;
  }
  __syncthreads();  // the next call may overwrite scratch
}

}  // namespace colossus::kernels::fused
