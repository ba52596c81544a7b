// The LLaMA-architecture families other than LLaMA itself: Qwen2/2.5, Qwen3,
// Mistral, Gemma 2, Gemma 3 (text) and Phi-3, read and written under their own
// config.json keys with transformers' defaults (its Qwen2Config, Qwen3Config,
// MistralConfig, Gemma2Config, Gemma3TextConfig, Phi3Config).
#include "colossus/models/config_json.h"

#include <algorithm>

namespace colossus::models {

namespace {

using namespace config_json;

LlamaConfig qwen_defaults(const char* family) {
  LlamaConfig c;
  c.family = family;
  c.vocab_size = 151936;
  c.hidden_size = 4096;
  c.intermediate_size = 22016;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 32;
  c.max_position_embeddings = 32768;
  c.rms_norm_eps = 1e-6;
  c.sliding_window = 4096;
  c.max_window_layers = 28;
  if (c.family == "qwen2") {
    c.qkv_bias = true;
  } else {
    c.qk_norm = true;
    c.head_dim = 128;
  }
  return c;
}

LlamaConfig mistral_defaults() {
  LlamaConfig c;
  c.family = "mistral";
  c.vocab_size = 32000;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 4096 * 32;
  c.rms_norm_eps = 1e-6;
  c.sliding_window = 4096;
  return c;
}

// Keys LLaMA reads that a family's transformers class does not use (its
// projections' biases are fixed): kept as unused JSON, as transformers keeps
// them, instead of changing the model.
void keep_unused(const json& j, LlamaConfig& c, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (j.contains(key)) c.extra[key] = j[key].dump();
  }
}

// transformers' Gemma2Config / Gemma3TextConfig defaults.
LlamaConfig gemma_defaults(const std::string& family) {
  LlamaConfig c;
  c.family = family;
  c.hidden_size = 2304;
  c.intermediate_size = 9216;
  c.num_hidden_layers = 26;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 256;
  c.hidden_act = "gelu_pytorch_tanh";
  c.rms_norm_eps = 1e-6;
  c.pad_token_id = 0;
  c.tie_word_embeddings = true;
  c.query_pre_attn_scalar = 256;
  c.sliding_window = 4096;
  if (family == "gemma2") {
    c.vocab_size = 256000;
    c.max_position_embeddings = 8192;
    c.final_logit_softcapping = 30.0;
    c.attn_logit_softcapping = 50.0;
  } else {
    c.vocab_size = 262208;
    c.max_position_embeddings = 131072;
    c.rope_theta = 1000000.0;
    c.qk_norm = true;
  }
  return c;
}

// Reads layer_types (a list of "full_attention" / "sliding_attention").
void read_layer_types(const json& j, LlamaConfig& c) {
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_string(); })) {
      throw ConfigError(fmt::format("config.json: \"layer_types\" is {} but must be a list of strings", it->dump()));
    }
    c.layer_types = it->get<std::vector<std::string>>();
  }
}

// Gemma 3's RoPE: v5 nests rope_parameters by layer type; v4 has
// rope_theta + rope_scaling for the full layers and rope_local_base_freq.
void read_gemma3_rope(const json& j, LlamaConfig& c) {
  read(j, "rope_local_base_freq", c.rope_local_base_freq);
  const auto it = j.find("rope_parameters");
  if (it == j.end() || !it->is_object() || !(it->contains("full_attention") || it->contains("sliding_attention"))) return;
  c.rope_scaling = {};
  if (auto full = it->find("full_attention"); full != it->end() && !full->is_null()) {
    c.rope_scaling = rope_from_json(*full, "rope_parameters.full_attention");
    read(*full, "rope_theta", c.rope_theta);
  }
  if (auto local = it->find("sliding_attention"); local != it->end() && !local->is_null()) {
    const RopeScaling scaling = rope_from_json(*local, "rope_parameters.sliding_attention");
    if (scaling.rope_type != "default") {
      throw ConfigError(fmt::format("config.json: \"rope_parameters\".sliding_attention.rope_type is \"{}\"; the "
                                    "sliding layers' RoPE must be \"default\" (scaling applies to the full layers)",
                                    scaling.rope_type));
    }
    if (scaling.partial_rotary_factor != 1.0) {
      throw ConfigError(fmt::format("config.json: \"rope_parameters\".sliding_attention.partial_rotary_factor is {}; "
                                    "Gemma 3 rotates whole heads (use 1.0)",
                                    scaling.partial_rotary_factor));
    }
    read(*local, "rope_theta", c.rope_local_base_freq);
  }
  if (auto legacy = j.find("rope_scaling"); legacy != j.end() && !legacy->is_null()) {
    c.rope_scaling = rope_from_json(*legacy, "rope_scaling");  // v4's spelling wins, as in transformers
  }
}

