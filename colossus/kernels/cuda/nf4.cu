// NF4 dequantisation and the small-batch NF4 matmul (nf4.h); no torch
// headers here by design. The code book and the dynamic map sit in shared
// memory (16 distinct code addresses fall in 16 banks, so a warp's lookups
// never conflict). Every weight value is computed as the ATen reference does
// it: __fmul_rn / __fadd_rn keep nvcc from contracting map * scale + offset
// into an FMA, which would round once where the reference rounds twice.
#include "colossus/kernels/cuda/fused_common.cuh"
#include "colossus/kernels/nf4.h"

#include <algorithm>
#include <cstdint>

namespace colossus::kernels {

namespace {

using fused::from_float;
using fused::round_to;
using fused::to_float;
using fused::Vec;

constexpr int kDequantizeThreads = 256;
constexpr int64_t kMaxBlocks = 65536;
// Weights a dequantisation thread handles per step: 4 packed bytes. A group
// starts at a multiple of 8 and blocksize is a multiple of 16, so a group
// never straddles two quantisation blocks (one absmax per group).
constexpr int kGroup = 8;

// The matmul: each warp owns kRowsPerWarp output rows (x is read once for
// both), each lane kChunk consecutive weights of a row per step (8 packed
// bytes, again inside one quantisation block).
constexpr int kGemvWarps = 4;
constexpr int kRowsPerWarp = 2;
constexpr int kChunk = 16;

struct Tables {
  float code[16];
  float map[256];
};

// All threads of the block must call it (it has a barrier).
__device__ __forceinline__ void load_tables(const Nf4WeightPtrs& w, Tables& t) {
  for (int i = threadIdx.x; i < 16; i += blockDim.x) t.code[i] = w.code[i];
  if (w.double_quant) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) t.map[i] = w.dynamic_map[i];
  }
  __syncthreads();
}

// Quantisation block `block`'s absmax, rounded as the reference rounds it.
__device__ __forceinline__ float block_absmax(const Nf4WeightPtrs& w, const Tables& t, int64_t block) {
  if (!w.double_quant) return static_cast<const float*>(w.absmax)[block];
  const uint8_t map_index = static_cast<const uint8_t*>(w.absmax)[block];
  return __fadd_rn(__fmul_rn(t.map[map_index], w.absmax_scale[block / 256]), w.offset);
}

// Flat element e in fp32 (before the cast to the output dtype).
__device__ __forceinline__ float weight_value(const Nf4WeightPtrs& w, const Tables& t, int64_t e, int block_shift) {
  const uint8_t byte = w.packed[e >> 1];
  const int code_index = (e & 1) ? (byte & 0xF) : (byte >> 4);
  return __fmul_rn(t.code[code_index], block_absmax(w, t, e >> block_shift));
}

// The 2 * kBytes values of kBytes packed bytes (little-endian in `word`),
// first the high nibble of each byte, scaled by one absmax.
template <int kBytes, typename Word>
__device__ __forceinline__ void unpack(Word word, const Tables& t, float absmax, float* values) {
#pragma unroll
  for (int j = 0; j < kBytes; ++j) {
    const unsigned byte = static_cast<unsigned>(word >> (8 * j)) & 0xFFu;
    values[2 * j] = __fmul_rn(t.code[byte >> 4], absmax);
    values[2 * j + 1] = __fmul_rn(t.code[byte & 0xFu], absmax);
  }
}

