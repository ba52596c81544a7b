// Attention over a paged KV cache on CUDA, behind raw pointers, sizes and a
// stream (the torch-level API and its reference are in
// colossus/inference/attention/paged_attention.h): writing new K/V rows into
// cache slots, and attention of S packed sequences over their cached tokens.
#pragma once
#include <cstddef>
#include <cstdint>

namespace colossus::kernels {

enum class AttentionDtype : int32_t { kFloat32, kFloat16, kBFloat16 };

// k, v: (num_tokens, kv_heads, head_dim), last dim contiguous, strides in
// elements -> key_cache, value_cache: (num_blocks, kv_heads, block_size,
// head_dim), contiguous, same dtype, at slot = block * block_size + offset.
struct ReshapeAndCacheArgs {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_token_stride = 0, k_head_stride = 0;
  int64_t v_token_stride = 0, v_head_stride = 0;
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  const int64_t* slot_mapping = nullptr;  // (num_tokens); -1 = do not write
  int64_t num_tokens = 0;
  int32_t kv_heads = 0, head_dim = 0, block_size = 0;
  AttentionDtype dtype = AttentionDtype::kBFloat16;
};

// q, out: (num_tokens, heads, head_dim), last dim contiguous, strides in
// elements. Sequence s owns rows [query_start[s], query_start[s + 1]); its
// row j sits at cache position context_lens[s] - q_len + j and attends to
// positions [0, that] (the last `window` of them when window > 0). Query head h reads KV head h / (heads / kv_heads).
// All device pointers; the sizes below are the host's copies (no kernel
// launch depends on reading device memory from the host).
struct PagedAttentionArgs {
  void* out = nullptr;
  const void* q = nullptr;
  int64_t out_token_stride = 0, out_head_stride = 0;
  int64_t q_token_stride = 0, q_head_stride = 0;
  const void* key_cache = nullptr;        // (num_blocks, kv_heads, block_size, head_dim), contiguous, 16-byte aligned
  const void* value_cache = nullptr;      // same
  const int32_t* block_tables = nullptr;  // (num_seqs, max_blocks_per_seq), rows block_table_stride apart
  int64_t block_table_stride = 0;
  const int32_t* query_start = nullptr;   // (num_seqs + 1)
  const int32_t* context_lens = nullptr;  // (num_seqs)
  int32_t num_seqs = 0, num_tokens = 0;
  int32_t heads = 0, kv_heads = 0, head_dim = 0, block_size = 0, max_blocks_per_seq = 0;
  int32_t max_query_len = 0, max_context_len = 0;    // over the sequences (host values)
  float scale = 1.0f;                                // softmax scale, usually 1/sqrt(head_dim)
  // Sliding window: the row at position p sees keys (p - window, p]; 0: all of [0, p].
  int32_t window = 0;
  // Soft cap of the scaled scores: softcap * tanh(score / softcap) before the
  // softmax (Gemma 2's attn_logit_softcapping). 0: none.
  float softcap = 0.0f;
  AttentionDtype dtype = AttentionDtype::kBFloat16;  // of q, out and both caches
  // Which kinds of sequence the step holds (host knowledge; both true is
  // always safe): q_len == 1 rows go to the decode kernel, q_len > 1 to the
  // prefill kernel.
  bool has_decode_seqs = true;
  bool has_prefill_seqs = true;
  int32_t num_sms = 132;       // multiprocessors, to size the decode split
  int32_t partition_size = 0;  // decode tokens per split-K partition (power of two >= 32); 0 = choose
  bool prefill_tensor_cores = true;  // bf16/fp16 prefill, head_dim <= 128, on mma.sync; false: CUDA cores
  void* workspace = nullptr;   // paged_attention_workspace_bytes(args) bytes of device memory
};

#ifdef COLOSSUS_WITH_CUDA
// Whether the kernels handle these arguments: fp32/fp16/bf16, head_dim in
// {32, 64, 80, 96, 128, 256}, any block size, heads % kv_heads == 0, 16-byte
// aligned caches. When false, nothing may be launched: use the reference.
bool paged_attention_cuda_supports(const PagedAttentionArgs& args);
// The head sizes alone: {32, 64, 80, 96, 128, 256}.
bool paged_attention_cuda_handles_head_dim(int32_t head_dim);
// Device scratch the decode split needs (partial max, sum and output per
// partition); 0 when every sequence fits one partition.
size_t paged_attention_workspace_bytes(const PagedAttentionArgs& args);
// The decode partition size (tokens) these arguments will use.
int32_t paged_attention_partition_size(const PagedAttentionArgs& args);
// Launches the decode kernels (q_len == 1 sequences: split-K over the
// context, then the log-sum-exp merge) and/or the prefill kernel (q_len > 1:
// tiled, online softmax, causal within the chunk; tensor cores for bf16/fp16
// up to head_dim 128) on `stream` (cudaStream_t).
void paged_attention_cuda(const PagedAttentionArgs& args, void* stream);

bool reshape_and_cache_cuda_supports(const ReshapeAndCacheArgs& args);
void reshape_and_cache_cuda(const ReshapeAndCacheArgs& args, void* stream);
#endif

}  // namespace colossus::kernels