LlamaConfig gemma_from_json(const std::string& family, const json& j) {
  const bool gemma3 = family == "gemma3_text";
  std::set<std::string> known = {"hidden_activation", "query_pre_attn_scalar", "sliding_window", "layer_types",
                                 "final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention"};
  if (gemma3) known.insert({"rope_local_base_freq", "sliding_window_pattern"});
  LlamaConfig c = llama_from_json(j, gemma_defaults(family), known);
  // The MLP has no bias and reads hidden_activation (hidden_act is an old alias transformers ignores).
  c.mlp_bias = false;
  keep_unused(j, c, {"mlp_bias"});
  c.hidden_act = "gelu_pytorch_tanh";
  read(j, "hidden_activation", c.hidden_act);
  read(j, "query_pre_attn_scalar", c.query_pre_attn_scalar);
  read(j, "sliding_window", c.sliding_window);
  read(j, "final_logit_softcapping", c.final_logit_softcapping);
  read(j, "attn_logit_softcapping", c.attn_logit_softcapping);
  read_layer_types(j, c);
  if (gemma3) {
    read_gemma3_rope(j, c);
    // v4's sliding_window_pattern n: every n-th layer is full.
    int64_t pattern = 0;
    read(j, "sliding_window_pattern", pattern);
    if (pattern < 0) throw ConfigError(fmt::format("config.json: \"sliding_window_pattern\" is {}; use >= 1", pattern));
    if (pattern > 0 && c.layer_types.empty()) {
      for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        c.layer_types.push_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
      }
    }
  }
  bool bidirectional = false;
  read(j, "use_bidirectional_attention", bidirectional);
  if (bidirectional) {
    throw ConfigError(fmt::format("config.json: \"use_bidirectional_attention\" is true (an encoder); Colossus runs "
                                  "{} as a causal LM: set it to false or null",
                                  family));
  }
  return c;
}

