// The LLaMA-architecture families other than LLaMA itself: Qwen2/2.5, Qwen3,
// Mistral and Gemma 2, read and written under their own config.json keys with
// transformers' defaults (its Qwen2Config, Qwen3Config, MistralConfig, Gemma2Config).
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

LlamaConfig gemma2_defaults() {
  LlamaConfig c;
  c.family = "gemma2";
  c.vocab_size = 256000;
  c.hidden_size = 2304;
  c.intermediate_size = 9216;
  c.num_hidden_layers = 26;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 256;
  c.hidden_act = "gelu_pytorch_tanh";
  c.max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-6;
  c.pad_token_id = 0;
  c.tie_word_embeddings = true;
  c.query_pre_attn_scalar = 256;
  c.sliding_window = 4096;
  c.final_logit_softcapping = 30.0;
  c.attn_logit_softcapping = 50.0;
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

LlamaConfig gemma2_from_json(const json& j) {
  LlamaConfig c = llama_from_json(j, gemma2_defaults(),
                                  {"hidden_activation", "query_pre_attn_scalar", "sliding_window", "layer_types",
                                   "final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention"});
  // Gemma2's MLP has no bias and reads hidden_activation (hidden_act is an old alias transformers ignores).
  c.mlp_bias = false;
  keep_unused(j, c, {"mlp_bias"});
  c.hidden_act = "gelu_pytorch_tanh";
  read(j, "hidden_activation", c.hidden_act);
  read(j, "query_pre_attn_scalar", c.query_pre_attn_scalar);
  read(j, "sliding_window", c.sliding_window);
  read(j, "final_logit_softcapping", c.final_logit_softcapping);
  read(j, "attn_logit_softcapping", c.attn_logit_softcapping);
  read_layer_types(j, c);
  bool bidirectional = false;
  read(j, "use_bidirectional_attention", bidirectional);
  if (bidirectional) {
    throw ConfigError("config.json: \"use_bidirectional_attention\" is true (an encoder); Colossus runs Gemma 2 as a "
                      "causal LM: set it to false or null");
  }
  return c;
}

json gemma2_to_json(const LlamaConfig& c, json j) {
  j["architectures"] = {"Gemma2ForCausalLM"};
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
  std::vector<std::string> types = c.layer_types;
  for (int64_t i = static_cast<int64_t>(types.size()); i < c.num_hidden_layers; ++i) {
    types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");  // transformers' default
  }
  j["layer_types"] = types;
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
  if (family == "gemma2") return gemma2_from_json(j);
  throw ConfigError(fmt::format("config.json: \"model_type\" is \"{}\"; supported: {}", family,
                                "gpt2, llama, qwen2, qwen3, mistral, gemma2, mixtral"));
}

json config_json::llama_family_to_json(const LlamaConfig& c) {
  json j = llama_to_json(c);
  if (c.family == "llama") return j;
  if (c.family == "gemma2") {
    j["model_type"] = c.family;
    j = gemma2_to_json(c, j);
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

int64_t LlamaConfig::layer_window(int64_t layer) const {
  if (!sliding_window) return 0;
  if (family == "gemma2") {
    // transformers' default: the even layers slide, the odd ones see everything.
    const bool sliding = layer_types.empty() ? layer % 2 == 0
                                             : layer_types.at(static_cast<size_t>(layer)) == "sliding_attention";
    return sliding ? *sliding_window : 0;
  }
  if (family == "qwen2" || family == "qwen3") {
    if (!use_sliding_window) return 0;
    const bool sliding = layer_types.empty() ? layer >= max_window_layers
                                             : layer_types.at(static_cast<size_t>(layer)) == "sliding_attention";
    return sliding ? *sliding_window : 0;
  }
  return *sliding_window;
}

}  // namespace colossus::models
