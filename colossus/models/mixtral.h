// Mixtral with Hugging Face's MixtralForCausalLM checkpoint names (the names
// transformers' save_pretrained writes and from_pretrained reads, v4 and v5):
// model.{embed_tokens, layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, block_sparse_moe.{gate, experts.M.{w1,w2,w3}}},
// norm}, lm_head. Attention, RMSNorm and RoPE are LLaMA's; the FFN is
// SparseMoeBlock. The same classes run Qwen2-MoE and Qwen3-MoE
// (MixtralConfig::moe_family; HF's Qwen2MoeForCausalLM / Qwen3MoeForCausalLM
// names): Qwen2's or Qwen3's attention, the MoE block under mlp.{gate,
// experts.M.{gate,up,down}_proj} (Qwen2-MoE: + shared_expert.*,
// shared_expert_gate), and a dense LLaMA MLP (mlp.{gate,up,down}_proj) on the
// layers that are not sparse (decoder_sparse_step, mlp_only_layers).
#pragma once
#include "colossus/models/causal_lm.h"
#include "colossus/models/config.h"
#include "colossus/models/llama.h"
#include "colossus/models/moe_layer.h"
#include "colossus/models/rope.h"

#include <ATen/core/Tensor.h>

namespace colossus::models {

class MixtralDecoderLayer : public TransformerBlock {
 public:
  // layer: the block's index (its sliding window, when the config has one; whether it is sparse).
  MixtralDecoderLayer(const MixtralConfig& config, const at::TensorOptions& options, int64_t layer);
  // hidden: (B, T, C) -> (B, T, C)
  at::Tensor forward(const at::Tensor& hidden, const BlockContext& context) override;

  // False for a Qwen-MoE layer with a dense MLP (moe() must not be called there).
  bool is_sparse() const { return moe_ != nullptr; }
  SparseMoeBlock& moe() const;
  // Installs another MoE block (e.g. expert-parallel) under the same name.
  void replace_moe(std::shared_ptr<SparseMoeBlock> moe);

 private:
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<SparseMoeBlock> moe_;  // null on a dense layer
  std::shared_ptr<LlamaMLP> mlp_;        // the dense layer's MLP
  std::string moe_name_;                 // block_sparse_moe (Mixtral) or mlp (Qwen MoE)
};

class MixtralForCausalLM : public CausalLM {
 public:
  MixtralForCausalLM(const MixtralConfig& config, const at::TensorOptions& options);

  const MixtralConfig& mixtral_config() const { return std::get<MixtralConfig>(config()); }

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

  // The MoE block of every sparse decoder layer, in order (dense layers have none).
  std::vector<SparseMoeBlock*> moe_blocks() const;
  // Router logits (N, E) of each layer from the last forward.
  std::vector<at::Tensor> router_logits() const;
  // HF's aux_loss: load_balancing_loss over the last forward's router logits.
  at::Tensor aux_loss() const;
  // Assignments dropped by the capacity in the last forward, all layers.
  int64_t dropped_tokens() const;
  // HF's loss: causal-LM loss + router_aux_loss_coef * aux_loss when
  // output_router_logits, + router_z_loss_coef * z-loss when > 0.
  at::Tensor moe_loss(const at::Tensor& logits, const at::Tensor& labels,
                      std::optional<int64_t> num_items = std::nullopt) const;
  // lm_loss + the router terms of moe_loss (for a causal-LM loss computed
  // elsewhere, e.g. vocab-parallel).
  at::Tensor add_router_losses(const at::Tensor& lm_loss) const;
  // Whether moe_loss adds router terms (they need every layer's router logits).
  bool has_router_losses() const;

 protected:
  InitRule init_rule(const std::string& name) const override;
  void after_init_value(const std::string& name, at::Tensor& values) const override;

 private:
  RopeSpec rope_;
  std::shared_ptr<Backbone> model_;
};

}  // namespace colossus::models
