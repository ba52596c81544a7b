// The attention core every decoder block shares: softmax(q k^T * scale) v,
// causal, optionally limited to a sliding window of recent keys (Mistral,
// Qwen2/3's windowed layers) and with the scores soft-capped (Gemma 2).
// Training runs it here; the inference engine and sequence parallelism
// replace it through AttentionHook with the same AttentionSpec.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace colossus::models {

struct AttentionSpec {
  double scale = 1.0;  // multiplies q k^T before the softmax
  // A query at position p sees keys at positions (p - window, p]: `window`
  // keys, itself included, as transformers' sliding-window mask. 0: every
  // earlier key.
  int64_t window = 0;
  // Scores become softcap * tanh(scores / softcap) before the mask (Gemma 2's
  // attn_logit_softcapping). 0: none.
  double softcap = 0.0;

  // Whether a causal mask over `seq_len` tokens already is this attention.
  bool plain_causal_for(int64_t seq_len) const { return softcap == 0.0 && (window == 0 || seq_len <= window); }
};

// Padded or packed rows as one variable-length batch for flash attention:
// the B*T tokens flattened, in segments that each hold one document (or one
// run of padding, whose outputs nothing reads), attended causally each.
struct VarlenSegments {
  at::Tensor cu_seqlens;   // (S + 1) int32 on the tokens' device: segment starts, then B*T
  int64_t max_seqlen = 0;  // the longest segment
  bool defined() const { return cu_seqlens.defined(); }
};
// document_ids (B, T) int64 (TokenLayout) -> its segments (one host sync).
VarlenSegments varlen_segments(const at::Tensor& document_ids);

// Whether varlen_flash_attention takes these: CUDA, fp16/bf16, head_dim a
// multiple of 8 up to 256, no soft cap.
bool varlen_flash_applies(const at::Tensor& q, const AttentionSpec& spec);
// Flash attention's variable-length kernel over `segments` (causal within
// each, spec.window honoured; grouped kv heads as they are): q (B, H, T, D),
// k/v (B, H_kv, T, D) -> (B, H, T, D); differentiable (torch's flash
// backward). Throws where the build or the GPU has no flash kernel.
at::Tensor varlen_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionSpec& spec, double dropout, const VarlenSegments& segments);

// q: (B, H, T, D), k/v: (B, H_kv, T, D) with H % H_kv == 0 -> (B, H, T, D).
// The plain causal case is one fused SDPA call (flash/cuDNN on CUDA); a
// window past T is a boolean band mask; a soft cap computes the scores
// explicitly (softmax in fp32). document_mask: (B, 1, T, T) bool from
// TokenLayout::attention_mask() (padded or packed rows), intersected with
// the window; undefined: plain causal. With `segments` of the same rows, on
// CUDA in fp16/bf16 the rows run through the varlen flash kernel instead of
// the dense mask (no T x T mask is read; a GPU without it falls back).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionSpec& spec,
                            double dropout, const at::Tensor& document_mask = {}, const VarlenSegments& segments = {});

// The same with an explicit (T_q, T_k) or (B, 1, T_q, T_k) boolean mask (true: may attend),
// e.g. queries that continue a cached prefix. spec.window is not applied
// here (it belongs in the mask).
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            const AttentionSpec& spec, double dropout);

// (q_len, k_len) bool: true where query i, at position first_query_position + i,
// may see key j (at position j) under `window` (0: causal only).
at::Tensor causal_window_mask(int64_t q_len, int64_t k_len, int64_t first_query_position, int64_t window,
                              const at::Device& device);

}  // namespace colossus::models
