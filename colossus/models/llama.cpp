#include "colossus/models/llama.h"

#include <algorithm>
#include <initializer_list>
#include <tuple>
#include <typeinfo>

#include "colossus/core/errors.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/models/fused_layers.h"
#include "colossus/models/merged_linear.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/linear.h>

#include <cmath>

#include <fmt/format.h>

namespace colossus::models {

namespace {

// The named layers when each is a Linear of exactly our type over x (x's
// dtype, device and width; all with a bias or none), else empty. A replaced
// layer (a LoRA wrapper from colossus/lora, an FP8 or a tensor-parallel
// layer) computes more than x W^T + b, which a merged matmul would drop.
std::vector<Linear*> plain_linears(const LayerHost& host, std::initializer_list<const char*> names,
                                   const at::Tensor& x) {
  std::vector<Linear*> linears;
  for (const char* name : names) {
    Layer& layer = host.layer(name);
    if (typeid(layer) != typeid(Linear)) return {};
    auto& linear = static_cast<Linear&>(layer);
    const at::Tensor& w = linear.weight;
    if (!w.defined() || w.dim() != 2 || w.scalar_type() != x.scalar_type() || w.device() != x.device() ||
        w.size(1) != x.size(-1) || (!linears.empty() && linear.bias.defined() != linears.front()->bias.defined()) ||
        (linear.bias.defined() && linear.bias.scalar_type() != x.scalar_type())) {
      return {};
    }
    linears.push_back(&linear);
  }
  return linears;
}

// Training: the named projections of x (..., C) as one matmul each way
// (merged_linear.h) -> (..., sum of their widths), their outputs side by
// side; undefined where they are not all plain Linear layers over x.
at::Tensor merged_projection(const LayerHost& host, std::initializer_list<const char*> names, const at::Tensor& x) {
  const std::vector<Linear*> linears = plain_linears(host, names, x);
  if (linears.empty()) return {};
  std::vector<at::Tensor> weights, biases;
  for (Linear* l : linears) {
    weights.push_back(l->weight);
    if (l->bias.defined()) biases.push_back(l->bias);
  }
  return merged_linear(x, weights, biases);
}

// Allocation: the linears' weights (and biases) as row blocks of one tensor
// each (pack_rows), so that the merged matmul reads them in place.
void pack_linears(const LayerHost& host, std::initializer_list<const char*> names) {
  std::vector<at::Tensor> weights, biases;
  for (const char* name : names) {
    auto& linear = host.layer_as<Linear>(name);
    weights.push_back(linear.weight);
    if (linear.bias.defined()) biases.push_back(linear.bias);
  }
  pack_rows(weights);
  if (biases.size() == weights.size()) pack_rows(biases);
}

}  // namespace

LlamaAttention::LlamaAttention(const LlamaConfig& config, const at::TensorOptions& options, int64_t layer)
    : LayerHost("LlamaAttention"),
      head_dim_(config.resolved_head_dim()),
      spec_{.scale = 1.0 / std::sqrt(config.query_pre_attn_scalar.value_or(static_cast<double>(head_dim_))),
            .window = config.layer_window(layer),
            .softcap = config.attn_logit_softcapping.value_or(0.0)},
      sliding_layer_(config.is_sliding_layer(layer)),
      attention_dropout_(config.attention_dropout) {
  const int64_t c = config.hidden_size, d = head_dim_;
  const bool qkv_bias = config.attention_bias || config.qkv_bias;
  add_layer("q_proj", std::make_shared<Linear>(c, config.num_attention_heads * d, qkv_bias, options));
  add_layer("k_proj", std::make_shared<Linear>(c, config.kv_heads() * d, qkv_bias, options));
  add_layer("v_proj", std::make_shared<Linear>(c, config.kv_heads() * d, qkv_bias, options));
  add_layer("o_proj", std::make_shared<Linear>(config.num_attention_heads * d, c, config.attention_bias, options));
  pack_linears(*this, {"q_proj", "k_proj", "v_proj"});
  if (config.qk_norm) {
    add_layer("q_norm", std::make_shared<RMSNorm>(d, config.rms_norm_eps, options));
    add_layer("k_norm", std::make_shared<RMSNorm>(d, config.rms_norm_eps, options));
  }
}

at::Tensor LlamaAttention::norm_heads(const char* name, const at::Tensor& heads) {
  // Qwen3: each head's vector normalised over head_dim, whatever the layout.
  return has_layer(name) ? layer(name).forward(heads) : heads;
}

at::Tensor LlamaAttention::forward(const at::Tensor& x, const BlockContext& block_context) {
  // A sliding layer of a model with a local RoPE (Gemma 3) rotates by that one.
  BlockContext local;
  if (sliding_layer_ && block_context.local_rope_cos.defined()) {
    local = block_context;
    local.rope_cos = block_context.local_rope_cos;
    local.rope_sin = block_context.local_rope_sin;
    local.rope_sin_signed = block_context.local_rope_sin_signed;
  }
  const BlockContext& context = local.rope_cos.defined() ? local : block_context;
  // The sequence length is the projections': under sequence parallelism x is
  // a (B, T/tp, C) shard and q/k/v_proj gather the whole sequence.
  const int64_t batch = x.size(0);
  // Training: q, k and v from one matmul each way (merged_linear.h); the
  // projections are split views of its (B, T, q | k | v) output, whose
  // backward concatenates their gradients once for the merged backward.
  std::vector<at::Tensor> merged;
  if (is_training()) {
    const at::Tensor qkv = merged_projection(*this, {"q_proj", "k_proj", "v_proj"}, x);
    if (qkv.defined()) {
      merged = qkv.split_with_sizes({layer_as<Linear>("q_proj").weight.size(0),
                                     layer_as<Linear>("k_proj").weight.size(0),
                                     layer_as<Linear>("v_proj").weight.size(0)},
                                    -1);
    }
  }
  // (B, T, H_local * D) of "q_proj", "k_proj" or "v_proj" (index 0, 1, 2).
  const auto project = [&](const char* name, size_t index) {
    at::Tensor projected = merged.empty() ? layer(name).forward(x) : merged[index];
    TORCH_CHECK(projected.size(-1) % head_dim_ == 0, name, " output width ", projected.size(-1),
                " is not a multiple of head_dim ", head_dim_);
    return projected;
  };
  auto heads = [&](const char* name, size_t index) {
    at::Tensor projected = project(name, index);
    return projected.view({batch, projected.size(1), -1, head_dim_}).transpose(1, 2);  // (B, H_local, T, D)
  };
  // Tables are (T, D), or (B, T, D) at per-row positions (a TokenLayout):
  // those broadcast over the heads of (B, H, T, D) with a head axis.
  const auto over_heads = [](const at::Tensor& table) { return table.dim() == 3 ? table.unsqueeze(1) : table; };
  const auto rope = [&](const at::Tensor& x) {
    return context.rope_sin_signed.defined()
               ? apply_rope_signed(x, over_heads(context.rope_cos), over_heads(context.rope_sin_signed))
               : apply_rope(x, over_heads(context.rope_cos), over_heads(context.rope_sin));
  };
  at::Tensor q, k, v;
  if (fused_qkv_.defined() && !is_training()) {
    // One projection for q, k and v (fuse_projections()); the heads are views.
    const auto decode_qkv = decode_linear(x, fused_qkv_, fused_qkv_bias_);
    at::Tensor qkv = decode_qkv ? *decode_qkv : at::linear(x, fused_qkv_, fused_qkv_bias_);
    const int64_t q_width = layer_as<Linear>("q_proj").weight.size(0), kv_width = layer_as<Linear>("k_proj").weight.size(0);
    // The engine's paged cache can take the projection whole: RoPE, the
    // cache write and attention in two launches (AttentionHook::attend_packed).
    if (context.attention != nullptr && !has_layer("q_norm") && context.rope_sin_signed.defined() &&
        context.rope_cos.size(-1) == head_dim_) {
      if (auto y = context.attention->attend_packed(context.layer, qkv, q_width / head_dim_, context.rope_cos,
                                                    context.rope_sin_signed, spec_)) {
        return layer("o_proj").forward(y->transpose(1, 2).reshape({batch, qkv.size(1), -1}));
      }
    }
    const auto split = [&](int64_t start, int64_t width) {
      return qkv.narrow(-1, start, width).view({batch, qkv.size(1), -1, head_dim_}).transpose(1, 2);
    };
    q = rope(norm_heads("q_norm", split(0, q_width)));
    k = rope(norm_heads("k_norm", split(q_width, kv_width)));
    v = split(q_width + kv_width, kv_width);
  } else if (!context.rope_sin_signed.defined()) {
    // RoPE on the projections' own (B, T, H, D) layout, then the head
    // transpose: the elementwise work (and its backward) runs on contiguous,
    // vectorisable memory instead of strided views. Same values.
    // On CUDA one fused kernel rotates q and k together, forward and
    // backward (fused_layers.h); elsewhere the ATen ops.
    // (The merged projection's views have strided rows, which the fused
    // kernel reads in place.)
    const auto bthd = [&](const char* name, size_t index) {
      at::Tensor projected = project(name, index);
      return projected.view({batch, projected.size(1), -1, head_dim_});  // (B, T, H_local, D)
    };
    const at::Tensor q_bthd = norm_heads("q_norm", bthd("q_proj", 0)), k_bthd = norm_heads("k_norm", bthd("k_proj", 1));
    if (auto fused = fused_rope(q_bthd, k_bthd, context.rope_cos, context.rope_sin)) {
      q = fused->first.transpose(1, 2);
      k = fused->second.transpose(1, 2);
    } else {
      const at::Tensor cos = context.rope_cos.unsqueeze(-2), sin = context.rope_sin.unsqueeze(-2);
      q = apply_rope(q_bthd, cos, sin).transpose(1, 2);
      k = apply_rope(k_bthd, cos, sin).transpose(1, 2);
    }
    v = heads("v_proj", 2);
  } else {
    q = rope(norm_heads("q_norm", heads("q_proj", 0)));
    k = rope(norm_heads("k_norm", heads("k_proj", 1)));
    v = heads("v_proj", 2);
  }
  const int64_t local_heads = q.size(1), local_kv_heads = k.size(1), seq = q.size(2);
  TORCH_CHECK(local_heads % local_kv_heads == 0, "local query heads ", local_heads,
              " is not a multiple of local kv heads ", local_kv_heads);
  const at::Tensor y = context.attention != nullptr
                           ? context.attention->attend(context.layer, q, k, v, spec_)
                           : causal_attention(q, k, v, spec_, is_training() ? attention_dropout_ : 0.0,
                                              context.document_mask, context.varlen);
  return layer("o_proj").forward(y.transpose(1, 2).reshape({batch, seq, -1}));
}

LlamaMLP::LlamaMLP(const LlamaConfig& config, const at::TensorOptions& options)
    : LayerHost("LlamaMLP"), activation_(parse_activation(config.hidden_act)) {
  const int64_t c = config.hidden_size, f = config.intermediate_size;
  add_layer("gate_proj", std::make_shared<Linear>(c, f, config.mlp_bias, options));
  add_layer("up_proj", std::make_shared<Linear>(c, f, config.mlp_bias, options));
  add_layer("down_proj", std::make_shared<Linear>(f, c, config.mlp_bias, options));
  pack_linears(*this, {"gate_proj", "up_proj"});
}

at::Tensor LlamaMLP::gated(const at::Tensor& x) {
  if (activation_ == Activation::Silu && !fused_gate_up_bias_.defined()) {
    if (auto fused = decode_gated(x, fused_gate_up_)) return *fused;
  }
  const at::Tensor gate_up = at::linear(x, fused_gate_up_, fused_gate_up_bias_);
  if (activation_ == Activation::Silu) {
    if (auto fused = fused_swiglu_packed(gate_up)) return *fused;
  }
  const int64_t f = gate_up.size(-1) / 2;
  return apply_activation(activation_, gate_up.narrow(-1, 0, f)) * gate_up.narrow(-1, f, f);
}

at::Tensor LlamaMLP::forward_add(const at::Tensor& x, at::Tensor residual) {
  auto* down = dynamic_cast<Linear*>(&layer("down_proj"));
  if (fused_gate_up_.defined() && !is_training() && !at::GradMode::is_enabled() && residual.is_cuda() &&
      down != nullptr && !down->bias.defined() && residual.is_contiguous() && residual.dim() >= 2) {
    const at::Tensor act = gated(x);
    if (auto fused = decode_linear_add(act, down->weight, residual)) return *fused;
    const int64_t c = residual.size(-1);
    residual.view({-1, c}).addmm_(act.reshape({-1, act.size(-1)}), down->weight.t());
    return residual;
  }
  return residual + forward(x);
}

void LlamaMLP::set_checkpointed() {
  checkpointed_ = [this](const at::Tensor& x) { return forward_stored(x); };
}

at::Tensor LlamaMLP::forward(const at::Tensor& x) {
  return checkpointed_ ? checkpoint_call(checkpointed_, x) : forward_stored(x);
}

at::Tensor LlamaMLP::forward_stored(const at::Tensor& x) {
  if (fused_gate_up_.defined() && !is_training()) return layer("down_proj").forward(gated(x));
  if (is_training()) {
    // Training: gate and up from one matmul each way (merged_linear.h). On
    // CUDA the SwiGLU kernel reads the merged (B, T, 2F) output and hands its
    // gradient back in that layout; elsewhere split views.
    const at::Tensor gate_up = merged_projection(*this, {"gate_proj", "up_proj"}, x);  // (B, T, 2 F_local)
    if (gate_up.defined()) {
      if (activation_ == Activation::Silu) {
        if (auto fused = fused_swiglu_packed(gate_up)) return layer("down_proj").forward(*fused);
      }
      const auto parts = gate_up.split_with_sizes(
          {layer_as<Linear>("gate_proj").weight.size(0), layer_as<Linear>("up_proj").weight.size(0)}, -1);
      return layer("down_proj").forward(apply_activation(activation_, parts[0]) * parts[1]);
    }
  }
  const at::Tensor gate = layer("gate_proj").forward(x), up = layer("up_proj").forward(x);  // (B, T, F_local)
  if (activation_ == Activation::Silu) {
    if (auto fused = fused_swiglu(gate, up)) return layer("down_proj").forward(*fused);
  }
  return layer("down_proj").forward(apply_activation(activation_, gate) * up);
}

namespace {

// The linears' weights (and biases) as one tensor each, every weight a view
// of its rows (pack_rows: the parameters stay the same objects over the same
// values, and nothing is copied where construction left them adjacent).
std::pair<at::Tensor, at::Tensor> fuse_rows(const std::vector<Linear*>& linears) {
  std::vector<at::Tensor> weights, biases;
  for (Linear* l : linears) {
    weights.push_back(l->weight);
    if (l->bias.defined()) biases.push_back(l->bias);
  }
  return {pack_rows(weights), biases.size() == linears.size() ? pack_rows(biases) : at::Tensor()};
}

// Only plain Linear layers are fused. A replaced layer (a LoRA wrapper from
// colossus/lora, a tensor-parallel layer) computes more than x W^T, which the
// merged matmul would silently drop, so its projections stay as they are.
bool all_plain_linear(const LayerHost& host, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (dynamic_cast<Linear*>(&host.layer(name)) == nullptr) return false;
  }
  return true;
}

}  // namespace

