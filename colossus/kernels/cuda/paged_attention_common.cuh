// Device helpers shared by the paged-attention kernels (paged_attention.cu,
// paged_prefill.cu): 16-byte loads of fp32/fp16/bf16 widened to fp32, stores
// narrowed back, and the host-side dtype / head_dim dispatch. No torch here.
#pragma once
#include "colossus/kernels/paged_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace colossus::kernels::paged {

// Elements of T in one 16-byte load.
template <typename T>
constexpr int kVec = static_cast<int>(16 / sizeof(T));

constexpr int pow2_ceil(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}
constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// One 16-byte load (the address must be 16-byte aligned).
__device__ __forceinline__ uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }

// The kVec<T> values of a 16-byte load, as fp32.
template <typename T>
__device__ __forceinline__ void widen(const uint4& raw, float* out);
template <>
__device__ __forceinline__ void widen<float>(const uint4& raw, float* out) {
  out[0] = __uint_as_float(raw.x);
  out[1] = __uint_as_float(raw.y);
  out[2] = __uint_as_float(raw.z);
  out[3] = __uint_as_float(raw.w);
}
// Pairs are unpacked from the 32-bit words by value (no type punning of
// registers): bf16 is the top half of an fp32, fp16 converts exactly.
template <>
__device__ __forceinline__ void widen<__half>(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xffffu)));
    out[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
  }
}
template <>
__device__ __forceinline__ void widen<__nv_bfloat16>(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

constexpr float kLog2e = 1.4426950408889634f;

// Host: calls f(T{}) with the element type of `dtype`.
template <typename F>
void dispatch_dtype(AttentionDtype dtype, F&& f) {
  switch (dtype) {
    case AttentionDtype::kFloat32:
      f(float{});
      break;
    case AttentionDtype::kFloat16:
      f(__half{});
      break;
    case AttentionDtype::kBFloat16:
      f(__nv_bfloat16{});
      break;
  }
}

// Host: calls f(std::integral_constant<int, D>{}) for a supported head_dim;
// returns false (calling nothing) otherwise.
template <typename F>
bool dispatch_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 32:
      f(std::integral_constant<int, 32>{});
      return true;
    case 64:
      f(std::integral_constant<int, 64>{});
      return true;
    case 80:
      f(std::integral_constant<int, 80>{});
      return true;
    case 96:
      f(std::integral_constant<int, 96>{});
      return true;
    case 128:
      f(std::integral_constant<int, 128>{});
      return true;
    case 256:
      f(std::integral_constant<int, 256>{});
      return true;
    default:
      return false;
  }
}

inline bool is_supported_head_dim(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

// The first cache position a query at position `pos` sees: 0, or under a
// sliding window of `window` keys, pos - window + 1.
__host__ __device__ __forceinline__ int window_start(int window, int pos) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// The kernels hold scores in log2 units (scaled by log2 e, so that exp2 gives
// the softmax numerator). A soft cap c on the natural-unit score x, c tanh(x / c),
// is then the same cap in log2 units: cap_log2 = c log2 e. 0: no cap.
__host__ __device__ __forceinline__ float softcap_log2(const PagedAttentionArgs& a) { return a.softcap * kLog2e; }
__device__ __forceinline__ float apply_softcap(float score_log2, float cap_log2) {
  return cap_log2 > 0.0f ? cap_log2 * tanhf(score_log2 / cap_log2) : score_log2;
}

// Tokens a decode row attends to at most: the longest context, or the window.
inline int64_t decode_span(const PagedAttentionArgs& a) {
  return a.window > 0 && a.window < a.max_context_len ? a.window : a.max_context_len;
}

// The largest power of two <= limit that divides `group` (query heads per KV
// head): how many query heads one thread block serves from one load of K/V.
inline int heads_per_block(int group, int limit) {
  int g = 1;
  while (g * 2 <= limit && group % (g * 2) == 0) g *= 2;
  return g;
}

// paged_prefill.cu: the q_len > 1 sequences of `args` (q_len == 1 too when
// !args.has_decode_seqs, so that a lone launch covers every row), on tensor
// cores where paged_prefill_tc.cu takes the shape, else on CUDA cores.
void launch_paged_prefill(const PagedAttentionArgs& args, cudaStream_t stream);
// paged_prefill_tc.cu: launches and returns true for bf16/fp16 with head_dim
// 32/64/80/96/128 when args.prefill_tensor_cores; else false, launching nothing.
bool launch_paged_prefill_tensor_cores(const PagedAttentionArgs& args, cudaStream_t stream);

}  // namespace colossus::kernels::paged
