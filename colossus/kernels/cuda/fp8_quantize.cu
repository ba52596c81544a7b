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
// atomicMax, a second scales and casts; both read 16 bytes a thread where x
// is 16-byte aligned (a bf16 operand at one element a thread reads at a
// fraction of the bandwidth). With q_t the cast pass goes by 64 x 64 tiles
// and writes each tile's bytes transposed too, through shared memory, so
// the backward needs no transposing copies. Rowwise: one block a row, both
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

constexpr int kVec = 8;  // elements a thread loads at once on the vector paths
constexpr int kTile = 64;
static_assert(kThreads == 256, "tensorwise_transpose_kernel maps 256 threads onto a tile");

// kVec consecutive elements as floats; p 16-byte aligned.
template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[kVec]) {
  if constexpr (sizeof(T) == 2) {
    fused::Vec<T> a;
    a.load(p);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = a.v[i];
  } else {
    fused::Vec<T> a, b;
    a.load(p);
    b.load(p + 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = a.v[i], v[i + 4] = b.v[i];
  }
}

template <Fp8Format kFormat>
__device__ __forceinline__ uint2 quantize_vec(const float (&v)[kVec], float scale) {
  uint2 out;
  auto* bytes = reinterpret_cast<unsigned char*>(&out);
#pragma unroll
  for (int i = 0; i < kVec; ++i) bytes[i] = quantize_one<kFormat>(v[i], scale);
  return out;
}

// The largest |x| into a zeroed scratch: by vectors where `vectorized` (x
// 16-byte aligned), the last n % kVec (or all of x) one by one.
template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, bool vectorized, int* __restrict__ amax_bits) {
  int bits = 0;
  const int64_t vecs = vectorized ? n / kVec : 0, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int64_t i = first; i < vecs; i += stride) {
    float v[kVec];
    load_vec(x + i * kVec, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) bits = max(bits, __float_as_int(fabsf(v[k])));
  }
  for (int64_t i = vecs * kVec + first; i < n; i += stride) bits = max(bits, magnitude_bits(x[i]));
  bits = block_max(bits);
  if (threadIdx.x == 0) atomicMax(amax_bits, bits);
}

// Scale and cast, as amax_kernel goes (vectors need q 8-byte aligned too).
template <typename T, Fp8Format kFormat>
__global__ void tensorwise_kernel(const T* __restrict__ x, int64_t n, bool vectorized, const float* __restrict__ amax,
                                  unsigned char* __restrict__ q, float* __restrict__ scale_out) {
  const float scale = scale_of<kFormat>(*amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_out = scale;
  const int64_t vecs = vectorized ? n / kVec : 0, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (int64_t i = first; i < vecs; i += stride) {
    float v[kVec];
    load_vec(x + i * kVec, v);
    *reinterpret_cast<uint2*>(q + i * kVec) = quantize_vec<kFormat>(v, scale);
  }
  for (int64_t i = vecs * kVec + first; i < n; i += stride) q[i] = quantize_one<kFormat>(to_float(x[i]), scale);
}

// The cast pass by kTile x kTile tiles, writing q and its transpose q_t
// (cols, rows). rows and cols are multiples of kVec, so a vector of a tile
// at the edge is wholly inside or wholly outside. 256 threads: kTile / kVec
// a tile row, 32 tile rows a pass.
template <typename T, Fp8Format kFormat>
__global__ void tensorwise_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                            const float* __restrict__ amax, unsigned char* __restrict__ q,
                                            unsigned char* __restrict__ q_t, float* __restrict__ scale_out) {
  __shared__ __align__(8) unsigned char tile[kTile][kTile + kVec];
  const float scale = scale_of<kFormat>(*amax);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_out = scale;
  constexpr int kLanes = kTile / kVec, kRowsPerPass = 256 / kLanes;
  const int lane = threadIdx.x % kLanes, sub = threadIdx.x / kLanes;
  const int64_t row0 = int64_t{blockIdx.y} * kTile, col0 = int64_t{blockIdx.x} * kTile;
  for (int r = sub; r < kTile; r += kRowsPerPass) {
    const int64_t row = row0 + r, col = col0 + lane * kVec;
    if (row < rows && col < cols) {
      float v[kVec];
      load_vec(x + row * cols + col, v);
      const uint2 bytes = quantize_vec<kFormat>(v, scale);
      *reinterpret_cast<uint2*>(q + row * cols + col) = bytes;
      *reinterpret_cast<uint2*>(&tile[r][lane * kVec]) = bytes;
    }
  }
  __syncthreads();
  for (int c = sub; c < kTile; c += kRowsPerPass) {
    const int64_t out_row = col0 + c, out_col = row0 + lane * kVec;
    if (out_row < cols && out_col < rows) {
      uint2 packed;
      auto* bytes = reinterpret_cast<unsigned char*>(&packed);
#pragma unroll
      for (int i = 0; i < kVec; ++i) bytes[i] = tile[lane * kVec + i][c];
      *reinterpret_cast<uint2*>(q_t + out_row * rows + out_col) = packed;
    }
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

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T, Fp8Format kFormat>
void launch(const Fp8QuantizeArgs& a, cudaStream_t stream) {
  const T* x = static_cast<const T*>(a.x);
  auto* q = static_cast<unsigned char*>(a.q);
  if (a.rowwise) {
    rowwise_kernel<T, kFormat><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(x, a.cols, q, a.scale);
    return;
  }
  const int64_t n = a.rows * a.cols;
  const bool vec = aligned(x, 16) && aligned(q, 8);
  const int64_t blocks = blocks_for(vec ? (n + kVec - 1) / kVec : n);
  cudaMemsetAsync(a.amax_scratch, 0, sizeof(float), stream);
  amax_kernel<T><<<blocks, kThreads, 0, stream>>>(x, n, vec, reinterpret_cast<int*>(a.amax_scratch));
  if (a.q_t != nullptr) {  // checked by fp8_quantize_cuda: aligned, rows and cols multiples of kVec
    const dim3 grid(static_cast<unsigned>((a.cols + kTile - 1) / kTile), static_cast<unsigned>((a.rows + kTile - 1) / kTile));
    tensorwise_transpose_kernel<T, kFormat><<<grid, kThreads, 0, stream>>>(x, a.rows, a.cols, a.amax_scratch, q,
                                                                          static_cast<unsigned char*>(a.q_t), a.scale);
  } else {
    tensorwise_kernel<T, kFormat><<<blocks, kThreads, 0, stream>>>(x, n, vec, a.amax_scratch, q, a.scale);
  }
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
  if (a.q_t != nullptr) {
    const bool tiles_fit = (a.rows + kTile - 1) / kTile <= 65535 && (a.cols + kTile - 1) / kTile <= INT32_MAX;
    if (a.rowwise || a.rows % kVec != 0 || a.cols % kVec != 0 || !tiles_fit || !aligned(a.x, 16) ||
        !aligned(a.q, 8) || !aligned(a.q_t, 8)) {
      return false;
    }
  }
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case ElementDtype::kFloat32: launch_format<float>(a, s); break;
    case ElementDtype::kFloat16: launch_format<__half>(a, s); break;
    case ElementDtype::kBFloat16: launch_format<__nv_bfloat16>(a, s); break;
  }
  return true;
}

}  // namespace colossus::kernels
