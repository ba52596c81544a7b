#include "colossus/models/mixtral.h"

#include "colossus/core/errors.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

namespace colossus::models {

MixtralDecoderLayer::MixtralDecoderLayer(const MixtralConfig& config, const at::TensorOptions& options, int64_t layer)
    : TransformerBlock(config.is_qwen_moe() ? "QwenMoeDecoderLayer" : "MixtralDecoderLayer"),
      moe_name_(config.is_qwen_moe() ? "mlp" : "block_sparse_moe") {
  self_attn_ = register_module("self_attn", std::make_shared<LlamaAttention>(config, options, layer));
  if (config.is_sparse_layer(layer)) {
    moe_ = register_module(moe_name_, std::make_shared<SparseMoeBlock>(config, options));
  } else {
    mlp_ = register_module("mlp", std::make_shared<LlamaMLP>(config, options));  // intermediate_size wide
  }
  add_layer("input_layernorm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options));
  add_layer("post_attention_layernorm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options));
}

void MixtralDecoderLayer::replace_moe(std::shared_ptr<SparseMoeBlock> moe) {
  TORCH_CHECK(moe != nullptr, "replace_moe: null block");
  TORCH_CHECK(moe_ != nullptr, "replace_moe: this layer has a dense MLP, no MoE block");
  replace_module(moe_name_, moe);
  moe_ = std::move(moe);
}

at::Tensor MixtralDecoderLayer::forward(const at::Tensor& hidden, const BlockContext& context) {
  TORCH_CHECK(context.rope_cos.defined(), "MixtralDecoderLayer needs RoPE cos/sin in its BlockContext");
  at::Tensor h = hidden + self_attn_->forward(layer("input_layernorm").forward(hidden), context);
  at::Tensor normed = layer("post_attention_layernorm").forward(h);
  return h + (moe_ ? moe_->forward(normed) : mlp_->forward(normed));
}

SparseMoeBlock& MixtralDecoderLayer::moe() const {
  TORCH_CHECK(moe_ != nullptr, "MixtralDecoderLayer::moe: this layer has a dense MLP (is_sparse() is false)");
  return *moe_;
}

namespace {

const char* class_name(const MixtralConfig& config) {
  if (config.moe_family == "qwen2_moe") return "Qwen2MoeForCausalLM";
  if (config.moe_family == "qwen3_moe") return "Qwen3MoeForCausalLM";
  return "MixtralForCausalLM";
}

}  // namespace

MixtralForCausalLM::MixtralForCausalLM(const MixtralConfig& config, const at::TensorOptions& options)
    : CausalLM(class_name(config), config), rope_(rope_spec(config)) {
  config.validate();
  model_ = register_module("model", std::make_shared<Backbone>("MixtralModel"));
  model_->add_layer("embed_tokens",
                    std::make_shared<Embedding>(config.vocab_size, config.hidden_size, config.pad_token_id, options));
  auto layers = model_->register_module("layers", std::make_shared<torch::nn::Module>("BlockList"));
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i)
    blocks.push_back(std::make_shared<MixtralDecoderLayer>(config, options, i));
  set_blocks(layers, std::move(blocks));
  model_->add_layer("norm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options));
  if (!config.tie_word_embeddings) {
    add_layer("lm_head", std::make_shared<Linear>(config.hidden_size, config.vocab_size, false, options));
  }
}

at::Tensor MixtralForCausalLM::embed(const at::Tensor& input_ids) {
  check_input_ids(input_ids);
  return embedding().forward(input_ids);
}

BlockContext MixtralForCausalLM::block_context(const at::Tensor& hidden) const {
  auto [cos, sin] = rope_cos_sin(rope_, hidden.size(1), hidden.options());
  return BlockContext{.rope_cos = cos, .rope_sin = sin};
}

at::Tensor MixtralForCausalLM::embed_at(const at::Tensor& input_ids, const at::Tensor&, int64_t) {
  return embed(input_ids);
}

BlockContext MixtralForCausalLM::block_context_at(const at::Tensor& hidden, const at::Tensor& positions,
                                                  int64_t position_limit) const {
  auto [cos, sin] = rope_cos_sin(rope_, position_limit, hidden.options());
  return BlockContext{.rope_cos = rope_rows(cos, positions), .rope_sin = rope_rows(sin, positions)};
}

at::Tensor MixtralForCausalLM::final_norm(const at::Tensor& hidden) { return norm().forward(hidden); }

at::Tensor MixtralForCausalLM::head(const at::Tensor& hidden) {
  if (Layer* projection = lm_head()) return projection->forward(hidden);
  return at::linear(hidden, embedding().weight);
}

Embedding& MixtralForCausalLM::embedding() const { return model_->layer_as<Embedding>("embed_tokens"); }
Layer& MixtralForCausalLM::norm() const { return model_->layer("norm"); }
Layer* MixtralForCausalLM::lm_head() const { return has_layer("lm_head") ? &layer("lm_head") : nullptr; }

std::vector<SparseMoeBlock*> MixtralForCausalLM::moe_blocks() const {
  std::vector<SparseMoeBlock*> out;
  for (const auto& block : blocks()) {
    // A wrapper block (ZeRO-3, checkpointing) adopts the layer's children, so
    // look the MoE block up by name; a Qwen-MoE layer's "mlp" may be dense.
    auto children = block->named_children();
    const bool qwen = mixtral_config().is_qwen_moe();
    const char* name = qwen ? "mlp" : "block_sparse_moe";
    auto* moe = children.contains(name) ? dynamic_cast<SparseMoeBlock*>(children[name].get()) : nullptr;
    TORCH_CHECK(moe != nullptr || (qwen && children.contains(name)), class_name(mixtral_config()),
                ": a block has no ", name);
    if (moe != nullptr) out.push_back(moe);
  }
  return out;
}

std::vector<at::Tensor> MixtralForCausalLM::router_logits() const {
  std::vector<at::Tensor> out;
  for (SparseMoeBlock* moe : moe_blocks()) {
    if (!moe->last_router_logits().defined())
      throw ConfigError("MixtralForCausalLM: router logits are read before any forward");
    out.push_back(moe->last_router_logits());
  }
  return out;
}

at::Tensor MixtralForCausalLM::aux_loss() const {
  const auto& c = mixtral_config();
  const std::vector<at::Tensor> logits = router_logits();
  if (logits.empty()) return at::zeros({}, embedding().weight.options().dtype(at::kFloat));  // every layer dense
  return moe::load_balancing_loss(logits, c.num_local_experts, c.num_experts_per_tok);
}

int64_t MixtralForCausalLM::dropped_tokens() const {
  int64_t total = 0;
  for (SparseMoeBlock* moe : moe_blocks()) total += moe->last_dropped();
  return total;
}

at::Tensor MixtralForCausalLM::moe_loss(const at::Tensor& logits, const at::Tensor& labels,
                                        std::optional<int64_t> num_items) const {
  return add_router_losses(causal_lm_loss(logits, labels, num_items));
}

at::Tensor MixtralForCausalLM::add_router_losses(const at::Tensor& lm_loss) const {
  const auto& c = mixtral_config();
  at::Tensor loss = lm_loss;
  if (c.output_router_logits) loss = loss + c.router_aux_loss_coef * aux_loss();
  if (c.router_z_loss_coef > 0 && !moe_blocks().empty()) {
    loss = loss + c.router_z_loss_coef * moe::router_z_loss(router_logits());
  }
  return loss;
}

bool MixtralForCausalLM::has_router_losses() const {
  const auto& c = mixtral_config();
  return c.output_router_logits || c.router_z_loss_coef > 0;
}

CausalLM::InitRule MixtralForCausalLM::init_rule(const std::string& name) const {
  if (name.ends_with("norm.weight")) return {Init::Ones};
  if (name.ends_with(".bias")) return {Init::Zeros};  // Qwen2-MoE's q/k/v bias, as HF's init
  return {Init::Normal, mixtral_config().initializer_range};
}

void MixtralForCausalLM::after_init_value(const std::string& name, at::Tensor& values) const {
  // HF zeroes the padding row of the embedding at init.
  auto pad = mixtral_config().pad_token_id;
  if (pad && name.ends_with("embed_tokens.weight")) values[*pad].zero_();
}

}  // namespace colossus::models
