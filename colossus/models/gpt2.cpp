#include "colossus/models/gpt2.h"

#include "colossus/core/errors.h"
#include "colossus/models/activation_checkpoint.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <fmt/format.h>

#include <cmath>

namespace colossus::models {

GPT2Attention::GPT2Attention(const GPT2Config& config, int64_t layer_index, const at::TensorOptions& options)
    : LayerHost("GPT2Attention"),
      head_dim_(config.head_dim()),
      scale_(1.0),
      attn_dropout_(config.attn_pdrop),
      resid_dropout_(config.resid_pdrop) {
  if (config.scale_attn_weights) scale_ = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  if (config.scale_attn_by_inverse_layer_idx) scale_ /= static_cast<double>(layer_index + 1);
  add_layer("c_attn", std::make_shared<Conv1D>(config.n_embd, 3 * config.n_embd, options));
  add_layer("c_proj", std::make_shared<Conv1D>(config.n_embd, config.n_embd, options));
}

at::Tensor GPT2Attention::forward(const at::Tensor& x, const BlockContext& context) {
  // The sequence length is the projection's: under sequence parallelism x is
  // a (B, T/tp, C) shard and c_attn gathers the whole sequence.
  at::Tensor qkv = layer("c_attn").forward(x);
  const int64_t batch = qkv.size(0), seq = qkv.size(1);
  const int64_t width = qkv.size(-1);
  TORCH_CHECK(width % (3 * head_dim_) == 0, "c_attn output width ", width, " is not 3 * heads * head_dim ", head_dim_);
  auto parts = qkv.split(width / 3, -1);
  auto heads = [&](const at::Tensor& t) { return t.view({batch, seq, -1, head_dim_}).transpose(1, 2); };
  const double dropout = is_training() ? attn_dropout_ : 0.0;
  at::Tensor y;
  if (context.attention != nullptr) {
    y = context.attention->attend(context.layer, heads(parts[0]), heads(parts[1]), heads(parts[2]), {.scale = scale_});
  } else if (context.document_mask.defined()) {
    y = causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), {.scale = scale_}, dropout,
                         context.document_mask, context.varlen);
  } else {
    y = at::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), {}, dropout,
                                         /*is_causal=*/true, scale_);
  }
  y = y.transpose(1, 2).reshape({batch, seq, -1});
  return at::dropout(layer("c_proj").forward(y), resid_dropout_, is_training());
}

GPT2MLP::GPT2MLP(const GPT2Config& config, const at::TensorOptions& options)
    : LayerHost("GPT2MLP"), activation_(parse_activation(config.activation_function)), resid_dropout_(config.resid_pdrop) {
  add_layer("c_fc", std::make_shared<Conv1D>(config.n_embd, config.ffn_size(), options));
  add_layer("c_proj", std::make_shared<Conv1D>(config.ffn_size(), config.n_embd, options));
}

void GPT2MLP::set_checkpointed() {
  checkpointed_ = [this](const at::Tensor& x) { return forward_stored(x); };
}

at::Tensor GPT2MLP::forward(const at::Tensor& x) {
  return checkpointed_ ? checkpoint_call(checkpointed_, x) : forward_stored(x);
}

at::Tensor GPT2MLP::forward_stored(const at::Tensor& x) {
  at::Tensor h = apply_activation(activation_, layer("c_fc").forward(x));
  return at::dropout(layer("c_proj").forward(h), resid_dropout_, is_training());
}

GPT2Block::GPT2Block(const GPT2Config& config, int64_t layer_index, const at::TensorOptions& options)
    : TransformerBlock("GPT2Block") {
  add_layer("ln_1", std::make_shared<LayerNorm>(config.n_embd, config.layer_norm_epsilon, options));
  attn_ = register_module("attn", std::make_shared<GPT2Attention>(config, layer_index, options));
  add_layer("ln_2", std::make_shared<LayerNorm>(config.n_embd, config.layer_norm_epsilon, options));
  mlp_ = register_module("mlp", std::make_shared<GPT2MLP>(config, options));
}

bool GPT2Block::checkpoint_mlp() {
  mlp_->set_checkpointed();
  return true;
}