json gemma_to_json(const LlamaConfig& c, json j) {
  const bool gemma3 = c.family == "gemma3_text";
  j["architectures"] = {gemma3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM"};
  j.erase("mlp_bias");
  j.erase("hidden_act");
  j["hidden_activation"] = c.hidden_act;
  const auto optional = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  // transformers types it int: a whole number is written as one.
  const auto& scalar = c.query_pre_attn_scalar;
  j["query_pre_attn_scalar"] = !scalar                               ? json(nullptr)
                               : *scalar == std::trunc(*scalar) ? json(static_cast<int64_t>(*scalar))
                                                                 : json(*scalar);
  j["final_logit_softcapping"] = optional(c.final_logit_softcapping);
  j["attn_logit_softcapping"] = optional(c.attn_logit_softcapping);
  j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  std::vector<std::string> types;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    types.push_back(c.is_sliding_layer(i) ? "sliding_attention" : "full_attention");
  }
  j["layer_types"] = types;
  if (gemma3) {
    // Both spellings: v5's rope_parameters by layer type, v4's rope_local_base_freq (+ rope_theta/rope_scaling).
    j["rope_local_base_freq"] = c.rope_local_base_freq;
    j["rope_parameters"] = {{"full_attention", rope_to_json(c, true)},
                            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", c.rope_local_base_freq}}}};
  }
  return j;
}

// transformers' Phi3Config defaults (Phi-3-mini-4k).
LlamaConfig phi3_defaults() {
  LlamaConfig c;
  c.family = "phi3";
  c.vocab_size = 32064;
  c.hidden_size = 3072;
  c.intermediate_size = 8192;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5;
  c.pad_token_id = 32000;
  c.rope_scaling.original_max_position_embeddings = 4096;
  return c;
}

// Phi-3 as transformers' Phi3Config reads it: rope_scaling (v4) or else
// rope_parameters (v5), rope_theta inside winning over the top-level key;
// longrope's older names "su" and "yarn"; the top-level
// original_max_position_embeddings (default 4096) over the one inside; an
// absent factor is max_position_embeddings / original_max_position_embeddings.
LlamaConfig phi3_from_json(const json& j) {
  LlamaConfig c = llama_from_json(j, phi3_defaults(), {"original_max_position_embeddings", "sliding_window", "resid_pdrop"});
  c.attention_bias = false;
  c.mlp_bias = false;
  keep_unused(j, c, {"attention_bias", "mlp_bias"});
  read(j, "sliding_window", c.sliding_window);
  read(j, "resid_pdrop", c.resid_pdrop);
  const json* rope = nullptr;
  const char* rope_key = "rope_scaling";
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null() && !(it->is_object() && it->empty())) {
      rope = &*it;
      rope_key = key;
      break;
    }
  }
  c.rope_theta = 10000.0;
  read(j, "rope_theta", c.rope_theta);
  c.rope_scaling = {};
  if (rope != nullptr) {
    c.rope_scaling = rope_from_json(*rope, rope_key);
    read(*rope, "rope_theta", c.rope_theta);
  }
  if (rope == nullptr || !rope->contains("partial_rotary_factor")) {
    read(j, "partial_rotary_factor", c.rope_scaling.partial_rotary_factor);
  }
  if (c.rope_scaling.rope_type == "su" || c.rope_scaling.rope_type == "yarn") c.rope_scaling.rope_type = "longrope";
  int64_t original = 4096;
  read(j, "original_max_position_embeddings", original);
  c.rope_scaling.original_max_position_embeddings = original;
  if (c.rope_scaling.rope_type == "longrope") {
    const bool has_factor = rope->contains("factor") && !(*rope)["factor"].is_null();
    if (!has_factor) {
      c.rope_scaling.factor = static_cast<double>(c.max_position_embeddings) / static_cast<double>(original);
    }
    if (c.rope_scaling.short_factor.empty() || c.rope_scaling.long_factor.empty()) {
      throw ConfigError(fmt::format("config.json: \"{}\" is longrope but lacks short_factor or long_factor", rope_key));
    }
  }
  return c;
}