// kVector: packed is 4-byte and out 16-byte aligned, so a whole group is one
// 32-bit load and 16-byte stores; the last group of an odd-sized tensor
// still goes element by element.
template <typename T, bool kVector>
__global__ void __launch_bounds__(kDequantizeThreads) nf4_dequantize_kernel(Nf4DequantizeArgs a, int block_shift) {
  __shared__ Tables tables;
  load_tables(a.weight, tables);
  const Nf4WeightPtrs& w = a.weight;
  const int64_t numel = w.out_features * w.in_features;
  const int64_t groups = (numel + kGroup - 1) / kGroup;
  T* out = static_cast<T*>(a.out);
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kDequantizeThreads + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * kDequantizeThreads) {
    const int64_t first = g * kGroup;
    if (kVector && first + kGroup <= numel) {
      float values[kGroup];
      const uint32_t word = *reinterpret_cast<const uint32_t*>(w.packed + first / 2);
      unpack<kGroup / 2>(word, tables, block_absmax(w, tables, first >> block_shift), values);
      constexpr int kPerVec = Vec<T>::kSize;
#pragma unroll
      for (int s = 0; s < kGroup / kPerVec; ++s) {
        Vec<T> vec;
#pragma unroll
        for (int i = 0; i < kPerVec; ++i) vec.v[i] = values[s * kPerVec + i];
        vec.store(out + first + s * kPerVec);
      }
    } else {
      const int64_t end = first + kGroup < numel ? first + kGroup : numel;
      for (int64_t e = first; e < end; ++e) out[e] = from_float<T>(weight_value(w, tables, e, block_shift));
    }
  }
}

// y (kRows, out) = x (kRows, in) @ W^T + bias. kVector: in is a multiple of
// kChunk, packed 8-byte and x 16-byte aligned, so a lane's chunk is one
// 8-byte load of codes and 16-byte loads of x; otherwise lanes stride over
// single weights. Rows past the end are computed as copies of the last row
// (no divergence in the loop) and not written.
template <typename T, int kRows, bool kVector>
__global__ void __launch_bounds__(kGemvWarps * 32) nf4_gemv_kernel(Nf4GemvArgs a, int block_shift) {
  __shared__ Tables tables;
  load_tables(a.weight, tables);
  const Nf4WeightPtrs& w = a.weight;
  const int64_t in = w.in_features, out_features = w.out_features;
  const int lane = threadIdx.x % 32;
  const int64_t first_row = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32) * kRowsPerWarp;
  int64_t weight_rows[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) weight_rows[r] = first_row + r < out_features ? first_row + r : out_features - 1;
  const T* x = static_cast<const T*>(a.x);
  float acc[kRowsPerWarp][kRows];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < kRows; ++m) acc[r][m] = 0.f;
  }

  if constexpr (kVector) {
    constexpr int kPerVec = Vec<T>::kSize;
    const int64_t chunks = in / kChunk;
    for (int64_t c = lane; c < chunks; c += 32) {
      float weights[kRowsPerWarp][kChunk];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int64_t first = weight_rows[r] * in + c * kChunk;
        const uint2 words = *reinterpret_cast<const uint2*>(w.packed + first / 2);
        const float absmax = block_absmax(w, tables, first >> block_shift);
        unpack<4>(words.x, tables, absmax, weights[r]);
        unpack<4>(words.y, tables, absmax, weights[r] + 8);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) weights[r][i] = round_to<T>(weights[r][i]);
      }
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
#pragma unroll
        for (int s = 0; s < kChunk / kPerVec; ++s) {
          Vec<T> xv;
          xv.load(x + m * in + c * kChunk + s * kPerVec);
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
            for (int i = 0; i < kPerVec; ++i) acc[r][m] = fmaf(weights[r][s * kPerVec + i], xv.v[i], acc[r][m]);
          }
        }
      }
    }
  } else {
    for (int64_t k = lane; k < in; k += 32) {
      float weights[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        weights[r] = round_to<T>(weight_value(w, tables, weight_rows[r] * in + k, block_shift));
      }
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        const float xv = to_float(x[m * in + k]);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) acc[r][m] = fmaf(weights[r], xv, acc[r][m]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], offset);
    }
  }
  if (lane != 0) return;
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t n = first_row + r;
    if (n >= out_features) break;
    const float b = bias != nullptr ? to_float(bias[n]) : 0.f;
#pragma unroll
    for (int m = 0; m < kRows; ++m) y[m * out_features + n] = from_float<T>(acc[r][m] + b);
  }
}

