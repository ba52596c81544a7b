// LLaMA with Hugging Face's LlamaForCausalLM parameter names and shapes, and
// the families built the same way (LlamaConfig::family): Qwen2 (q/k/v bias),
// Qwen3 (self_attn.{q,k}_norm over each head), Mistral (a sliding window):
// model.{embed_tokens,layers.N.{input_layernorm,self_attn.{q,k,v,o}_proj,
// post_attention_layernorm,mlp.{gate,up,down}_proj},norm}, lm_head (untied
// unless tie_word_embeddings). RMSNorm, RoPE (rope_scaling linear/dynamic/llama3),
// grouped-query attention (windowed on the layers that slide), SwiGLU. Local query/kv head counts and FFN width
// come from the projections' output widths at forward time (TP-agnostic).
#pragma once
#include "colossus/models/attention.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/config.h"
#include "colossus/models/layers.h"
#include "colossus/models/rope.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>

namespace colossus::models {

class LlamaAttention : public LayerHost {
 public:
  // layer: the block's index, which picks its sliding window (LlamaConfig::layer_window).
  LlamaAttention(const LlamaConfig& config, const at::TensorOptions& options, int64_t layer = 0);
  // x: (B, T, C) -> (B, T, C). q_proj gives (B, T, local_heads * head_dim),
  // k_proj/v_proj (B, T, local_kv_heads * head_dim); local_heads must be a
  // multiple of local_kv_heads. context: RoPE cos/sin (T, head_dim).
  // Training runs q/k/v_proj as one matmul each way where all three are
  // plain Linear layers (merged_linear.h); their weights are allocated back
  // to back for it.
  at::Tensor forward(const at::Tensor& x, const BlockContext& context);
  // Inference: q, k, v projected by one matmul (weights become row views of one tensor).
  void fuse_projections();
  bool reads_merged(const std::string& name) const override;

 private:
  // heads (..., D) through q_norm / k_norm where the model has them (Qwen3), else unchanged.
  at::Tensor norm_heads(const char* name, const at::Tensor& heads);
  int64_t head_dim_;
  AttentionSpec spec_;  // scale (query_pre_attn_scalar or head_dim), this layer's window, soft cap
  bool sliding_layer_;  // rotates by BlockContext's local RoPE when there is one (Gemma 3)
  double attention_dropout_;
  at::Tensor fused_qkv_, fused_qkv_bias_;
};

class LlamaMLP : public LayerHost {
 public:
  LlamaMLP(const LlamaConfig& config, const at::TensorOptions& options);
  // x: (B, T, C) -> (B, T, C): down(act(gate(x)) * up(x)), act = hidden_act
  // (silu: SwiGLU; gelu_pytorch_tanh: Gemma's GeGLU). Training runs gate/up
  // as one matmul each way where both are plain Linear layers, as attention.
  at::Tensor forward(const at::Tensor& x);
  // residual + forward(x). Inference on CUDA with the fused projections adds
  // the residual in the down projection's matmul (one kernel, no rounded
  // intermediate) and writes it into `residual`, which must not be needed
  // elsewhere.
  at::Tensor forward_add(const at::Tensor& x, at::Tensor residual);
  // Inference: gate and up projected by one matmul.
  void fuse_projections();
  bool reads_merged(const std::string& name) const override;
  // Selective checkpointing: forward keeps only x, backward reruns the MLP.
  void set_checkpointed();

 private:
  // act(gate) * up from the merged projection (fuse_projections()).
  at::Tensor gated(const at::Tensor& x);
  at::Tensor forward_stored(const at::Tensor& x);  // forward, every intermediate kept for backward
  Activation activation_;
  std::function<at::Tensor(const at::Tensor&)> checkpointed_;  // set: forward goes through checkpoint_call
  at::Tensor fused_gate_up_, fused_gate_up_bias_;
};

class LlamaDecoderLayer : public TransformerBlock {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, const at::TensorOptions& options, int64_t layer);
  // hidden: (B, T, C) -> (B, T, C); pre-norm residual blocks.
  at::Tensor forward(const at::Tensor& hidden, const BlockContext& context) override;
  void fuse_projections();
  bool checkpoint_mlp() override;

  LlamaAttention& self_attn() const { return *self_attn_; }
  LlamaMLP& mlp() const { return *mlp_; }

 protected:
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<LlamaMLP> mlp_;
};

class LlamaForCausalLM : public CausalLM {
 public:
  // Parameters are allocated with `options` and left uninitialised; use
  // create_model() for an initialised model.
  LlamaForCausalLM(const LlamaConfig& config, const at::TensorOptions& options);

  // A family's own blocks and norms (Gemma 2: gemma.h) in LLaMA's frame.
  struct Parts {
    std::string name;  // the module name, HF's class name
    std::function<std::shared_ptr<LlamaDecoderLayer>(int64_t layer)> block;
    std::function<std::shared_ptr<Layer>()> norm;
  };
  LlamaForCausalLM(const LlamaConfig& config, const at::TensorOptions& options, const Parts& parts);

  const LlamaConfig& llama_config() const { return std::get<LlamaConfig>(config()); }

  // input_ids: (B, T) int64 -> (B, T, C)
  at::Tensor embed(const at::Tensor& input_ids) override;
  // RoPE cos/sin for positions 0..T-1 in hidden's dtype and device.
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
  void fuse_projections() override;

 protected:
  InitRule init_rule(const std::string& name) const override;
  void after_init_value(const std::string& name, at::Tensor& values) const override;

 private:
  RopeCache rope_;
  std::shared_ptr<Backbone> model_;
};

}  // namespace colossus::models
