// The Qwen mixture-of-experts families as MixtralConfig: Qwen2-MoE (model_type
// qwen2_moe: Qwen2's q/k/v bias, a sigmoid-gated shared expert) and Qwen3-MoE
// (qwen3_moe: Qwen3's q/k norms), read and written under their config.json
// keys with transformers' defaults (its Qwen2MoeConfig, Qwen3MoeConfig), and
// what MixtralConfig::validate adds for them.
#include "colossus/models/config_json.h"

#include <algorithm>

namespace colossus::models {

namespace {

using namespace config_json;

// transformers' Qwen2MoeConfig / Qwen3MoeConfig defaults.
MixtralConfig qwen_moe_defaults(const std::string& moe_family) {
  MixtralConfig c;
  c.moe_family = moe_family;
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.num_hidden_layers = 24;
  c.max_position_embeddings = 32768;
  c.rms_norm_eps = 1e-6;
  c.sliding_window = 4096;
  c.norm_topk_prob = false;
  c.router_aux_loss_coef = 0.001;
  if (moe_family == "qwen2_moe") {
    c.family = "qwen2";
    c.qkv_bias = true;
    c.intermediate_size = 5632;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 16;
    c.max_window_layers = 28;
    c.moe_intermediate_size = 1408;
    c.shared_expert_intermediate_size = 5632;
    c.num_local_experts = 60;
    c.num_experts_per_tok = 4;
  } else {
    c.family = "qwen3";
    c.qk_norm = true;
    c.intermediate_size = 6144;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.moe_intermediate_size = 768;
    c.num_local_experts = 128;
    c.num_experts_per_tok = 8;
  }
  return c;
}

void read_mlp_only_layers(const json& j, MixtralConfig& c) {
  auto it = j.find("mlp_only_layers");
  if (it == j.end() || it->is_null()) return;
  if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_number_integer(); })) {
    throw ConfigError(fmt::format("config.json: \"mlp_only_layers\" is {} but must be a list of layer indices", it->dump()));
  }
  c.mlp_only_layers = it->get<std::vector<int64_t>>();
}

}  // namespace

MixtralConfig config_json::qwen_moe_from_json(const std::string& moe_family, const json& j) {
  const bool qwen2 = moe_family == "qwen2_moe";
  MixtralConfig c = qwen_moe_defaults(moe_family);
  std::set<std::string> known = {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                                 "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef",
                                 "output_router_logits", "use_sliding_window", "sliding_window", "router_z_loss_coef",
                                 "capacity_factor"};
  if (qwen2) known.insert({"shared_expert_intermediate_size", "qkv_bias", "max_window_layers", "layer_types"});
  static_cast<LlamaConfig&>(c) = llama_from_json(j, c, known);
  // Keys LLaMA reads that these classes do not (Qwen2-MoE: biases come from qkv_bias; neither has an MLP
  // bias): kept as unused JSON, as transformers keeps them.
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (j.contains(key) && (qwen2 || std::string(key) == "mlp_bias")) c.extra[key] = j[key].dump();
  }
  if (qwen2) c.attention_bias = false;
  c.mlp_bias = false;
  // Qwen3MoeConfig stores num_experts as num_local_experts (its attribute_map) and reads either.
  read(j, "num_experts", c.num_local_experts);
  read(j, "num_local_experts", c.num_local_experts);
  read(j, "num_experts_per_tok", c.num_experts_per_tok);
  read(j, "moe_intermediate_size", c.moe_intermediate_size);
  read(j, "norm_topk_prob", c.norm_topk_prob);
  read(j, "decoder_sparse_step", c.decoder_sparse_step);
  read_mlp_only_layers(j, c);
  read(j, "router_aux_loss_coef", c.router_aux_loss_coef);
  read(j, "output_router_logits", c.output_router_logits);
  read(j, "use_sliding_window", c.use_sliding_window);
  read(j, "sliding_window", c.sliding_window);
  // Qwen2MoeConfig writes sliding_window 0 when use_sliding_window is false: no window, not a bad one.
  if (!c.use_sliding_window && c.sliding_window == 0) c.sliding_window.reset();
  read(j, "router_z_loss_coef", c.router_z_loss_coef);
  read(j, "capacity_factor", c.capacity_factor);
  if (qwen2) {
    read(j, "shared_expert_intermediate_size", c.shared_expert_intermediate_size);
    read(j, "qkv_bias", c.qkv_bias);
    read(j, "max_window_layers", c.max_window_layers);
    if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
      if (!it->is_array() || !std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_string(); })) {
        throw ConfigError(fmt::format("config.json: \"layer_types\" is {} but must be a list of strings", it->dump()));
      }
      c.layer_types = it->get<std::vector<std::string>>();
    } else {
      // Qwen2MoeConfig's own default (not Qwen2's): the even layers below max_window_layers slide.
      for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        const bool sliding = (i + 1) % 2 != 0 && i < c.max_window_layers && c.use_sliding_window;
        c.layer_types.push_back(sliding ? "sliding_attention" : "full_attention");
      }
    }
  }
  return c;
}

