// Attention over a paged KV cache for one engine step: S sequences, each
// bringing q_len_s new tokens (a prefill chunk or one decode token), packed
// along dim 0. The new tokens' K/V are written into cache slots first, then
// every query attends causally to its sequence's cached tokens.
//
// Cache layout (per layer): key_cache, value_cache: (num_blocks, kv_heads,
// block_size, head_dim). A block holds block_size consecutive tokens of one
// sequence; a sequence's block table lists its blocks in order, so cache
// position p of sequence s lives in block block_tables[s][p / block_size] at
// offset p % block_size.
#pragma once
#include "colossus/models/attention.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace colossus::inference {

struct AttentionMetadata {
  // Device tensors (on the cache's device).
  at::Tensor slot_mapping;  // (N) int64: block * block_size + offset for each new token; -1 = do not write
  at::Tensor block_tables;  // (S, max_blocks_per_seq) int32; entries past a sequence's blocks are ignored
  at::Tensor query_start;   // (S + 1) int32: the new tokens of s are rows [query_start[s], query_start[s + 1])
  at::Tensor context_lens;  // (S) int32: cached tokens of s, this step's included
  // The same on the host, so no path needs a device-to-host copy.
  std::vector<std::vector<int32_t>> host_block_tables;
  std::vector<int32_t> host_query_start;
  std::vector<int32_t> host_context_lens;
  int64_t max_query_len = 0;
  int64_t max_context_len = 0;

  int64_t num_seqs() const { return static_cast<int64_t>(host_context_lens.size()); }
  int64_t num_tokens() const { return host_query_start.empty() ? 0 : host_query_start.back(); }
  bool decode_only() const { return max_query_len == 1; }
};

// Builds the device tensors from the host fields (one host-to-device copy
// each); block tables are padded with 0 to the longest.
void upload_metadata(AttentionMetadata& meta, const std::vector<int64_t>& slots, const at::Device& device);

// k, v: (N, kv_heads, head_dim) -> written to the caches at slot_mapping.
void write_kv_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor& key_cache, at::Tensor& value_cache,
                    const at::Tensor& slot_mapping);

// q: (N, heads, head_dim) -> (N, heads, head_dim). Query row j (0-based
// within its sequence) sits at cache position p = context_len - q_len + j and
// attends to positions [0, p], or (p - window, p] under spec.window;
// heads % kv_heads == 0 (GQA shares each KV head among heads / kv_heads
// query heads). Uses the CUDA kernels when the cache is on a CUDA device, the
// build has them and there is no soft cap, else the reference.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const AttentionMetadata& meta, const models::AttentionSpec& spec);

// The same with the prologue fused (kernels/rope_cache.h): qkv (N, (heads +
// 2 kv_heads) * head_dim), q, k and v heads packed in one projection's rows
// before RoPE; cos, signed_sin (N, head_dim): the tokens' RoPE rows (sin with
// its first half negated). Rotates q and k, writes k and v into the caches at
// meta.slot_mapping and attends -> (N, heads, head_dim), the values
// apply_rope_signed + write_kv_cache + paged_attention give, in two kernel
// launches. nullopt, nothing written, when the CUDA kernel does not take the
// arguments (a CPU cache, a dtype mismatch, partial RoPE): the caller splits
// qkv and runs those three.
std::optional<at::Tensor> paged_attention_packed(const at::Tensor& qkv, int64_t heads, const at::Tensor& cos,
                                                 const at::Tensor& signed_sin, at::Tensor& key_cache,
                                                 at::Tensor& value_cache, const AttentionMetadata& meta,
                                                 const models::AttentionSpec& spec);

// The reference: per sequence, gather its blocks into contiguous K/V and run
// scaled_dot_product_attention with the causal mask offset by the cached
// prefix (and the window), through models::causal_attention's math. Exact,
// slow, and the oracle for the kernels.
at::Tensor paged_attention_reference(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                     const AttentionMetadata& meta, const models::AttentionSpec& spec);

}  // namespace colossus::inference