void LlamaAttention::fuse_projections() {
  if (fused_qkv_.defined() || !all_plain_linear(*this, {"q_proj", "k_proj", "v_proj"})) return;
  std::tie(fused_qkv_, fused_qkv_bias_) =
      fuse_rows({&layer_as<Linear>("q_proj"), &layer_as<Linear>("k_proj"), &layer_as<Linear>("v_proj")});
}

bool LlamaAttention::reads_merged(const std::string& name) const {
  return fused_qkv_.defined() && (name == "q_proj" || name == "k_proj" || name == "v_proj");
}

bool LlamaMLP::reads_merged(const std::string& name) const {
  return fused_gate_up_.defined() && (name == "gate_proj" || name == "up_proj");
}

void LlamaMLP::fuse_projections() {
  if (fused_gate_up_.defined() || !all_plain_linear(*this, {"gate_proj", "up_proj"})) return;
  std::tie(fused_gate_up_, fused_gate_up_bias_) = fuse_rows({&layer_as<Linear>("gate_proj"), &layer_as<Linear>("up_proj")});
}

void LlamaForCausalLM::fuse_projections() {
  for (const auto& block : blocks()) {
    auto* layer = dynamic_cast<LlamaDecoderLayer*>(block.get());
    TORCH_CHECK(layer != nullptr, "LlamaForCausalLM::fuse_projections: a block is not a LlamaDecoderLayer");
    layer->fuse_projections();
  }
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& config, const at::TensorOptions& options, int64_t layer)
    : TransformerBlock("LlamaDecoderLayer") {
  self_attn_ = register_module("self_attn", std::make_shared<LlamaAttention>(config, options, layer));
  mlp_ = register_module("mlp", std::make_shared<LlamaMLP>(config, options));
  add_layer("input_layernorm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options));
  add_layer("post_attention_layernorm", std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options));
}

