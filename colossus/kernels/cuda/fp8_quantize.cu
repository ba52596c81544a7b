// FP8 quantisation of a matmul operand (fp8_quantize.h); no torch headers
// here by design. Each step rounds as the ATen reference does on CUDA, so
// the bytes and scales are the same:
//   - the largest magnitude is reduced on the bit patterns of |x| (for
//     non-negative floats integer order is float order, and a NaN sorts above
//     infinity, as ATen's max propagates it);
//   - amax / fmax: ATen divides a tensor by a host scalar as a multiplication
//     by its fp32 reciprocal, so this does too;
//   - x / scale: a true division (the scale is a device tensor there);
//   - clamp keeps NaN; the cast rounds to nearest even (in range after the
//     clamp, saturation never applies).
// Tensorwise: one grid-stride pass reduces into a zeroed fp32 scratch with
// atomicMax, a second scales and casts. Rowwise: one block a row, both
// passes over its row.
#include "colossus/kernels/cuda/fused_common.cuh"
#include "colossus/kernels/fp8_quantize.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

namespace colossus::kernels {

namespace {

using fused::to_float;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

template <Fp8Format kFormat>
__device__ __forceinline__ float format_max() {
  return kFormat == Fp8Format::kE4M3 ? 448.f : 57344.f;
}

template <Fp8Format kFormat>
__device__ __forceinline__ unsigned char to_fp8(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kFormat == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

// |x|'s bit pattern: ordered as the magnitudes, NaN above infinity.
template <typename T>
__device__ __forceinline__ int magnitude_bits(T v) {
  return __float_as_int(fabsf(to_float(v)));
}

// The block's largest value of `bits`; every thread gets it. All threads
// must call it (it has barriers).
__device__ __forceinline__ int block_max(int bits) {
  __shared__ int scratch[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, offset));
  if (lane == 0) scratch[warp] = bits;
  __syncthreads();
  int total = scratch[0];
  for (int w = 1; w < warps; ++w) total = max(total, scratch[w]);
  __syncthreads();
  return total;
}

template <Fp8Format kFormat>
__device__ __forceinline__ float scale_of(float amax) {
  const float top = format_max<kFormat>();
  return amax > 0.f ? __fmul_rn(amax, __fdiv_rn(1.f, top)) : 1.f;
}

template <Fp8Format kFormat>
__device__ __forceinline__ unsigned char quantize_one(float v, float scale) {
  const float top = format_max<kFormat>();
  float s = __fdiv_rn(v, scale);
  s = s > top ? top : (s < -top ? -top : s);  // NaN stays NaN
  return to_fp8<kFormat>(s);
}

template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, int* __restrict__ amax_bits) {
  int bits = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    bits = max(bits, magnitude_bits(x[i]));
  }
  bits = block_max(bits);
  if (threadIdx.x == 0) atomicMax(amax_bits, bits);
}

template <typename T, Fp8Format kFormat>
__global__ void tensorwise_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ amax,
                                  unsigned char* __restrict__ q, float* __restrict__ scale_out) {
  const float scale = scale_of<kFormat>(*amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    q[i] = quantize_one<kFormat>(to_float(x[i]), scale);
  }
}

template <typename T, Fp8Format kFormat>
__global__ void rowwise_kernel(const T* __restrict__ x, int64_t cols, unsigned char* __restrict__ q,
                               float* __restrict__ scales) {
  const int64_t row = blockIdx.x;
  const T* in = x + row * cols;
  unsigned char* out = q + row * cols;
  int bits = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) bits = max(bits, magnitude_bits(in[c]));
  const float scale = scale_of<kFormat>(__int_as_float(block_max(bits)));
  if (threadIdx.x == 0) scales[row] = scale;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = quantize_one<kFormat>(to_float(in[c]), scale);
}

int64_t blocks_for(int64_t n) { return std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)); }

template <typename T, Fp8Format kFormat>
void launch(const Fp8QuantizeArgs& a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  auto* q = static_cast<unsigned char*>(a.q);
  if (a.rowwise) {
    rowwise_kernel<T, kFormat><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(x, a.cols, q, a.scale);
    return;
  }
  const int64_t n = a.rows * a.cols;
  cudaMemsetAsync(a.amax_scratch, 0, sizeof(float), stream);
  amax_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(x, n, reinterpret_cast<int*>(a.amax_scratch));
  tensorwise_kernel<T, kFormat><<<blocks_for(n), kThreads, 0, stream>>>(x, n, a.amax_scratch, q, a.scale);
}

template <typename T>
void launch_format(const Fp8QuantizeArgs& a, cudaStream_t stream) {
  if (a.format == Fp8Format::kE4M3) {
    launch<T, Fp8Format::kE4M3>(a, stream);
  } else {
    launch<T, Fp8Format::kE5M2>(a, stream);
  }
}

}  // namespace

bool fp8_quantize_cuda(const Fp8QuantizeArgs& a, void* stream) {
  if (a.rows < 0 || a.cols < 0 || a.rows > INT32_MAX) return false;
  if (a.x == nullptr || a.q == nullptr || a.scale == nullptr || (!a.rowwise && a.amax_scratch == nullptr)) return false;
  if (a.rows == 0 || a.cols == 0) return false;  // the caller's fallback defines an empty tensor's scale
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case ElementDtype::kFloat32: launch_format<float>(a, s); break;
    case ElementDtype::kFloat16: launch_format<__half>(a, s); break;
    case ElementDtype::kBFloat16: launch_format<__nv_bfloat16>(a, s); break;
  }
  return true;
}

}  // namespace colossus::kernels
