#include "colossus/models/config.h"
#include "colossus/models/config_json.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace colossus::models {

namespace {

using namespace config_json;

GPT2Config gpt2_from_json(const json& j) {
  GPT2Config c;
  read(j, "vocab_size", c.vocab_size);
  read(j, "n_positions", c.n_positions);
  read(j, "n_embd", c.n_embd);
  read(j, "n_layer", c.n_layer);
  read(j, "n_head", c.n_head);
  read(j, "n_inner", c.n_inner);
  read(j, "activation_function", c.activation_function);
  read(j, "resid_pdrop", c.resid_pdrop);
  read(j, "embd_pdrop", c.embd_pdrop);
  read(j, "attn_pdrop", c.attn_pdrop);
  read(j, "layer_norm_epsilon", c.layer_norm_epsilon);
  read(j, "initializer_range", c.initializer_range);
  read(j, "scale_attn_weights", c.scale_attn_weights);
  read(j, "scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx);
  read(j, "tie_word_embeddings", c.tie_word_embeddings);
  bool cross_attention = false;
  read(j, "add_cross_attention", cross_attention);
  if (cross_attention) throw ConfigError("config.json: \"add_cross_attention\" is true; only decoder-only GPT-2 (false) is supported");
  c.extra = collect_extra(j, {"model_type", "architectures", "vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
                              "n_inner", "activation_function", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                              "layer_norm_epsilon", "initializer_range", "scale_attn_weights",
                              "scale_attn_by_inverse_layer_idx", "tie_word_embeddings", "add_cross_attention"});
  return c;
}

json gpt2_to_json(const GPT2Config& c) {
  json j = {{"model_type", "gpt2"},
            {"architectures", {"GPT2LMHeadModel"}},
            {"vocab_size", c.vocab_size},
            {"n_positions", c.n_positions},
            {"n_embd", c.n_embd},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_inner", c.n_inner ? json(*c.n_inner) : json(nullptr)},
            {"activation_function", c.activation_function},
            {"resid_pdrop", c.resid_pdrop},
            {"embd_pdrop", c.embd_pdrop},
            {"attn_pdrop", c.attn_pdrop},
            {"layer_norm_epsilon", c.layer_norm_epsilon},
            {"initializer_range", c.initializer_range},
            {"scale_attn_weights", c.scale_attn_weights},
            {"scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"add_cross_attention", false}};
  write_extra(j, c.extra);
  return j;
}

}  // namespace

RopeScaling config_json::rope_from_json(const json& r, const char* key) {
  if (!r.is_object()) throw ConfigError(fmt::format("config.json: \"{}\" is {} but must be an object or null", key, r.dump()));
  RopeScaling s;
  // transformers before 4.45 called the field "type".
  read(r, "type", s.rope_type);
  read(r, "rope_type", s.rope_type);
  read(r, "factor", s.factor);
  read(r, "low_freq_factor", s.low_freq_factor);
  read(r, "high_freq_factor", s.high_freq_factor);
  read(r, "original_max_position_embeddings", s.original_max_position_embeddings);
  read(r, "attention_factor", s.attention_factor);
  for (auto [name, out] : {std::pair{"short_factor", &s.short_factor}, std::pair{"long_factor", &s.long_factor}}) {
    auto it = r.find(name);
    if (it == r.end() || it->is_null()) continue;
    if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_number(); })) {
      throw ConfigError(fmt::format("config.json: \"{}\".{} is {} but must be a list of numbers", key, name, it->dump()));
    }
    *out = it->get<std::vector<double>>();
  }
  read(r, "partial_rotary_factor", s.partial_rotary_factor);
  // yarn's; transformers reads a beta of 0 or null as its default.
  read(r, "beta_fast", s.beta_fast);
  read(r, "beta_slow", s.beta_slow);
  if (s.beta_fast == 0.0) s.beta_fast = 32.0;
  if (s.beta_slow == 0.0) s.beta_slow = 1.0;
  read(r, "mscale", s.mscale);
  read(r, "mscale_all_dim", s.mscale_all_dim);
  read(r, "truncate", s.truncate);
  return s;
}