void LlamaDecoderLayer::fuse_projections() {
  self_attn_->fuse_projections();
  mlp_->fuse_projections();
}

at::Tensor LlamaDecoderLayer::forward(const at::Tensor& hidden, const BlockContext& context) {
  TORCH_CHECK(context.rope_cos.defined(), "LlamaDecoderLayer needs RoPE cos/sin in its BlockContext");
  const at::Tensor attn = self_attn_->forward(layer("input_layernorm").forward(hidden), context);
  // The residual add and the second norm in one kernel each way on CUDA
  // (RMSNorm::forward_add); a replaced norm layer gets the plain sum.
  if (auto* norm = dynamic_cast<RMSNorm*>(&layer("post_attention_layernorm"))) {
    auto [normed, h] = norm->forward_add(attn, hidden);
    return mlp_->forward_add(normed, h);
  }
  at::Tensor h = hidden + attn;
  return h + mlp_->forward(layer("post_attention_layernorm").forward(h));
}

bool LlamaDecoderLayer::checkpoint_mlp() {
  mlp_->set_checkpointed();
  return true;
}

LlamaForCausalLM::LlamaForCausalLM(const LlamaConfig& config, const at::TensorOptions& options)
    : LlamaForCausalLM(config, options,
                       Parts{.name = "LlamaModel",
                             .block = [&](int64_t layer) {
                               return std::make_shared<LlamaDecoderLayer>(config, options, layer);
                             },
                             .norm = [&] {
                               return std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options);
                             }}) {}

