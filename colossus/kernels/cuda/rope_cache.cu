// RoPE on a packed q/k/v projection with the paged-cache write (rope_cache.h);
// no torch headers here by design. Element by element, one item a thread: at
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

// Block (token, part): its threads take one item each of the token's
// rotation pairs then v elements, so a batch-1 step spreads over several
// blocks instead of one block looping (the launch, not the bytes, is the cost).
template <typename T>
__global__ void __launch_bounds__(kThreads) rope_qkv_cache_kernel(const RopeQkvCacheArgs a) {
  const int64_t token = blockIdx.x;
  const int d = a.head_dim, half = a.head_dim / 2;
  const int rotated_heads = a.q_heads + a.kv_heads;
  const int w = static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x);
  if (w >= rotated_heads * half + a.kv_heads * d) return;
  const T* row = static_cast<const T*>(a.qkv) + token * a.qkv_token_stride;
  const int64_t slot = a.slot_mapping[token];
  // Where cache row (kv head h) of this token starts.
  const auto cache_row = [&](int h) {
    const int64_t block = slot / a.block_size, offset = slot % a.block_size;
    return ((block * a.kv_heads + h) * a.block_size + offset) * d;
  };
  if (w < rotated_heads * half) {
    const int h = w / half, i = w % half;
    if (h >= a.q_heads && slot < 0) return;
    const T* cos = static_cast<const T*>(a.cos) + token * d;
    const T* sin = static_cast<const T*>(a.signed_sin) + token * d;
    const float x1 = to_float(row[h * d + i]), x2 = to_float(row[h * d + i + half]);
    const float o1 = round_to<T>(x1 * to_float(cos[i])) + round_to<T>(x2 * to_float(sin[i]));
    const float o2 = round_to<T>(x2 * to_float(cos[i + half])) + round_to<T>(x1 * to_float(sin[i + half]));
    T* dst = h < a.q_heads ? static_cast<T*>(a.q_out) + (token * a.q_heads + h) * d
                           : static_cast<T*>(a.key_cache) + cache_row(h - a.q_heads);
    dst[i] = from_float<T>(o1);
    dst[i + half] = from_float<T>(o2);
    return;
  }
  if (slot < 0) return;
  const int v = w - rotated_heads * half, h = v / d, j = v % d;
  static_cast<T*>(a.value_cache)[cache_row(h) + j] = row[(rotated_heads + h) * d + j];
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
  const int items = (a.q_heads + a.kv_heads) * (a.head_dim / 2) + a.kv_heads * a.head_dim;
  const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>((items + kThreads - 1) / kThreads));
  switch (a.dtype) {
    case AttentionDtype::kFloat32: rope_qkv_cache_kernel<float><<<grid, kThreads, 0, stream>>>(a); break;
    case AttentionDtype::kFloat16: rope_qkv_cache_kernel<__half><<<grid, kThreads, 0, stream>>>(a); break;
    case AttentionDtype::kBFloat16: rope_qkv_cache_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a); break;
  }
}

}  // namespace colossus::kernels