json config_json::rope_to_json(const LlamaConfig& c, bool with_theta) {
  const RopeScaling& s = c.rope_scaling;
  json r = {{"rope_type", s.rope_type}};
  if (with_theta) r["rope_theta"] = c.rope_theta;
  if (s.rope_type != "default") r["factor"] = s.factor;
  if (s.rope_type == "llama3") {
    r["low_freq_factor"] = s.low_freq_factor;
    r["high_freq_factor"] = s.high_freq_factor;
    r["original_max_position_embeddings"] = s.original_max_position_embeddings.value_or(c.max_position_embeddings);
  }
  if (s.partial_rotary_factor != 1.0) r["partial_rotary_factor"] = s.partial_rotary_factor;
  if (s.rope_type == "longrope") {
    r["short_factor"] = s.short_factor;
    r["long_factor"] = s.long_factor;
    r["original_max_position_embeddings"] = s.original_max_position_embeddings.value_or(c.max_position_embeddings);
    if (s.attention_factor) r["attention_factor"] = *s.attention_factor;
  }
  if (s.rope_type == "yarn") {
    r["original_max_position_embeddings"] = s.original_max_position_embeddings.value_or(c.max_position_embeddings);
    r["beta_fast"] = s.beta_fast;
    r["beta_slow"] = s.beta_slow;
    if (s.mscale) r["mscale"] = *s.mscale;
    if (s.mscale_all_dim) r["mscale_all_dim"] = *s.mscale_all_dim;
    if (s.attention_factor) r["attention_factor"] = *s.attention_factor;
    if (!s.truncate) r["truncate"] = false;
  }
  return r;
}


LlamaConfig config_json::llama_from_json(const json& j, LlamaConfig defaults, const std::set<std::string>& known) {
  LlamaConfig c = std::move(defaults);
  read(j, "vocab_size", c.vocab_size);
  read(j, "hidden_size", c.hidden_size);
  read(j, "intermediate_size", c.intermediate_size);
  read(j, "num_hidden_layers", c.num_hidden_layers);
  read(j, "num_attention_heads", c.num_attention_heads);
  read(j, "num_key_value_heads", c.num_key_value_heads);
  read(j, "head_dim", c.head_dim);
  read(j, "hidden_act", c.hidden_act);
  read(j, "max_position_embeddings", c.max_position_embeddings);
  read(j, "initializer_range", c.initializer_range);
  read(j, "rms_norm_eps", c.rms_norm_eps);
  read(j, "rope_theta", c.rope_theta);
  read(j, "attention_bias", c.attention_bias);
  read(j, "mlp_bias", c.mlp_bias);
  read(j, "attention_dropout", c.attention_dropout);
  read(j, "tie_word_embeddings", c.tie_word_embeddings);
  read(j, "pad_token_id", c.pad_token_id);
  // Top level (v4) or inside rope_parameters (v5; it wins there).
  double partial_rotary_factor = 1.0;
  read(j, "partial_rotary_factor", partial_rotary_factor);
  c.rope_scaling.partial_rotary_factor = partial_rotary_factor;
  // v4 writes rope_theta + rope_scaling, v5 writes rope_parameters (theta inside).
  // Like transformers v5, rope_scaling wins when both are present.
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    c.rope_scaling = rope_from_json(*it, "rope_parameters");
    if (!it->contains("partial_rotary_factor")) c.rope_scaling.partial_rotary_factor = partial_rotary_factor;
    read(*it, "rope_theta", c.rope_theta);
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    c.rope_scaling = rope_from_json(*it, "rope_scaling");
    if (!it->contains("partial_rotary_factor")) c.rope_scaling.partial_rotary_factor = partial_rotary_factor;
    read(*it, "rope_theta", c.rope_theta);
  }
  std::set<std::string> read_here = {"model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size",
                                     "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                                     "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps",
                                     "rope_theta", "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias",
                                     "attention_dropout", "tie_word_embeddings", "pad_token_id", "partial_rotary_factor"};
  read_here.insert(known.begin(), known.end());
  c.extra = collect_extra(j, read_here);
  return c;
}

json config_json::llama_to_json(const LlamaConfig& c) {
  json j = {{"model_type", "llama"},
            {"architectures", {"LlamaForCausalLM"}},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.kv_heads()},
            {"head_dim", c.resolved_head_dim()},
            {"hidden_act", c.hidden_act},
            {"max_position_embeddings", c.max_position_embeddings},
            {"initializer_range", c.initializer_range},
            {"rms_norm_eps", c.rms_norm_eps},
            {"attention_bias", c.attention_bias},
            {"mlp_bias", c.mlp_bias},
            {"attention_dropout", c.attention_dropout},
            {"tie_word_embeddings", c.tie_word_embeddings},
            // Both spellings, so transformers v4 (rope_theta/rope_scaling) and
            // v5 (rope_parameters) read the same RoPE.
            {"rope_theta", c.rope_theta},
            {"rope_scaling", c.rope_scaling.rope_type == "default" ? json(nullptr) : rope_to_json(c, false)},
            {"rope_parameters", rope_to_json(c, true)}};
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  write_extra(j, c.extra);
  return j;
}