LlamaForCausalLM::LlamaForCausalLM(const LlamaConfig& config, const at::TensorOptions& options, const Parts& parts)
    : CausalLM("LlamaForCausalLM", config), rope_(rope_spec(config)) {
  config.validate();
  model_ = register_module("model", std::make_shared<Backbone>(parts.name));
  model_->add_layer("embed_tokens",
                    std::make_shared<Embedding>(config.vocab_size, config.hidden_size, config.pad_token_id, options));
  auto layers = model_->register_module("layers", std::make_shared<torch::nn::Module>("BlockList"));
  std::vector<std::shared_ptr<TransformerBlock>> blocks;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) blocks.push_back(parts.block(i));
  set_blocks(layers, std::move(blocks));
  model_->add_layer("norm", parts.norm());
  if (!config.tie_word_embeddings) {
    add_layer("lm_head", std::make_shared<Linear>(config.hidden_size, config.vocab_size, false, options));
  }
}

at::Tensor LlamaForCausalLM::embed(const at::Tensor& input_ids) {
  check_input_ids(input_ids);
  return embedding().forward(input_ids);
}

BlockContext LlamaForCausalLM::block_context(const at::Tensor& hidden) const {
  auto [cos, sin] = rope_.first(hidden, hidden.size(1));
  return BlockContext{.rope_cos = cos, .rope_sin = sin};
}

