// DeepSeek-V2 / V2-Lite / V3 with Hugging Face's DeepseekV2ForCausalLM /
// DeepseekV3ForCausalLM checkpoint names: model.{embed_tokens,
// layers.N.{input_layernorm, self_attn (mla_attention.h),
// post_attention_layernorm, mlp}, norm}, lm_head, where mlp is LLaMA's dense
// MLP (intermediate_size) on the first first_k_dense_replace layers and
// DeepSeekMoE (deepseek_moe.h) after. RoPE tables cover qk_rope_head_dim.
#pragma once
#include "colossus/models/causal_lm.h"
#include "colossus/models/config.h"
#include "colossus/models/deepseek_moe.h"
#include "colossus/models/llama.h"
#include "colossus/models/mla_attention.h"
#include "colossus/models/rope.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace colossus::models {

class DeepseekDecoderLayer : public TransformerBlock {
 public:
  DeepseekDecoderLayer(const DeepseekConfig& config, const at::TensorOptions& options, int64_t layer);
  // hidden: (B, T, C) -> (B, T, C); pre-norm residual block.
  at::Tensor forward(const at::Tensor& hidden, const BlockContext& context) override;

 private:
  std::shared_ptr<MlaAttention> self_attn_;
  std::shared_ptr<LlamaMLP> dense_;  // one of these two is set
  std::shared_ptr<DeepseekMoe> moe_;
};

class DeepseekForCausalLM : public CausalLM {
 public:
  DeepseekForCausalLM(const DeepseekConfig& config, const at::TensorOptions& options);

  const DeepseekConfig& deepseek_config() const { return std::get<DeepseekConfig>(config()); }

  at::Tensor embed(const at::Tensor& input_ids) override;
  BlockContext block_context(const at::Tensor& hidden) const override;
  at::Tensor embed_at(const at::Tensor& input_ids, const at::Tensor& positions, int64_t position_limit) override;
  BlockContext block_context_at(const at::Tensor& hidden, const at::Tensor& positions,
                                int64_t position_limit) const override;
  at::Tensor final_norm(const at::Tensor& hidden) override;
  at::Tensor head(const at::Tensor& hidden) override;

  Embedding& embedding() const override;
  Layer& norm() const override;
  Layer* lm_head() const override;
  std::string blocks_path() const override { return "model.layers"; }

  // The MoE FFNs in layer order (the layers from first_k_dense_replace on).
  std::vector<DeepseekMoe*> moe_blocks() const;
  // V3's aux-loss-free balancing, to call after each optimizer step: every
  // router's bias moves by router_bias_update_speed against its experts'
  // load since the last call. No-op for V2 or a speed of 0.
  void update_router_biases();

 protected:
  InitRule init_rule(const std::string& name) const override;
  void after_init_value(const std::string& name, at::Tensor& values) const override;

 private:
  RopeCache rope_;
  std::shared_ptr<Backbone> model_;
};

}  // namespace colossus::models