json config_json::qwen_moe_to_json(const MixtralConfig& c) {
  const bool qwen2 = c.moe_family == "qwen2_moe";
  json j = llama_to_json(c);
  j["model_type"] = c.moe_family;
  j["architectures"] = {qwen2 ? "Qwen2MoeForCausalLM" : "Qwen3MoeForCausalLM"};
  j.erase("mlp_bias");
  if (qwen2) {
    j.erase("attention_bias");
    j["qkv_bias"] = c.qkv_bias;
    j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    j["max_window_layers"] = c.max_window_layers;
    std::vector<std::string> types;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      types.push_back(c.is_sliding_layer(i) ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
  }
  j["num_experts"] = c.num_local_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.expert_intermediate_size();
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["decoder_sparse_step"] = c.decoder_sparse_step;
  j["mlp_only_layers"] = c.mlp_only_layers;
  j["router_aux_loss_coef"] = c.router_aux_loss_coef;
  j["output_router_logits"] = c.output_router_logits;
  j["use_sliding_window"] = c.use_sliding_window;
  j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  if (c.router_z_loss_coef != 0.0) j["router_z_loss_coef"] = c.router_z_loss_coef;
  if (c.capacity_factor) j["capacity_factor"] = *c.capacity_factor;
  write_extra(j, c.extra);
  return j;
}

bool MixtralConfig::is_sparse_layer(int64_t layer) const {
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return num_local_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

void config_json::validate_moe_family(const MixtralConfig& c) {
  const std::string& type = c.moe_family;
  if (type != "mixtral" && !c.is_qwen_moe()) {
    throw ConfigError(fmt::format("MixtralConfig.moe_family is \"{}\"; supported: mixtral, qwen2_moe, qwen3_moe", type));
  }
  if (c.mlp_bias) throw ConfigError(fmt::format("{}: mlp_bias must be false (its MLPs and experts have no bias)", type));
  if (c.attention_bias && type != "qwen3_moe") {
    throw ConfigError(fmt::format("{}: attention_bias must be false (only qwen3_moe has it{})", type,
                                  type == "qwen2_moe" ? "; qwen2_moe's q/k/v bias is qkv_bias" : ""));
  }
  if (c.decoder_sparse_step < 1) {
    throw ConfigError(fmt::format("{}.decoder_sparse_step is {} but must be >= 1", type, c.decoder_sparse_step));
  }
  for (const int64_t layer : c.mlp_only_layers) {
    if (layer < 0 || layer >= c.num_hidden_layers) {
      throw ConfigError(fmt::format("{}.mlp_only_layers holds {} but layers are 0..{}", type, layer, c.num_hidden_layers - 1));
    }
  }
  if (c.moe_intermediate_size) check_positive("MixtralConfig.moe_intermediate_size", *c.moe_intermediate_size);
  if (c.shared_expert_intermediate_size < 0) {
    throw ConfigError(fmt::format("{}.shared_expert_intermediate_size is {} but must be >= 0", type,
                                  c.shared_expert_intermediate_size));
  }
  if (type == "mixtral") {
    // Mixtral's HF class has none of the Qwen switches: refuse them rather than run another model.
    if (c.shared_expert_intermediate_size != 0 || !c.norm_topk_prob || c.decoder_sparse_step != 1 ||
        !c.mlp_only_layers.empty() || c.moe_intermediate_size) {
      throw ConfigError("mixtral: shared_expert_intermediate_size, norm_topk_prob = false, decoder_sparse_step, "
                        "mlp_only_layers and moe_intermediate_size are Qwen-MoE settings; set moe_family to "
                        "qwen2_moe or qwen3_moe, or leave them at Mixtral's values");
    }
    return;
  }
  const bool qwen2 = type == "qwen2_moe";
  if (c.family != (qwen2 ? "qwen2" : "qwen3") || c.qk_norm == qwen2 || (!qwen2 && c.qkv_bias)) {
    throw ConfigError(fmt::format("{} takes {}'s attention: family \"{}\", qk_norm {}, qkv_bias only for qwen2_moe; got "
                                  "family \"{}\", qk_norm {}, qkv_bias {}",
                                  type, qwen2 ? "Qwen2" : "Qwen3", qwen2 ? "qwen2" : "qwen3", !qwen2, c.family,
                                  c.qk_norm, c.qkv_bias));
  }
  if (qwen2 && c.shared_expert_intermediate_size <= 0) {
    throw ConfigError(fmt::format("qwen2_moe.shared_expert_intermediate_size is {} but every Qwen2-MoE sparse block has "
                                  "a shared expert: use a positive width",
                                  c.shared_expert_intermediate_size));
  }
  if (!qwen2) {
    if (c.shared_expert_intermediate_size != 0) {
      throw ConfigError(fmt::format("qwen3_moe.shared_expert_intermediate_size is {}; Qwen3-MoE has no shared expert "
                                    "(use 0, or qwen2_moe)",
                                    c.shared_expert_intermediate_size));
    }
    // Qwen3MoeConfig slides every layer when use_sliding_window: no per-layer pattern.
    if (!c.layer_types.empty() || c.max_window_layers != 0) {
      throw ConfigError("qwen3_moe: layer_types and max_window_layers must be unset (Qwen3-MoE applies sliding_window "
                        "to every layer when use_sliding_window is true)");
    }
  }
}

}  // namespace colossus::models
