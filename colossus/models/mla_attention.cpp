#include "colossus/models/mla_attention.h"

#include "colossus/models/rope.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/matmul.h>

#include <cmath>

namespace colossus::models {

at::Tensor apply_rope_interleaved(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  // cos/sin rows are [angles | angles]; one angle per pair.
  const at::Tensor c = cos.narrow(-1, 0, half), s = sin.narrow(-1, 0, half);
  const at::Tensor even = x.slice(-1, 0, x.size(-1), 2), odd = x.slice(-1, 1, x.size(-1), 2);
  return at::cat({even * c - odd * s, odd * c + even * s}, -1);
}

double mla_softmax_scale(const DeepseekConfig& config) {
  double scale = 1.0 / std::sqrt(static_cast<double>(config.qk_head_dim()));
  // transformers' yarn_apply_mscale: any scaled RoPE with mscale_all_dim set
  // also scales the non-rotary dims' scores.
  const RopeScaling& s = config.rope_scaling;
  if (s.rope_type != "default" && s.mscale_all_dim.value_or(0.0) != 0.0) {
    const double m = yarn_mscale(s.factor, *s.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

MlaAttention::MlaAttention(const DeepseekConfig& config, const at::TensorOptions& options)
    : LayerHost("MlaAttention"),
      nope_(config.qk_nope_head_dim),
      rope_(config.qk_rope_head_dim),
      v_(config.v_head_dim),
      rank_(config.kv_lora_rank),
      interleave_(config.rope_interleave),
      spec_{.scale = mla_softmax_scale(config)},
      attention_dropout_(config.attention_dropout) {
  const int64_t c = config.hidden_size, heads = config.num_attention_heads, qk = config.qk_head_dim();
  const bool bias = config.attention_bias;
  if (config.q_lora_rank) {
    add_layer("q_a_proj", std::make_shared<Linear>(c, *config.q_lora_rank, bias, options));
    // HF builds both latent norms with its default eps (1e-6), not rms_norm_eps.
    add_layer("q_a_layernorm", std::make_shared<RMSNorm>(*config.q_lora_rank, 1e-6, options));
    add_layer("q_b_proj", std::make_shared<Linear>(*config.q_lora_rank, heads * qk, false, options));
  } else {
    add_layer("q_proj", std::make_shared<Linear>(c, heads * qk, false, options));
  }
  add_layer("kv_a_proj_with_mqa", std::make_shared<Linear>(c, rank_ + rope_, bias, options));
  add_layer("kv_a_layernorm", std::make_shared<RMSNorm>(rank_, 1e-6, options));
  add_layer("kv_b_proj", std::make_shared<Linear>(rank_, heads * (nope_ + v_), false, options));
  add_layer("o_proj", std::make_shared<Linear>(heads * v_, c, bias, options));
}

at::Tensor MlaAttention::rotate(const at::Tensor& x, const BlockContext& context) const {
  // Tables are (T, D), or (B, T, D) at per-row positions: add a head axis then.
  const auto over_heads = [](const at::Tensor& table) { return table.dim() == 3 ? table.unsqueeze(1) : table; };
  const at::Tensor cos = over_heads(context.rope_cos), sin = over_heads(context.rope_sin);
  return interleave_ ? apply_rope_interleaved(x, cos, sin) : apply_rope(x, cos, sin);
}

at::Tensor MlaAttention::queries(const at::Tensor& x, const BlockContext& context) {
  const at::Tensor projected = has_layer("q_proj")
                                   ? layer("q_proj").forward(x)
                                   : layer("q_b_proj").forward(layer("q_a_layernorm").forward(layer("q_a_proj").forward(x)));
  const at::Tensor q = projected.view({x.size(0), x.size(1), -1, nope_ + rope_}).transpose(1, 2);  // (B, H, T, qk)
  return at::cat({q.narrow(-1, 0, nope_), rotate(q.narrow(-1, nope_, rope_), context)}, -1);
}

std::pair<at::Tensor, at::Tensor> MlaAttention::latent_kv(const at::Tensor& x, const BlockContext& context) {
  const at::Tensor compressed = layer("kv_a_proj_with_mqa").forward(x);  // (B, T, r + rope)
  const at::Tensor latent = layer("kv_a_layernorm").forward(compressed.narrow(-1, 0, rank_));
  // The shared key as one head, so the tables broadcast as for q.
  const at::Tensor k_rot = rotate(compressed.narrow(-1, rank_, rope_).unsqueeze(1), context).squeeze(1);
  return {latent, k_rot};
}

std::pair<at::Tensor, at::Tensor> MlaAttention::expand_latent(const at::Tensor& latent) {
  const at::Tensor kv = layer("kv_b_proj").forward(latent);
  const at::Tensor heads = kv.view({latent.size(0), latent.size(1), -1, nope_ + v_}).transpose(1, 2);  // (B, H, T, nope + v)
  return {heads.narrow(-1, 0, nope_), heads.narrow(-1, nope_, v_)};
}

at::Tensor MlaAttention::forward(const at::Tensor& x, const BlockContext& context) {
  const int64_t batch = x.size(0), seq = x.size(1);
  const at::Tensor q = queries(x, context);
  const auto [latent, k_rot] = latent_kv(x, context);
  at::Tensor y;
  if (context.attention != nullptr) {
    // Inference: kv_b_proj absorbed into the query and output sides, so the
    // cache holds one row per token, [latent | rotated shared key] (kv_lora_rank
    // + qk_rope_head_dim), read as the key and, its first kv_lora_rank dims, as
    // the value by all heads (multi-query attention). Per head h with
    // W_uk[h] (nope, r) and W_uv[h] (v, r) the rows of kv_b_proj:
    // q_nope . (W_uk latent) = (W_uk^T q_nope) . latent, and
    // sum_t p_t W_uv latent_t = W_uv (sum_t p_t latent_t).
    const at::Tensor w = layer_as<Linear>("kv_b_proj").weight.view({-1, nope_ + v_, rank_});  // (H, nope + v, r)
    const at::Tensor q_latent = at::matmul(q.narrow(-1, 0, nope_), w.narrow(1, 0, nope_));    // (B, H, T, r)
    const at::Tensor q_absorbed = at::cat({q_latent, q.narrow(-1, nope_, rope_)}, -1);        // (B, H, T, r + rope)
    const at::Tensor row = at::cat({latent, k_rot}, -1).unsqueeze(1);                          // (B, 1, T, r + rope)
    const at::Tensor out = context.attention->attend(context.layer, q_absorbed, row, row, spec_);
    y = at::matmul(out.narrow(-1, 0, rank_), w.narrow(1, nope_, v_).transpose(1, 2));  // (B, H, T, v)
  } else {
    auto [k_nope, v] = expand_latent(latent);
    const at::Tensor k = at::cat({k_nope, k_rot.unsqueeze(1).expand({batch, k_nope.size(1), seq, rope_})}, -1);
    y = causal_attention(q, k, v, spec_, is_training() ? attention_dropout_ : 0.0, context.document_mask, context.varlen);
  }
  return layer("o_proj").forward(y.transpose(1, 2).reshape({batch, seq, -1}));
}

}  // namespace colossus::models