namespace {

MixtralConfig mixtral_from_json(const json& j) {
  MixtralConfig c = MixtralConfig::defaults();
  // LLaMA's keys; a key absent from the file keeps Mixtral's default.
  static_cast<LlamaConfig&>(c) =
      llama_from_json(j, c, {"num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "router_jitter_noise",
                             "output_router_logits", "sliding_window", "router_z_loss_coef", "capacity_factor"});
  read(j, "num_local_experts", c.num_local_experts);
  read(j, "num_experts_per_tok", c.num_experts_per_tok);
  read(j, "router_aux_loss_coef", c.router_aux_loss_coef);
  read(j, "router_jitter_noise", c.router_jitter_noise);
  read(j, "output_router_logits", c.output_router_logits);
  read(j, "sliding_window", c.sliding_window);
  read(j, "router_z_loss_coef", c.router_z_loss_coef);
  read(j, "capacity_factor", c.capacity_factor);
  return c;
}

json mixtral_to_json(const MixtralConfig& c) {
  json j = llama_to_json(c);
  j["model_type"] = "mixtral";
  j["architectures"] = {"MixtralForCausalLM"};
  j.erase("attention_bias");
  j.erase("mlp_bias");
  j["num_local_experts"] = c.num_local_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  j["router_jitter_noise"] = c.router_jitter_noise;
  j["output_router_logits"] = c.output_router_logits;
  j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  if (c.router_z_loss_coef != 0.0) j["router_z_loss_coef"] = c.router_z_loss_coef;
  if (c.capacity_factor) j["capacity_factor"] = *c.capacity_factor;
  return j;
}

}  // namespace

MixtralConfig MixtralConfig::defaults() {
  MixtralConfig c;
  c.intermediate_size = 14336;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 4096 * 32;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 1e6;
  return c;
}

void MixtralConfig::validate() const {
  LlamaConfig::validate();
  config_json::validate_moe_family(*this);  // biases and the Qwen-MoE switches, by moe_family
  check_positive("MixtralConfig.num_local_experts", num_local_experts);
  if (num_experts_per_tok < 1 || num_experts_per_tok > num_local_experts) {
    throw ConfigError(fmt::format("MixtralConfig.num_experts_per_tok (top-k) is {} but must be in [1, num_local_experts={}]",
                                  num_experts_per_tok, num_local_experts));
  }
  if (!(router_aux_loss_coef >= 0)) throw ConfigError(fmt::format("MixtralConfig.router_aux_loss_coef is {} but must be >= 0", router_aux_loss_coef));
  if (!(router_z_loss_coef >= 0)) throw ConfigError(fmt::format("MixtralConfig.router_z_loss_coef is {} but must be >= 0", router_z_loss_coef));
  check_probability("MixtralConfig.router_jitter_noise", router_jitter_noise);
  if (sliding_window) check_positive("MixtralConfig.sliding_window", *sliding_window);
  if (capacity_factor && !(*capacity_factor > 0)) {
    throw ConfigError(fmt::format("MixtralConfig.capacity_factor is {} but must be > 0 (or unset for dropless routing)", *capacity_factor));
  }
}

void GPT2Config::validate() const {
  check_positive("GPT2Config.vocab_size", vocab_size);
  check_positive("GPT2Config.n_positions", n_positions);
  check_positive("GPT2Config.n_embd", n_embd);
  check_positive("GPT2Config.n_layer", n_layer);
  check_positive("GPT2Config.n_head", n_head);
  check_positive("GPT2Config.n_inner", ffn_size());
  if (n_embd % n_head != 0) {
    throw ConfigError(fmt::format("GPT2Config.n_embd ({}) must be divisible by n_head ({})", n_embd, n_head));
  }
  static const std::set<std::string> activations = {"gelu_new", "gelu_pytorch_tanh", "gelu", "relu", "silu"};
  if (!activations.contains(activation_function)) {
    throw ConfigError(fmt::format("GPT2Config.activation_function is \"{}\"; supported: {}", activation_function,
                                  fmt::join(activations, ", ")));
  }
  check_probability("GPT2Config.resid_pdrop", resid_pdrop);
  check_probability("GPT2Config.embd_pdrop", embd_pdrop);
  check_probability("GPT2Config.attn_pdrop", attn_pdrop);
  if (!(layer_norm_epsilon > 0)) throw ConfigError(fmt::format("GPT2Config.layer_norm_epsilon is {} but must be > 0", layer_norm_epsilon));
  if (!(initializer_range >= 0)) throw ConfigError(fmt::format("GPT2Config.initializer_range is {} but must be >= 0", initializer_range));
}

