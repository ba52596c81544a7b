// The decode step's attention prologue in one kernel: RoPE on the q and k
// heads of one packed q/k/v projection, the rotated q written out for the
// attention kernel, the rotated k and the v rows written into their paged-cache
// slots. Unfused it is a split, two RoPEs of three kernels each, a copy of q
// and the cache write: at batch 1 each of those launches costs more than the
// bytes it moves. Raw pointers only; the reference is apply_rope_signed
// (colossus/models/rope.h) followed by write_kv_cache
// (colossus/inference/attention/paged_attention.h).
#pragma once
#include "colossus/kernels/paged_attention.h"

#include <cstdint>

namespace colossus::kernels {

// qkv: (num_tokens, (q_heads + 2 * kv_heads) * head_dim), last dim
// contiguous, row stride qkv_token_stride elements: q heads, then k heads,
// then v heads. cos, signed_sin: (num_tokens, head_dim) contiguous, the
// token's RoPE rows (signed_sin: sin with its first half negated), same dtype.
// Per pair (i, i + D/2) of a q or k head, with HF's rounding (each product
// rounded to the dtype, then the sum):
//   out[i]       = x[i] * cos[i] + x[i + D/2] * signed_sin[i]
//   out[i + D/2] = x[i + D/2] * cos[i + D/2] + x[i] * signed_sin[i + D/2]
// q_out: (num_tokens, q_heads, head_dim) contiguous. The caches: (num_blocks,
// kv_heads, block_size, head_dim) contiguous, slot = block * block_size +
// offset; slot -1 writes nothing for that token (q_out is still written).
struct RopeQkvCacheArgs {
  const void* qkv = nullptr;
  int64_t qkv_token_stride = 0;
  const void* cos = nullptr;
  const void* signed_sin = nullptr;
  void* q_out = nullptr;
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  const int64_t* slot_mapping = nullptr;  // (num_tokens)
  int64_t num_tokens = 0;
  int32_t q_heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  AttentionDtype dtype = AttentionDtype::kBFloat16;  // of every tensor but slot_mapping
};

#ifdef COLOSSUS_WITH_CUDA
// Whether the kernel takes these arguments (an even head_dim, non-null
// operands, fewer than 2^31 tokens).
bool rope_qkv_cache_cuda_supports(const RopeQkvCacheArgs& args);
// On `stream` (a cudaStream_t), asynchronously; one item a thread, blocks of
// 256 threads, ceil(items / 256) of them per token.
void rope_qkv_cache_cuda(const RopeQkvCacheArgs& args, void* stream);
#endif

}  // namespace colossus::kernels
