// GPT-2 with Hugging Face's GPT2LMHeadModel parameter names and shapes:
// transformer.{wte,wpe,h.N.{ln_1,attn.{c_attn,c_proj},ln_2,mlp.{c_fc,c_proj}},ln_f},
// Conv1D weights stored (in, out), lm_head tied to wte (one saved tensor).
// Head count and FFN width are read from the projections' output widths at
// forward time, so a tensor-parallel sharder may slice them.
#pragma once
#include "colossus/models/causal_lm.h"
#include "colossus/models/config.h"
#include "colossus/models/layers.h"

#include <ATen/core/Tensor.h>

#include <functional>

namespace colossus::models {

class GPT2Attention : public LayerHost {
 public:
  GPT2Attention(const GPT2Config& config, int64_t layer_index, const at::TensorOptions& options);
  // x: (B, T, C) -> (B, T, C). c_attn gives (B, T, 3 * local_heads * head_dim),
  // laid out [q | k | v]; local_heads follows from that width. The context's
  // attention hook, when set, replaces causal SDPA.
  at::Tensor forward(const at::Tensor& x, const BlockContext& context = {});

 private:
  int64_t head_dim_;
  double scale_;
  double attn_dropout_;
  double resid_dropout_;
};

class GPT2MLP : public LayerHost {
 public:
  GPT2MLP(const GPT2Config& config, const at::TensorOptions& options);
  // x: (B, T, C) -> (B, T, C) through c_fc (C -> local FFN width) and c_proj.
  at::Tensor forward(const at::Tensor& x);
  // Selective checkpointing: forward keeps only x, backward reruns the MLP.
  void set_checkpointed();

 private:
  at::Tensor forward_stored(const at::Tensor& x);  // forward, every intermediate kept for backward
  Activation activation_;
  double resid_dropout_;
  std::function<at::Tensor(const at::Tensor&)> checkpointed_;  // set: forward goes through checkpoint_call
};

class GPT2Block : public TransformerBlock {
 public:
  GPT2Block(const GPT2Config& config, int64_t layer_index, const at::TensorOptions& options);
  // hidden: (B, T, C) -> (B, T, C); pre-norm residual blocks.
  at::Tensor forward(const at::Tensor& hidden, const BlockContext& context) override;
  bool checkpoint_mlp() override;

  GPT2Attention& attn() const { return *attn_; }
  GPT2MLP& mlp() const { return *mlp_; }

 private:
  std::shared_ptr<GPT2Attention> attn_;
  std::shared_ptr<GPT2MLP> mlp_;
};

class GPT2LMHeadModel : public CausalLM {
 public:
  // Parameters are allocated with `options` and left uninitialised; use
  // create_model() for an initialised model.
  GPT2LMHeadModel(const GPT2Config& config, const at::TensorOptions& options);

  const GPT2Config& gpt2_config() const { return std::get<GPT2Config>(config()); }

  // input_ids: (B, T) int64, T <= n_positions -> (B, T, C): token + position embeddings.
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
  std::string blocks_path() const override { return "transformer.h"; }

 protected:
  InitRule init_rule(const std::string& name) const override;

 private:
  std::shared_ptr<Backbone> transformer_;
};

}  // namespace colossus::models