at::Tensor GPT2Block::forward(const at::Tensor& hidden, const BlockContext& context) {
  const at::Tensor attn = attn_->forward(layer("ln_1").forward(hidden), context);
  // The residual add and ln_2 in one kernel each way on CUDA
  // (LayerNorm::forward_add); a replaced ln_2 gets the plain sum.
  if (auto* ln_2 = dynamic_cast<LayerNorm*>(&layer("ln_2"))) {
    auto [normed, h] = ln_2->forward_add(attn, hidden);
    return h + mlp_->forward(normed);
  }
  at::Tensor h = hidden + attn;
  return h + mlp_->forward(layer("ln_2").forward(h));
}

GPT2LMHeadModel::GPT2LMHeadModel(const GPT2Config& config, const at::TensorOptions& options)
    : CausalLM("GPT2LMHeadModel", config) {
  config.validate();
  transformer_ = register_module("transformer", std::make_shared<Backbone>("GPT2Model"));
  transformer_->add_layer("wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd, std::nullopt, options));
  transformer_->add_layer("wpe", std::make_shared<Embedding>(config.n_positions, config.n_embd, std::nullopt, options));
  auto h = transformer_->register_module("h", std::make_shared<torch::nn::Module>("BlockList"));
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  for (int64_t i = 0; i < config.n_layer; ++i) blocks.push_back(std::make_shared<GPT2Block>(config, i, options));
  set_blocks(h, std::move(blocks));
  transformer_->add_layer("ln_f", std::make_shared<LayerNorm>(config.n_embd, config.layer_norm_epsilon, options));
  if (!config.tie_word_embeddings) add_layer("lm_head", std::make_shared<Linear>(config.n_embd, config.vocab_size, false, options));
}

at::Tensor GPT2LMHeadModel::embed(const at::Tensor& input_ids) {
  check_input_ids(input_ids);
  const int64_t seq = input_ids.size(1);
  if (seq > gpt2_config().n_positions) {
    throw ConfigError(fmt::format("GPT-2 input has {} tokens but n_positions is {}", seq, gpt2_config().n_positions));
  }
  at::Tensor positions = at::arange(seq, input_ids.options());
  at::Tensor h = embedding().forward(input_ids) + transformer_->layer("wpe").forward(positions);
  return at::dropout(h, gpt2_config().embd_pdrop, is_training());
}

at::Tensor GPT2LMHeadModel::embed_at(const at::Tensor& input_ids, const at::Tensor& positions, int64_t position_limit) {
  check_input_ids(input_ids);
  if (position_limit > gpt2_config().n_positions) {
    throw ConfigError(fmt::format("GPT-2 position {} is past n_positions {}", position_limit - 1, gpt2_config().n_positions));
  }
  at::Tensor h = embedding().forward(input_ids) + transformer_->layer("wpe").forward(positions);
  return at::dropout(h, gpt2_config().embd_pdrop, is_training());
}

BlockContext GPT2LMHeadModel::block_context(const at::Tensor& /*hidden*/) const { return {}; }

BlockContext GPT2LMHeadModel::block_context_at(const at::Tensor& /*hidden*/, const at::Tensor& /*positions*/,
                                               int64_t /*position_limit: GPT-2 adds positions at the embedding*/) const {
  return {};
}

at::Tensor GPT2LMHeadModel::final_norm(const at::Tensor& hidden) { return norm().forward(hidden); }

at::Tensor GPT2LMHeadModel::head(const at::Tensor& hidden) {
  if (Layer* projection = lm_head()) return projection->forward(hidden);
  return at::linear(hidden, embedding().weight);
}

Embedding& GPT2LMHeadModel::embedding() const { return transformer_->layer_as<Embedding>("wte"); }
Layer& GPT2LMHeadModel::norm() const { return transformer_->layer("ln_f"); }
Layer* GPT2LMHeadModel::lm_head() const { return has_layer("lm_head") ? &layer("lm_head") : nullptr; }

CausalLM::InitRule GPT2LMHeadModel::init_rule(const std::string& name) const {
  const GPT2Config& c = gpt2_config();
  auto ends_with = [&](std::string_view suffix) { return name.ends_with(suffix); };
  if (ends_with(".bias")) return {Init::Zeros};
  if (name.find(".ln_") != std::string::npos) return {Init::Ones};
  // GPT-2's scaled init of the two residual projections per block (HF, Megatron).
  if (ends_with("c_proj.weight")) return {Init::Normal, c.initializer_range / std::sqrt(2.0 * static_cast<double>(c.n_layer))};
  return {Init::Normal, c.initializer_range};
}

}  // namespace colossus::models
