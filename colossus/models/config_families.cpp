// The LLaMA-architecture families other than LLaMA itself: Qwen2/2.5, Qwen3
// and Mistral, read and written under their own config.json keys with
// transformers' defaults (its Qwen2Config, Qwen3Config, MistralConfig).
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
    if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
      if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_string(); })) {
        throw ConfigError(fmt::format("config.json: \"layer_types\" is {} but must be a list of strings", it->dump()));
      }
      c.layer_types = it->get<std::vector<std::string>>();
    }
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
  throw ConfigError(fmt::format("config.json: \"model_type\" is \"{}\"; supported: {}", family,
                                "gpt2, llama, qwen2, qwen3, mistral, mixtral"));
}

json config_json::llama_family_to_json(const LlamaConfig& c) {
  json j = llama_to_json(c);
  if (c.family == "llama") return j;
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
  if (family == "qwen2" || family == "qwen3") {
    if (!use_sliding_window || !sliding_window) return std::nullopt;
    const bool any_sliding =
        layer_types.empty() ? max_window_layers < num_hidden_layers
                            : std::find(layer_types.begin(), layer_types.end(), "sliding_attention") != layer_types.end();
    return any_sliding ? sliding_window : std::nullopt;
  }
  return sliding_window;
}

}  // namespace colossus::models