json phi3_to_json(const LlamaConfig& c, json j) {
  j["architectures"] = {"Phi3ForCausalLM"};
  j.erase("attention_bias");
  j.erase("mlp_bias");
  j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  j["resid_pdrop"] = c.resid_pdrop;
  j["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings.value_or(4096);
  // Also at the top level, where transformers v4's Phi3Config reads it.
  if (c.rope_scaling.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = c.rope_scaling.partial_rotary_factor;
  // Phi3Config defaults pad_token_id to 32000: an unset one is written as null.
  j["pad_token_id"] = c.pad_token_id ? json(*c.pad_token_id) : json(nullptr);
  return j;
}

}  // namespace

LlamaConfig config_json::llama_family_from_json(const std::string& family, const json& j) {
  if (family == "llama") return llama_from_json(j);
  if (family == "qwen2" || family == "qwen3") {
    LlamaConfig defaults = qwen_defaults(family.c_str());
    LlamaConfig c = llama_from_json(j, defaults, {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"});
    if (family == "qwen2") {
      // Qwen2's q/k/v always have a bias and o_proj, the MLP never.
      c.attention_bias = false;
      c.mlp_bias = false;
      keep_unused(j, c, {"attention_bias", "mlp_bias"});
    } else {
      c.mlp_bias = false;
      keep_unused(j, c, {"mlp_bias"});
    }
    read(j, "use_sliding_window", c.use_sliding_window);
    read(j, "sliding_window", c.sliding_window);
    read(j, "max_window_layers", c.max_window_layers);
    read_layer_types(j, c);
    return c;
  }
  if (family == "mistral") {
    LlamaConfig c = llama_from_json(j, mistral_defaults(), {"sliding_window"});
    c.attention_bias = false;
    c.mlp_bias = false;
    keep_unused(j, c, {"attention_bias", "mlp_bias"});
    read(j, "sliding_window", c.sliding_window);
    return c;
  }
  if (family == "gemma2" || family == "gemma3_text") return gemma_from_json(family, j);
  if (family == "phi3") return phi3_from_json(j);
  throw ConfigError(fmt::format("config.json: \"model_type\" is \"{}\"; supported: {}", family,
                                "gpt2, llama, qwen2, qwen3, mistral, gemma2, gemma3_text, phi3, mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3"));
}

json config_json::llama_family_to_json(const LlamaConfig& c) {
  json j = llama_to_json(c);
  if (c.family == "llama") return j;
  if (c.is_gemma() || c.family == "phi3") {
    j["model_type"] = c.family;
    j = c.is_gemma() ? gemma_to_json(c, j) : phi3_to_json(c, j);
    write_extra(j, c.extra);
    return j;
  }
  const std::string architecture = c.family == "qwen2"   ? "Qwen2ForCausalLM"
                                   : c.family == "qwen3" ? "Qwen3ForCausalLM"
                                                         : "MistralForCausalLM";
  j["model_type"] = c.family;
  j["architectures"] = {architecture};
  j.erase("mlp_bias");
  if (c.family != "qwen3") j.erase("attention_bias");
  j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  if (c.family != "mistral") {
    j["use_sliding_window"] = c.use_sliding_window;
    j["max_window_layers"] = c.max_window_layers;
    if (!c.layer_types.empty()) j["layer_types"] = c.layer_types;
  }
  write_extra(j, c.extra);
  return j;
}

std::optional<int64_t> LlamaConfig::attention_window() const {
  for (int64_t layer = 0; layer < num_hidden_layers; ++layer) {
    if (layer_window(layer) > 0) return sliding_window;
  }
  return std::nullopt;
}

int64_t LlamaConfig::window_on_every_layer() const {
  int64_t smallest = 0;
  for (int64_t layer = 0; layer < num_hidden_layers; ++layer) {
    const int64_t window = layer_window(layer);
    if (window == 0) return 0;
    smallest = smallest == 0 ? window : std::min(smallest, window);
  }
  return smallest;
}

bool LlamaConfig::is_sliding_layer(int64_t layer) const {
  if (!layer_types.empty()) return layer_types.at(static_cast<size_t>(layer)) == "sliding_attention";
  // transformers' default patterns.
  if (family == "gemma2") return layer % 2 == 0;                // every other layer, from the first
  if (family == "gemma3_text") return (layer + 1) % 6 != 0;     // five sliding, then one full
  if (family == "qwen2" || family == "qwen3") return layer >= max_window_layers;
  return true;  // Mistral: every layer
}

int64_t LlamaConfig::layer_window(int64_t layer) const {
  if (!sliding_window) return 0;
  if ((family == "qwen2" || family == "qwen3") && !use_sliding_window) return 0;
  return is_sliding_layer(layer) ? *sliding_window : 0;
}

}  // namespace colossus::models
