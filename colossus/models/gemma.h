// Gemma 2 and Gemma 3 (text) with Hugging Face's Gemma2ForCausalLM /
// Gemma3ForCausalLM names and numerics, built in LLaMA's frame (llama.h: the
// same attention, MLP and RoPE modules) with what Gemma changes: RMSNorm as
// x * (1 + w) in fp32, norms after attention and around the MLP
// (pre/post_feedforward_layernorm), the embedding scaled by sqrt(hidden_size),
// GeGLU, attention scaled by query_pre_attn_scalar, sliding and full layers
// (LlamaConfig::is_sliding_layer), soft-capped scores and final logits
// (Gemma 2's defaults), and for Gemma 3 (1 + w) q/k norms and a RoPE of its
// own base on the sliding layers (rope_local_base_freq).
#pragma once
#include "colossus/models/llama.h"
#include "colossus/models/rope.h"

#include <optional>

namespace colossus::models {

// Gemma's RMSNorm: (x / rms(x)) * (1 + w), all in fp32, then x's dtype; w starts at 0.
class GemmaRMSNorm : public Layer {
 public:
  GemmaRMSNorm(int64_t dim, double eps, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) override;
  at::Tensor weight;  // (C)
  double eps;
};

class GemmaDecoderLayer : public LlamaDecoderLayer {
 public:
  GemmaDecoderLayer(const LlamaConfig& config, const at::TensorOptions& options, int64_t layer);
  // h = x + post_attention_layernorm(attn(input_layernorm(x)));
  // out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))).
  at::Tensor forward(const at::Tensor& hidden, const BlockContext& context) override;
};

class GemmaForCausalLM : public LlamaForCausalLM {
 public:
  GemmaForCausalLM(const LlamaConfig& config, const at::TensorOptions& options);

  // The embedding times sqrt(hidden_size), rounded to the hidden dtype as HF does.
  at::Tensor embed(const at::Tensor& input_ids) override;
  at::Tensor embed_at(const at::Tensor& input_ids, const at::Tensor& positions, int64_t position_limit) override;
  // LLaMA's context plus, for Gemma 3, the sliding layers' RoPE.
  BlockContext block_context(const at::Tensor& hidden) const override;
  BlockContext block_context_at(const at::Tensor& hidden, const at::Tensor& positions,
                                int64_t position_limit) const override;
  double final_logit_softcap() const override { return llama_config().final_logit_softcapping.value_or(0.0); }

 protected:
  InitRule init_rule(const std::string& name) const override;

 private:
  at::Tensor scale_embedding(const at::Tensor& embedded) const;
  std::optional<RopeCache> local_rope_;  // Gemma 3 only
};

}  // namespace colossus::models