at::Tensor LlamaForCausalLM::embed_at(const at::Tensor& input_ids, const at::Tensor& /*positions: RoPE adds them*/,
                                      int64_t /*position_limit: RoPE's table grows to it*/) {
  check_input_ids(input_ids);
  return embedding().forward(input_ids);
}

BlockContext LlamaForCausalLM::block_context_at(const at::Tensor& hidden, const at::Tensor& positions,
                                                int64_t position_limit) const {
  auto [cos, sin] = rope_.at(hidden, positions, position_limit);
  BlockContext context{.rope_cos = cos, .rope_sin = sin};
  if (!at::GradMode::is_enabled()) context.rope_sin_signed = signed_rope_sin(context.rope_sin);
  return context;
}

at::Tensor LlamaForCausalLM::final_norm(const at::Tensor& hidden) { return norm().forward(hidden); }

at::Tensor LlamaForCausalLM::head(const at::Tensor& hidden) {
  if (Layer* projection = lm_head()) return soft_cap_logits(projection->forward(hidden));
  return soft_cap_logits(at::linear(hidden, embedding().weight));
}

Embedding& LlamaForCausalLM::embedding() const { return model_->layer_as<Embedding>("embed_tokens"); }
Layer& LlamaForCausalLM::norm() const { return model_->layer("norm"); }
Layer* LlamaForCausalLM::lm_head() const { return has_layer("lm_head") ? &layer("lm_head") : nullptr; }

CausalLM::InitRule LlamaForCausalLM::init_rule(const std::string& name) const {
  if (name.ends_with("norm.weight")) return {Init::Ones};
  if (name.ends_with(".bias")) return {Init::Zeros};
  return {Init::Normal, llama_config().initializer_range};
}

void LlamaForCausalLM::after_init_value(const std::string& name, at::Tensor& values) const {
  // HF zeroes the padding row of the embedding at init.
  auto pad = llama_config().pad_token_id;
  if (pad && name.ends_with("embed_tokens.weight")) values[*pad].zero_();
}

}  // namespace colossus::models
