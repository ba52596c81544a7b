// DeepSeek's multi-head latent attention (MLA) with Hugging Face's names:
// queries from q_proj, or q_a_proj -> q_a_layernorm -> q_b_proj (q_lora_rank);
// keys and values from one latent: kv_a_proj_with_mqa gives kv_lora_rank
// latent dims plus a qk_rope_head_dim key shared by all heads, the latent goes
// through kv_a_layernorm and kv_b_proj into per-head [k_nope | v]. RoPE
// rotates only the rope part of q and the shared key (interleaved pairs in
// V2, and in V3 under rope_interleave); the softmax scale is
// qk_head_dim^-0.5 times yarn's mscale(factor, mscale_all_dim)^2.
#pragma once
#include "colossus/models/attention.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/config.h"
#include "colossus/models/layers.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace colossus::models {

// x: (..., T, D) rotated by cos/sin (T, D) or broadcastable: HF's
// apply_rotary_pos_emb_interleave, pairs (x0, x1), (x2, x3), ... each turned by
// the angle of its index; the result lists the pairs' first elements, then
// their second (the same scores as V2's complex rotation, whose output keeps
// the pairs interleaved, as q and k share the order).
at::Tensor apply_rope_interleaved(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The softmax scale of a DeepSeek config (see above).
double mla_softmax_scale(const DeepseekConfig& config);

class MlaAttention : public LayerHost {
 public:
  MlaAttention(const DeepseekConfig& config, const at::TensorOptions& options);
  // x: (B, T, C) -> (B, T, C). context: RoPE cos/sin (T, qk_rope_head_dim) or
  // (B, T, qk_rope_head_dim). With an AttentionHook (the inference engine)
  // kv_b_proj is absorbed: the hook sees q (B, H, T, kv_lora_rank +
  // qk_rope_head_dim) and one kv head, k = v = [latent | rotated key] (B, 1,
  // T, same), MLA's compressed cache row; only the value's first
  // kv_lora_rank dims are used.
  at::Tensor forward(const at::Tensor& x, const BlockContext& context);

  // The pieces the compressed-cache decode path reads.
  // x (B, T, C) -> q (B, H, T, qk_head_dim), RoPE applied to its rope part.
  at::Tensor queries(const at::Tensor& x, const BlockContext& context);
  // x (B, T, C) -> {latent (B, T, kv_lora_rank) after kv_a_layernorm,
  // rotated shared key (B, T, qk_rope_head_dim)}.
  std::pair<at::Tensor, at::Tensor> latent_kv(const at::Tensor& x, const BlockContext& context);
  // latent (B, T, r) -> {k_nope (B, H, T, nope), v (B, H, T, v_head_dim)} through kv_b_proj.
  std::pair<at::Tensor, at::Tensor> expand_latent(const at::Tensor& latent);

  const AttentionSpec& spec() const { return spec_; }
  int64_t qk_nope_head_dim() const { return nope_; }
  int64_t qk_rope_head_dim() const { return rope_; }
  int64_t v_head_dim() const { return v_; }
  int64_t kv_lora_rank() const { return rank_; }

 private:
  at::Tensor rotate(const at::Tensor& x, const BlockContext& context) const;
  int64_t nope_, rope_, v_, rank_;
  bool interleave_;
  AttentionSpec spec_;
  double attention_dropout_;
};

}  // namespace colossus::models