void LlamaConfig::validate() const {
  check_positive("LlamaConfig.vocab_size", vocab_size);
  check_positive("LlamaConfig.hidden_size", hidden_size);
  check_positive("LlamaConfig.intermediate_size", intermediate_size);
  check_positive("LlamaConfig.num_hidden_layers", num_hidden_layers);
  check_positive("LlamaConfig.num_attention_heads", num_attention_heads);
  check_positive("LlamaConfig.num_key_value_heads", kv_heads());
  check_positive("LlamaConfig.max_position_embeddings", max_position_embeddings);
  if (num_attention_heads % kv_heads() != 0) {
    throw ConfigError(fmt::format("LlamaConfig.num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                                  num_attention_heads, kv_heads()));
  }
  if (!head_dim && hidden_size % num_attention_heads != 0) {
    throw ConfigError(fmt::format("LlamaConfig.hidden_size ({}) must be divisible by num_attention_heads ({}) when head_dim is unset",
                                  hidden_size, num_attention_heads));
  }
  if (resolved_head_dim() <= 0 || resolved_head_dim() % 2 != 0) {
    throw ConfigError(fmt::format("LlamaConfig.head_dim is {} but RoPE needs a positive even head_dim", resolved_head_dim()));
  }
  const bool gemma = is_gemma();
  if (hidden_act != (gemma ? "gelu_pytorch_tanh" : "silu")) {
    throw ConfigError(fmt::format("LlamaConfig.hidden_act is \"{}\"; {} uses {}", hidden_act, family,
                                  gemma ? "gelu_pytorch_tanh" : "silu"));
  }
  if (query_pre_attn_scalar && !gemma) throw ConfigError("LlamaConfig.query_pre_attn_scalar is set, but only Gemma models have it");
  if (query_pre_attn_scalar && !(*query_pre_attn_scalar > 0)) {
    throw ConfigError(fmt::format("LlamaConfig.query_pre_attn_scalar is {} but must be > 0", *query_pre_attn_scalar));
  }
  for (const auto& [key, value] : {std::pair{"attn_logit_softcapping", attn_logit_softcapping},
                                   std::pair{"final_logit_softcapping", final_logit_softcapping}}) {
    if (value && !gemma) throw ConfigError(fmt::format("LlamaConfig.{} is set, but only Gemma models have it", key));
    if (value && !(*value > 0)) throw ConfigError(fmt::format("LlamaConfig.{} is {} but must be > 0", key, *value));
  }
  if (!(rms_norm_eps > 0)) throw ConfigError(fmt::format("LlamaConfig.rms_norm_eps is {} but must be > 0", rms_norm_eps));
  if (!(rope_theta > 0)) throw ConfigError(fmt::format("LlamaConfig.rope_theta is {} but must be > 0", rope_theta));
  if (!(rope_local_base_freq > 0)) {
    throw ConfigError(fmt::format("LlamaConfig.rope_local_base_freq is {} but must be > 0", rope_local_base_freq));
  }
  if (!(initializer_range >= 0)) throw ConfigError(fmt::format("LlamaConfig.initializer_range is {} but must be >= 0", initializer_range));
  check_probability("LlamaConfig.attention_dropout", attention_dropout);
  // Phi-3 takes default and longrope, as transformers' Phi3Config; the others LLaMA's four.
  const bool phi3 = family == "phi3";
  const std::set<std::string> rope_types =
      phi3 ? std::set<std::string>{"default", "longrope"} : std::set<std::string>{"default", "linear", "dynamic", "llama3"};
  const auto& s = rope_scaling;
  if (!rope_types.contains(s.rope_type)) {
    throw ConfigError(fmt::format("LlamaConfig.rope_scaling.rope_type is \"{}\"; {} supports: {}", s.rope_type, family,
                                  fmt::join(rope_types, ", ")));
  }
  // transformers splits a head into rotated and passed parts only in
  // Phi-3's attention; elsewhere a factor other than 1 would not run there.
  if (s.partial_rotary_factor != 1.0) {
    if (!phi3) {
      throw ConfigError(fmt::format("LlamaConfig.rope_scaling.partial_rotary_factor is {}; transformers rotates part of "
                                    "each head only in phi3 models, not in {} (use 1.0)",
                                    s.partial_rotary_factor, family));
    }
    if (!(s.partial_rotary_factor > 0.0 && s.partial_rotary_factor <= 1.0) || rotary_dim() < 2 || rotary_dim() % 2 != 0) {
      throw ConfigError(fmt::format("LlamaConfig.rope_scaling.partial_rotary_factor is {}: int(head_dim {} x factor) = {} "
                                    "rotated dimensions, which must be even and >= 2 (factor in (0, 1], e.g. 0.5)",
                                    s.partial_rotary_factor, resolved_head_dim(), rotary_dim()));
    }
  }
  if (s.rope_type == "longrope") {
    const size_t half = static_cast<size_t>(rotary_dim() / 2);
    for (auto [name, factors] : {std::pair{"short_factor", &s.short_factor}, std::pair{"long_factor", &s.long_factor}}) {
      if (factors->size() != half) {
        throw ConfigError(fmt::format("LlamaConfig.rope_scaling.{} has {} values; longrope needs rotated dimensions / 2 = {}",
                                      name, factors->size(), half));
      }
    }
    if (s.attention_factor && !(*s.attention_factor > 0)) {
      throw ConfigError(fmt::format("LlamaConfig.rope_scaling.attention_factor is {} but must be > 0", *s.attention_factor));
    }
    if (s.original_max_position_embeddings) check_positive("LlamaConfig.rope_scaling.original_max_position_embeddings", *s.original_max_position_embeddings);
  }
  if (!(resid_pdrop >= 0.0 && resid_pdrop < 1.0)) {
    throw ConfigError(fmt::format("LlamaConfig.resid_pdrop is {} but must be in [0, 1)", resid_pdrop));
  }
  if (resid_pdrop != 0.0 && !phi3) throw ConfigError("LlamaConfig.resid_pdrop is set, but only Phi-3 models have it");
  if (s.rope_type != "default" && !(s.factor > 0)) {
    throw ConfigError(fmt::format("LlamaConfig.rope_scaling.factor is {} but must be > 0", s.factor));
  }
  if (s.rope_type == "llama3") {
    if (!(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor)) {
      throw ConfigError(fmt::format("LlamaConfig.rope_scaling needs 0 < low_freq_factor < high_freq_factor for llama3; got {} and {}",
                                    s.low_freq_factor, s.high_freq_factor));
    }
    if (s.original_max_position_embeddings) check_positive("LlamaConfig.rope_scaling.original_max_position_embeddings", *s.original_max_position_embeddings);
  }
  if (pad_token_id && (*pad_token_id < 0 || *pad_token_id >= vocab_size)) {
    throw ConfigError(fmt::format("LlamaConfig.pad_token_id is {} but must be in [0, vocab_size={})", *pad_token_id, vocab_size));
  }
  static const std::set<std::string> families = {"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3"};
  if (!families.contains(family)) {
    throw ConfigError(fmt::format("LlamaConfig.family is \"{}\"; supported: {}", family, fmt::join(families, ", ")));
  }
  if (sliding_window) check_positive("LlamaConfig.sliding_window", *sliding_window);
  if (max_window_layers < 0) throw ConfigError(fmt::format("LlamaConfig.max_window_layers is {} but must be >= 0", max_window_layers));
  if (!layer_types.empty()) {
    if (static_cast<int64_t>(layer_types.size()) != num_hidden_layers) {
      throw ConfigError(fmt::format("LlamaConfig.layer_types lists {} layers but num_hidden_layers is {}",
                                    layer_types.size(), num_hidden_layers));
    }
    for (const auto& type : layer_types) {
      if (type != "full_attention" && type != "sliding_attention") {
        throw ConfigError(fmt::format("LlamaConfig.layer_types holds \"{}\"; use full_attention or sliding_attention", type));
      }
    }
  }
}

std::string model_type(const ModelConfig& config) {
  if (std::holds_alternative<GPT2Config>(config)) return "gpt2";
  if (const auto* d = std::get_if<DeepseekConfig>(&config)) return d->family;
  if (const auto* m = std::get_if<MixtralConfig>(&config)) return m->moe_family;
  return std::get<LlamaConfig>(config).family;
}

int64_t vocab_size(const ModelConfig& config) {
  return std::visit([](const auto& c) { return c.vocab_size; }, config);
}

int64_t hidden_size(const ModelConfig& config) {
  if (const auto* g = std::get_if<GPT2Config>(&config)) return g->n_embd;
  if (const auto* m = std::get_if<MixtralConfig>(&config)) return m->hidden_size;
  if (const auto* d = std::get_if<DeepseekConfig>(&config)) return d->hidden_size;
  return std::get<LlamaConfig>(config).hidden_size;
}

int64_t num_layers(const ModelConfig& config) {
  if (const auto* g = std::get_if<GPT2Config>(&config)) return g->n_layer;
  if (const auto* m = std::get_if<MixtralConfig>(&config)) return m->num_hidden_layers;
  if (const auto* d = std::get_if<DeepseekConfig>(&config)) return d->num_hidden_layers;
  return std::get<LlamaConfig>(config).num_hidden_layers;
}

namespace {

// MLA projections, dense or MoE FFNs (routed + shared + router), norms.
double deepseek_parameters(const DeepseekConfig& c) {
  const double h = static_cast<double>(c.hidden_size), heads = static_cast<double>(c.num_attention_heads);
  const double qk = static_cast<double>(c.qk_head_dim()), r = static_cast<double>(c.kv_lora_rank);
  const double q = c.q_lora_rank ? static_cast<double>(*c.q_lora_rank) * (h + heads * qk + 1) : h * heads * qk;
  const double attention = q + h * (r + static_cast<double>(c.qk_rope_head_dim)) + r +
                           r * heads * static_cast<double>(c.qk_nope_head_dim + c.v_head_dim) +
                           heads * static_cast<double>(c.v_head_dim) * h;
  const double expert = 3 * h * static_cast<double>(c.moe_intermediate_size);
  const double moe = expert * static_cast<double>(c.n_routed_experts + c.n_shared_experts) + h * static_cast<double>(c.n_routed_experts);
  const double dense = 3 * h * static_cast<double>(c.intermediate_size);
  double layers = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers += attention + (c.is_moe_layer(i) ? moe : dense) + 2 * h;
  return static_cast<double>(c.vocab_size) * h * (c.tie_word_embeddings ? 1 : 2) + layers + h;
}

}  // namespace

double estimated_parameters(const ModelConfig& config) {
  if (const auto* g = std::get_if<GPT2Config>(&config)) {
    const double e = static_cast<double>(g->n_embd);
    const double f = static_cast<double>(g->ffn_size());
    const double per_layer = 4 * e * e + 2 * e * f + 9 * e + f;  // + biases and the two norms
    return static_cast<double>(g->vocab_size + g->n_positions) * e * (g->tie_word_embeddings ? 1 : 2) -
           (g->tie_word_embeddings ? 0 : static_cast<double>(g->n_positions) * e) +
           static_cast<double>(g->n_layer) * per_layer + 2 * e;
  }
  if (const auto* d = std::get_if<DeepseekConfig>(&config)) return deepseek_parameters(*d);
  const auto& l = std::holds_alternative<MixtralConfig>(config) ? static_cast<const LlamaConfig&>(std::get<MixtralConfig>(config))
                                                                 : std::get<LlamaConfig>(config);
  const double h = static_cast<double>(l.hidden_size);
  const double d = static_cast<double>(l.resolved_head_dim());
  const double attention = h * d * static_cast<double>(2 * l.num_attention_heads + 2 * l.kv_heads());
  double mlp = 3 * h * static_cast<double>(l.intermediate_size);
  double mlp_total = static_cast<double>(l.num_hidden_layers) * mlp;
  if (const auto* m = std::get_if<MixtralConfig>(&config)) {
    // Sparse layers: experts, router, shared expert; the others (Qwen MoE) a dense MLP.
    const double sparse = 3 * h * static_cast<double>(m->expert_intermediate_size()) *
                              static_cast<double>(m->num_local_experts) +
                          h * static_cast<double>(m->num_local_experts) +
                          3 * h * static_cast<double>(m->shared_expert_intermediate_size) +
                          (m->shared_expert_intermediate_size > 0 ? h : 0.0);  // shared expert and its gate
    mlp_total = 0;
    for (int64_t i = 0; i < m->num_hidden_layers; ++i) mlp_total += m->is_sparse_layer(i) ? sparse : mlp;
  }
  const double norms = 2 * h;
  return static_cast<double>(l.vocab_size) * h * (l.tie_word_embeddings ? 1 : 2) +
         static_cast<double>(l.num_hidden_layers) * (attention + norms) + mlp_total + h;
}

int64_t max_positions(const ModelConfig& config) {
  if (const auto* g = std::get_if<GPT2Config>(&config)) return g->n_positions;
  if (const auto* m = std::get_if<MixtralConfig>(&config)) return m->max_position_embeddings;
  if (const auto* d = std::get_if<DeepseekConfig>(&config)) return d->max_position_embeddings;
  return std::get<LlamaConfig>(config).max_position_embeddings;
}

void validate(const ModelConfig& config) {
  std::visit([](const auto& c) { c.validate(); }, config);
}

ModelConfig config_from_json(const std::string& json_text) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw ConfigError(fmt::format("config.json is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ConfigError("config.json must hold a JSON object");
  std::string type;
  read(j, "model_type", type);
  ModelConfig config;
  if (type == "gpt2") {
    config = gpt2_from_json(j);
  } else if (type == "mixtral") {
    config = mixtral_from_json(j);
  } else if (type == "qwen2_moe" || type == "qwen3_moe") {
    config = qwen_moe_from_json(type, j);
  } else if (type == "deepseek_v2" || type == "deepseek_v3") {
    config = deepseek_from_json(type, j);
  } else {
    config = llama_family_from_json(type, j);  // llama, qwen2, qwen3, mistral, gemma2, gemma3_text, phi3; else refused naming them
  }
  validate(config);
  return config;
}

std::string config_to_json(const ModelConfig& config) {
  json j = std::visit(
      [](const auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, GPT2Config>) return gpt2_to_json(c);
        else if constexpr (std::is_same_v<C, MixtralConfig>) return c.is_qwen_moe() ? qwen_moe_to_json(c) : mixtral_to_json(c);
        else if constexpr (std::is_same_v<C, DeepseekConfig>) return deepseek_to_json(c);
        else return llama_family_to_json(c);
      },
      config);
  return j.dump(2) + "\n";
}

ModelConfig read_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot open model config {}", path));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return config_from_json(text.str());
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: {}", path, e.what()));
  }
}

