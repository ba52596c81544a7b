// RoPE on a packed q/k/v projection with the paged-cache write (rope_cache.h);
// no torch headers here by design. One block per token: its threads walk the
// (q + k heads) x D/2 rotation pairs, then the v row. Element by element: at
// decode sizes the kernel is bound by its launch, not its bytes.
#include "colossus/kernels/cuda/fused_common.cuh"
#include "colossus/kernels/rope_cache.h"

#include <cstdint>

namespace colossus::kernels {

namespace {

using fused::from_float;
using fused::round_to;
using fused::to_float;

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) rope_qkv_cache_kernel(const RopeQkvCacheArgs a) {
  const int64_t token = blockIdx.x;
  const int d = a.head_dim, half = a.head_dim / 2;
  const T* row = static_cast<const T*>(a.qkv) + token * a.qkv_token_stride;
  const T* cos = static_cast<const T*>(a.cos) + token * d;
  const T* sin = static_cast<const T*>(a.signed_sin) + token * d;
  const int64_t slot = a.slot_mapping[token];
  // Where cache row (kv head h) of this token starts; -1: not written.
  const auto cache_row = [&](int h) -> int64_t {
    if (slot < 0) return -1;
    const int64_t block = slot / a.block_size, offset = slot % a.block_size;
    return ((block * a.kv_heads + h) * a.block_size + offset) * d;
  };
  T* q_out = static_cast<T*>(a.q_out) + token * a.q_heads * d;
  T* key_cache = static_cast<T*>(a.key_cache);
  T* value_cache = static_cast<T*>(a.value_cache);
  const int rotated_heads = a.q_heads + a.kv_heads;
  for (int w = threadIdx.x; w < rotated_heads * half; w += kThreads) {
    const int h = w / half, i = w % half;
    const float x1 = to_float(row[h * d + i]), x2 = to_float(row[h * d + i + half]);
    const float o1 = round_to<T>(x1 * to_float(cos[i])) + round_to<T>(x2 * to_float(sin[i]));
    const float o2 = round_to<T>(x2 * to_float(cos[i + half])) + round_to<T>(x1 * to_float(sin[i + half]));
    T* dst;
    if (h < a.q_heads) {
      dst = q_out + h * d;
    } else {
      const int64_t at = cache_row(h - a.q_heads);
      if (at < 0) continue;
      dst = key_cache + at;
    }
    dst[i] = from_float<T>(o1);
    dst[i + half] = from_float<T>(o2);
  }
  if (slot < 0) return;
  const T* v = row + rotated_heads * d;
  for (int w = threadIdx.x; w < a.kv_heads * d; w += kThreads) {
    const int h = w / d, j = w % d;
    value_cache[cache_row(h) + j] = v[h * d + j];
  }
}

}  // namespace

bool rope_qkv_cache_cuda_supports(const RopeQkvCacheArgs& a) {
  return a.qkv != nullptr && a.cos != nullptr && a.signed_sin != nullptr && a.q_out != nullptr &&
         a.key_cache != nullptr && a.value_cache != nullptr && a.slot_mapping != nullptr && a.q_heads > 0 &&
         a.kv_heads > 0 && a.head_dim > 0 && a.head_dim % 2 == 0 && a.block_size > 0 && a.num_tokens >= 0 &&
         a.num_tokens < (int64_t{1} << 31) && a.qkv_token_stride >= int64_t{a.q_heads + 2 * a.kv_heads} * a.head_dim;
}

void rope_qkv_cache_cuda(const RopeQkvCacheArgs& a, void* stream_ptr) {
  if (a.num_tokens == 0) return;
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const dim3 grid(static_cast<unsigned>(a.num_tokens));
  switch (a.dtype) {
    case AttentionDtype::kFloat32: rope_qkv_cache_kernel<float><<<grid, kThreads, 0, stream>>>(a); break;
    case AttentionDtype::kFloat16: rope_qkv_cache_kernel<__half><<<grid, kThreads, 0, stream>>>(a); break;
    case AttentionDtype::kBFloat16: rope_qkv_cache_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a); break;
  }
}

}  // namespace colossus::kernels
