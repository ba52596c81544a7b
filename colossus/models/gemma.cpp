#include "colossus/models/gemma.h"

#include <ATen/ops/rsqrt.h>
#include <ATen/ops/scalar_tensor.h>

#include <cmath>
#include <tuple>

namespace colossus::models {

GemmaRMSNorm::GemmaRMSNorm(int64_t dim, double eps_, const at::TensorOptions& options)
    : Layer("GemmaRMSNorm"), eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

at::Tensor GemmaRMSNorm::forward(const at::Tensor& x) {
  // HF multiplies by (1 + w) before rounding to x's dtype (LLaMA rounds first).
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (h * (weight.to(at::kFloat) + 1.0)).to(x.scalar_type());
}

GemmaDecoderLayer::GemmaDecoderLayer(const LlamaConfig& config, const at::TensorOptions& options, int64_t layer)
    : LlamaDecoderLayer(config, options, layer) {
  const auto norm = [&] { return std::make_shared<GemmaRMSNorm>(config.hidden_size, config.rms_norm_eps, options); };
  replace_layer("input_layernorm", norm());
  replace_layer("post_attention_layernorm", norm());
  if (config.qk_norm) {
    // Gemma 3: (1 + w) norms over each q and k head.
    const int64_t d = config.resolved_head_dim();
    self_attn().replace_layer("q_norm", std::make_shared<GemmaRMSNorm>(d, config.rms_norm_eps, options));
    self_attn().replace_layer("k_norm", std::make_shared<GemmaRMSNorm>(d, config.rms_norm_eps, options));
  }
  add_layer("pre_feedforward_layernorm", norm());
  add_layer("post_feedforward_layernorm", norm());
}

at::Tensor GemmaDecoderLayer::forward(const at::Tensor& hidden, const BlockContext& context) {
  TORCH_CHECK(context.rope_cos.defined(), "GemmaDecoderLayer needs RoPE cos/sin in its BlockContext");
  const at::Tensor attn = self_attn().forward(layer("input_layernorm").forward(hidden), context);
  const at::Tensor h = hidden + layer("post_attention_layernorm").forward(attn);
  const at::Tensor mlp_out = mlp().forward(layer("pre_feedforward_layernorm").forward(h));
  return h + layer("post_feedforward_layernorm").forward(mlp_out);
}

GemmaForCausalLM::GemmaForCausalLM(const LlamaConfig& config, const at::TensorOptions& options)
    : LlamaForCausalLM(config, options,
                       Parts{.name = config.family == "gemma2" ? "Gemma2Model" : "Gemma3TextModel",
                             .block = [&](int64_t layer) {
                               return std::make_shared<GemmaDecoderLayer>(config, options, layer);
                             },
                             .norm = [&] {
                               return std::make_shared<GemmaRMSNorm>(config.hidden_size, config.rms_norm_eps, options);
                             }}) {
  if (config.family == "gemma3_text") {
    local_rope_.emplace(RopeSpec{.head_dim = config.resolved_head_dim(),
                                 .theta = config.rope_local_base_freq,
                                 .max_position_embeddings = config.max_position_embeddings});
  }
}

BlockContext GemmaForCausalLM::block_context(const at::Tensor& hidden) const {
  BlockContext context = LlamaForCausalLM::block_context(hidden);
  if (local_rope_) std::tie(context.local_rope_cos, context.local_rope_sin) = local_rope_->first(hidden, hidden.size(1));
  return context;
}

BlockContext GemmaForCausalLM::block_context_at(const at::Tensor& hidden, const at::Tensor& positions,
                                                int64_t position_limit) const {
  BlockContext context = LlamaForCausalLM::block_context_at(hidden, positions, position_limit);
  if (local_rope_) {
    std::tie(context.local_rope_cos, context.local_rope_sin) = local_rope_->at(hidden, positions, position_limit);
    if (context.rope_sin_signed.defined()) context.local_rope_sin_signed = signed_rope_sin(context.local_rope_sin);
  }
  return context;
}

at::Tensor GemmaForCausalLM::scale_embedding(const at::Tensor& embedded) const {
  // sqrt(hidden) rounded to the hidden dtype on the host (HF's normalizer tensor), no device work.
  const double normalizer =
      at::scalar_tensor(std::sqrt(static_cast<double>(llama_config().hidden_size)), embedded.scalar_type())
          .item<double>();
  return embedded * normalizer;
}

at::Tensor GemmaForCausalLM::embed(const at::Tensor& input_ids) {
  return scale_embedding(LlamaForCausalLM::embed(input_ids));
}

at::Tensor GemmaForCausalLM::embed_at(const at::Tensor& input_ids, const at::Tensor& positions,
                                       int64_t position_limit) {
  return scale_embedding(LlamaForCausalLM::embed_at(input_ids, positions, position_limit));
}

CausalLM::InitRule GemmaForCausalLM::init_rule(const std::string& name) const {
  // (1 + w) norms start at w = 0, as HF initialises them.
  if (name.ends_with("norm.weight")) return {Init::Zeros};
  return LlamaForCausalLM::init_rule(name);
}

}  // namespace colossus::models
