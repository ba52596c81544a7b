#include "colossus/models/deepseek.h"

#include <ATen/ops/linear.h>

namespace colossus::models {

DeepseekDecoderLayer::DeepseekDecoderLayer(const DeepseekConfig& config, const at::TensorOptions& options,
                                           int64_t layer)
    : TransformerBlock(config.is_v3() ? "DeepseekV3DecoderLayer" : "DeepseekV2DecoderLayer") {
  self_attn_ = register_module("self_attn", std::make_shared<MlaAttention>(config, options));
  if (config.is_moe_layer(layer)) {
    moe_ = register_module("mlp", std::make_shared<DeepseekMoe>(config, options));
  } else {
    dense_ = register_module("mlp", std::make_shared<LlamaMLP>(config, options));
  }
  add_layer("input_layernorm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options));
  add_layer("post_attention_layernorm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options));
}

at::Tensor DeepseekDecoderLayer::forward(const at::Tensor& hidden, const BlockContext& context) {
  TORCH_CHECK(context.rope_cos.defined(), "DeepseekDecoderLayer needs RoPE cos/sin in its BlockContext");
  const at::Tensor h = hidden + self_attn_->forward(layer("input_layernorm").forward(hidden), context);
  const at::Tensor normed = layer("post_attention_layernorm").forward(h);
  return h + (moe_ ? moe_->forward(normed) : dense_->forward(normed));
}

DeepseekForCausalLM::DeepseekForCausalLM(const DeepseekConfig& config, const at::TensorOptions& options)
    : CausalLM(config.is_v3() ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM", config), rope_(rope_spec(config)) {
  config.validate();
  model_ = register_module("model", std::make_shared<Backbone>(config.is_v3() ? "DeepseekV3Model" : "DeepseekV2Model"));
  model_->add_layer("embed_tokens",
                    std::make_shared<Embedding>(config.vocab_size, config.hidden_size, config.pad_token_id, options));
  auto layers = model_->register_module("layers", std::make_shared<torch::nn::Module>("BlockList"));
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) blocks.push_back(std::make_shared<DeepseekDecoderLayer>(config, options, i));
  set_blocks(layers, std::move(blocks));
  model_->add_layer("norm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options));
  if (!config.tie_word_embeddings) {
    add_layer("lm_head", std::make_shared<Linear>(config.hidden_size, config.vocab_size, false, options));
  }
}

at::Tensor DeepseekForCausalLM::embed(const at::Tensor& input_ids) {
  check_input_ids(input_ids);
  return embedding().forward(input_ids);
}

BlockContext DeepseekForCausalLM::block_context(const at::Tensor& hidden) const {
  auto [cos, sin] = rope_.first(hidden, hidden.size(1));
  return BlockContext{.rope_cos = cos, .rope_sin = sin};
}

at::Tensor DeepseekForCausalLM::embed_at(const at::Tensor& input_ids, const at::Tensor&, int64_t) {
  return embed(input_ids);
}

BlockContext DeepseekForCausalLM::block_context_at(const at::Tensor& hidden, const at::Tensor& positions,
                                                   int64_t position_limit) const {
  auto [cos, sin] = rope_.at(hidden, positions, position_limit);
  return BlockContext{.rope_cos = cos, .rope_sin = sin};
}

at::Tensor DeepseekForCausalLM::final_norm(const at::Tensor& hidden) { return norm().forward(hidden); }

at::Tensor DeepseekForCausalLM::head(const at::Tensor& hidden) {
  if (Layer* projection = lm_head()) return projection->forward(hidden);
  return at::linear(hidden, embedding().weight);
}

Embedding& DeepseekForCausalLM::embedding() const { return model_->layer_as<Embedding>("embed_tokens"); }
Layer& DeepseekForCausalLM::norm() const { return model_->layer("norm"); }
Layer* DeepseekForCausalLM::lm_head() const { return has_layer("lm_head") ? &layer("lm_head") : nullptr; }

std::vector<DeepseekMoe*> DeepseekForCausalLM::moe_blocks() const {
  std::vector<DeepseekMoe*> out;
  for (const auto& block : blocks()) {
    // Looked up by name: a wrapper block (ZeRO-3, checkpointing) adopts the layer's children.
    auto children = block->named_children();
    if (!children.contains("mlp")) continue;
    if (auto* moe = dynamic_cast<DeepseekMoe*>(children["mlp"].get())) out.push_back(moe);
  }
  return out;
}

void DeepseekForCausalLM::update_router_biases() {
  const DeepseekConfig& c = deepseek_config();
  if (!c.is_v3() || c.router_bias_update_speed == 0.0) return;
  for (DeepseekMoe* moe : moe_blocks()) moe->update_bias(c.router_bias_update_speed);
}

CausalLM::InitRule DeepseekForCausalLM::init_rule(const std::string& name) const {
  if (name.ends_with("norm.weight")) return {Init::Ones};
  if (name.ends_with(".bias")) return {Init::Zeros};
  return {Init::Normal, deepseek_config().initializer_range};
}

void DeepseekForCausalLM::after_init_value(const std::string& name, at::Tensor& values) const {
  // HF zeroes the padding row of the embedding at init.
  auto pad = deepseek_config().pad_token_id;
  if (pad && name.ends_with("embed_tokens.weight")) values[*pad].zero_();
}

}  // namespace colossus::models