bool aligned_to(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

// log2(blocksize), or -1 when it is not a power of two in [16, 4096].
int block_shift_of(int64_t blocksize) {
  if (blocksize < 16 || blocksize > 4096 || (blocksize & (blocksize - 1)) != 0) return -1;
  int shift = 0;
  while ((int64_t{1} << shift) < blocksize) ++shift;
  return shift;
}

bool weight_usable(const Nf4WeightPtrs& w) {
  if (w.packed == nullptr || w.absmax == nullptr || w.code == nullptr) return false;
  if (w.double_quant && (w.absmax_scale == nullptr || w.dynamic_map == nullptr)) return false;
  return w.out_features > 0 && w.in_features > 0 && block_shift_of(w.blocksize) >= 0;
}

unsigned blocks_for(int64_t work, int64_t per_block) {
  return static_cast<unsigned>(std::min<int64_t>(kMaxBlocks, (work + per_block - 1) / per_block));
}

template <typename T>
void launch_dequantize(const Nf4DequantizeArgs& a, cudaStream_t stream) {
  const int shift = block_shift_of(a.weight.blocksize);
  const int64_t groups = (a.weight.out_features * a.weight.in_features + kGroup - 1) / kGroup;
  const unsigned blocks = blocks_for(groups, kDequantizeThreads);
  if (aligned_to(a.weight.packed, 4) && aligned16(a.out)) {
    nf4_dequantize_kernel<T, true><<<blocks, kDequantizeThreads, 0, stream>>>(a, shift);
  } else {
    nf4_dequantize_kernel<T, false><<<blocks, kDequantizeThreads, 0, stream>>>(a, shift);
  }
}

template <typename T, int kRows>
void launch_gemv(const Nf4GemvArgs& a, cudaStream_t stream) {
  const int shift = block_shift_of(a.weight.blocksize);
  constexpr int64_t kRowsPerBlock = kGemvWarps * kRowsPerWarp;
  // Not blocks_for: every block owns its rows, none strides (the grid limit
  // of 2^31 - 1 blocks is far above any weight's rows / 8).
  const auto blocks = static_cast<unsigned>((a.weight.out_features + kRowsPerBlock - 1) / kRowsPerBlock);
  const bool vectorized =
      a.weight.in_features % kChunk == 0 && aligned_to(a.weight.packed, 8) && aligned16(a.x);
  if (vectorized) {
    nf4_gemv_kernel<T, kRows, true><<<blocks, kGemvWarps * 32, 0, stream>>>(a, shift);
  } else {
    nf4_gemv_kernel<T, kRows, false><<<blocks, kGemvWarps * 32, 0, stream>>>(a, shift);
  }
}

template <typename T>
void launch_gemv_rows(const Nf4GemvArgs& a, cudaStream_t stream) {
  static_assert(kNf4GemvMaxRows == 8, "one case per row count below");
  switch (a.rows) {
    case 1: launch_gemv<T, 1>(a, stream); break;
    case 2: launch_gemv<T, 2>(a, stream); break;
    case 3: launch_gemv<T, 3>(a, stream); break;
    case 4: launch_gemv<T, 4>(a, stream); break;
    case 5: launch_gemv<T, 5>(a, stream); break;
    case 6: launch_gemv<T, 6>(a, stream); break;
    case 7: launch_gemv<T, 7>(a, stream); break;
    default: launch_gemv<T, 8>(a, stream); break;
  }
}

}  // namespace

bool nf4_dequantize_cuda(const Nf4DequantizeArgs& a, void* stream) {
  if (!weight_usable(a.weight) || a.out == nullptr) return false;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case ElementDtype::kFloat32: launch_dequantize<float>(a, s); break;
    case ElementDtype::kFloat16: launch_dequantize<__half>(a, s); break;
    case ElementDtype::kBFloat16: launch_dequantize<__nv_bfloat16>(a, s); break;
  }
  return true;
}

bool nf4_gemv_cuda(const Nf4GemvArgs& a, void* stream) {
  if (!weight_usable(a.weight) || a.x == nullptr || a.y == nullptr) return false;
  if (a.rows < 1 || a.rows > kNf4GemvMaxRows) return false;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case ElementDtype::kFloat32: launch_gemv_rows<float>(a, s); break;
    case ElementDtype::kFloat16: launch_gemv_rows<__half>(a, s); break;
    case ElementDtype::kBFloat16: launch_gemv_rows<__nv_bfloat16>(a, s); break;
  }
  return true;
}

}  // namespace colossus::kernels