void write_config(const ModelConfig& config, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  out << config_to_json(config);
  out.close();
  if (!out) throw ConfigError(fmt::format("cannot write model config {}", path));
}

ModelConfig preset(std::string_view name) {
  auto no_dropout = [](GPT2Config c) {
    c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.0;
    return c;
  };
  if (name == "gpt2-124m") return no_dropout(GPT2Config{});
  if (name == "gpt2-350m") return no_dropout(GPT2Config{.n_embd = 1024, .n_layer = 24, .n_head = 16});
  if (name == "gpt2-tiny") {
    return no_dropout(GPT2Config{.vocab_size = 128, .n_positions = 64, .n_embd = 64, .n_layer = 2, .n_head = 4});
  }
  if (name == "llama-1b-like") {
    return LlamaConfig{.vocab_size = 32000,
                       .hidden_size = 2048,
                       .intermediate_size = 5632,
                       .num_hidden_layers = 16,
                       .num_attention_heads = 16,
                       .num_key_value_heads = 8,
                       .max_position_embeddings = 2048};
  }
  if (name == "llama3-8b-like") {
    // Llama-3-8B's shape (issue 28's single-GPU 8B target): 8.03B parameters,
    // GQA 32/8, a 128K vocabulary with an untied head, 8K context.
    return LlamaConfig{.vocab_size = 128256,
                       .hidden_size = 4096,
                       .intermediate_size = 14336,
                       .num_hidden_layers = 32,
                       .num_attention_heads = 32,
                       .num_key_value_heads = 8,
                       .max_position_embeddings = 8192,
                       .rms_norm_eps = 1e-5,
                       .rope_theta = 500000.0};
  }
  if (name == "llama-tiny") {
    return LlamaConfig{.vocab_size = 128,
                       .hidden_size = 64,
                       .intermediate_size = 160,
                       .num_hidden_layers = 2,
                       .num_attention_heads = 4,
                       .num_key_value_heads = 2,
                       .max_position_embeddings = 128};
  }
  if (name == "qwen2-tiny" || name == "qwen3-tiny" || name == "mistral-tiny" || name == "gemma2-tiny" ||
      name == "gemma3-tiny" || name == "phi3-tiny") {
    // The family's defaults at llama-tiny's size.
    const std::string family = name == "gemma3-tiny" ? "gemma3_text" : std::string(name.substr(0, name.find('-')));
    LlamaConfig c = std::get<LlamaConfig>(config_from_json(fmt::format(R"({{"model_type": "{}"}})", family)));
    c.vocab_size = 128;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 128;
    if (family == "mistral") c.sliding_window = 8;  // shorter than the tests' sequences: the window masks
    if (family == "gemma2") {
      c.sliding_window = 8;  // layer 0 slides, layer 1 sees everything
      c.query_pre_attn_scalar = 16;
      c.attn_logit_softcapping = 5.0;  // small enough to bend the tests' scores and logits
      c.final_logit_softcapping = 3.0;
    }
    if (family == "gemma3_text") {
      // A sliding layer (window 8, local RoPE base 10^4) and a full one (base 10^6, linear scaling 4).
      c.layer_types = {"sliding_attention", "full_attention"};
      c.sliding_window = 8;
      c.query_pre_attn_scalar = 16;
      c.rope_scaling = {.rope_type = "linear", .factor = 4.0};
    }
    if (family == "phi3") {
      // No padding row (transformers' default pad id 32000 is past the vocab);
      // longrope over 32 original positions, so the tests' sequences cross it.
      c.pad_token_id.reset();
      c.rope_scaling = {.rope_type = "longrope",
                        .factor = 4.0,
                        .original_max_position_embeddings = 32,
                        .short_factor = {1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0},
                        .long_factor = {1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0}};
    }
    return c;
  }
  if (name == "mixtral-tiny") {
    MixtralConfig c = MixtralConfig::defaults();
    c.vocab_size = 128;
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 128;
    c.num_local_experts = 4;
    c.num_experts_per_tok = 2;
    return c;
  }
  if (name == "qwen2_moe-tiny" || name == "qwen3_moe-tiny") {
    // The family's defaults at mixtral-tiny's size; three layers, the middle one dense (mlp_only_layers),
    // so a model holds both kinds of block.
    const std::string family(name.substr(0, name.find('-')));
    MixtralConfig c = std::get<MixtralConfig>(config_from_json(fmt::format(R"({{"model_type": "{}"}})", family)));
    c.vocab_size = 128;
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 128;
    c.mlp_only_layers = {1};
    c.moe_intermediate_size = 32;
    if (family == "qwen2_moe") {
      c.num_local_experts = 4;
      c.num_experts_per_tok = 2;
      c.shared_expert_intermediate_size = 48;
      c.layer_types.assign(3, "full_attention");
    } else {
      c.num_local_experts = 8;  // many small experts, renormalised top-k as Qwen3-MoE's releases
      c.num_experts_per_tok = 2;
      c.norm_topk_prob = true;
    }
    return c;
  }
  if (name == "deepseek_v2-tiny" || name == "deepseek_v3-tiny") {
    // The family's defaults at mixtral-tiny's size: a dense first layer, then
    // DeepSeekMoE layers (8 routed experts in 2 groups, one shared); V2-Lite's
    // plain q_proj, V3 with a q LoRA bottleneck and its biased sigmoid router.
    const std::string family(name.substr(0, name.find('-')));
    DeepseekConfig c = DeepseekConfig::defaults(family);
    c.vocab_size = 128;
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 4;
    c.max_position_embeddings = 128;
    c.q_lora_rank = family == "deepseek_v3" ? std::optional<int64_t>(32) : std::nullopt;
    c.kv_lora_rank = 32;
    c.qk_nope_head_dim = 16;
    c.qk_rope_head_dim = 8;
    c.head_dim = c.qk_rope_head_dim;
    c.v_head_dim = 16;
    c.moe_intermediate_size = 32;
    c.n_routed_experts = 8;
    c.n_shared_experts = 1;
    c.num_experts_per_tok = 2;
    c.first_k_dense_replace = 1;
    c.n_group = 2;
    c.topk_group = 1;
    if (family == "deepseek_v2") c.topk_method = "group_limited_greedy";
    c.validate();
    return c;
  }
  if (name == "qwen3_moe-a3b-layer" || name == "qwen3_moe-small") {
    // Benchmark shapes (bench/RESULTS.md "moe_train"): one decoder layer of
    // Qwen3-30B-A3B (128 experts of 768, top-8) over a small vocabulary, so
    // the block dominates the step; and a small whole Qwen3-MoE (0.9B
    // parameters, 0.2B active) to train end to end.
    MixtralConfig c = std::get<MixtralConfig>(config_from_json(R"({"model_type": "qwen3_moe"})"));
    const bool layer = name == "qwen3_moe-a3b-layer";
    c.vocab_size = layer ? 2048 : 32000;
    c.hidden_size = layer ? 2048 : 1024;
    c.intermediate_size = layer ? 6144 : 3072;
    c.num_hidden_layers = layer ? 1 : 8;
    c.num_attention_heads = layer ? 32 : 16;
    c.num_key_value_heads = 4;
    c.head_dim = layer ? 128 : 64;
    c.max_position_embeddings = 4096;
    c.rope_theta = 1e6;
    c.num_local_experts = layer ? 128 : 64;
    c.num_experts_per_tok = 8;
    c.moe_intermediate_size = layer ? 768 : 512;
    c.norm_topk_prob = true;
    return c;
  }
  if (name == "deepseek_v2_lite-layer") {
    // One DeepSeekMoE layer of DeepSeek-V2-Lite (MLA with kv_lora_rank 512,
    // 64 routed experts of 1408 + 2 shared, top-6) over a small vocabulary,
    // without V2-Lite's yarn context extension.
    DeepseekConfig c = DeepseekConfig::defaults("deepseek_v2");
    c.vocab_size = 2048;
    c.hidden_size = 2048;
    c.intermediate_size = 10944;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 16;
    c.max_position_embeddings = 4096;
    c.q_lora_rank.reset();  // V2-Lite's plain q_proj
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.head_dim = c.qk_rope_head_dim;
    c.v_head_dim = 128;
    c.moe_intermediate_size = 1408;
    c.n_routed_experts = 64;
    c.n_shared_experts = 2;
    c.num_experts_per_tok = 6;
    c.first_k_dense_replace = 0;
    c.n_group = 1;
    c.topk_group = 1;
    c.validate();
    return c;
  }
  throw ConfigError(fmt::format("unknown model preset \"{}\"; known: {}", name, fmt::join(preset_names(), ", ")));
}

std::vector<std::string> preset_names() {
  return {"gpt2-124m",    "gpt2-350m",  "gpt2-tiny",    "llama-1b-like", "llama3-8b-like", "llama-tiny",
          "qwen2-tiny",   "qwen3-tiny", "mistral-tiny", "gemma2-tiny", "gemma3-tiny", "phi3-tiny", "mixtral-tiny",
          "qwen2_moe-tiny", "qwen3_moe-tiny", "deepseek_v2-tiny", "deepseek_v3-tiny", "qwen3_moe-a3b-layer",
          "qwen3_moe-small", "deepseek_v2_lite-layer"};
}

}  // namespace colossus::models
