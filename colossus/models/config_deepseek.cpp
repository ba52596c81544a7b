// DeepSeek-V2 / V3 config.json: transformers' DeepseekV2Config and
// DeepseekV3Config keys and defaults, DeepSeek's original keys that those
// classes ignore (accepted where they agree with what transformers runs,
// refused by name otherwise), and DeepseekConfig::validate().
#include "colossus/models/config_json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

namespace colossus::models {

DeepseekConfig DeepseekConfig::defaults(const std::string& family) {
  DeepseekConfig c;
  c.family = family;
  c.max_position_embeddings = 2048;
  c.rms_norm_eps = 1e-6;
  c.pad_token_id.reset();
  if (family == "deepseek_v3") {
    c.vocab_size = 129280;
    c.hidden_size = 7168;
    c.intermediate_size = 18432;
    c.num_hidden_layers = 61;
    c.num_attention_heads = 128;
    c.max_position_embeddings = 4096;
    c.moe_intermediate_size = 2048;
    c.n_shared_experts = 1;
    c.n_routed_experts = 256;
    c.routed_scaling_factor = 2.5;
    c.n_group = 8;
    c.topk_group = 4;
    c.num_experts_per_tok = 8;
    c.first_k_dense_replace = 3;
    c.norm_topk_prob = true;
    c.topk_method = "noaux_tc";
  } else {
    c.vocab_size = 102400;
    c.hidden_size = 4096;
    c.intermediate_size = 11008;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
  }
  c.head_dim = c.qk_rope_head_dim;
  return c;
}

namespace config_json {

namespace {

// The keys DeepSeek's own config.json carries that transformers' classes do
// not read: each must say what transformers runs anyway.
void check_ignored_keys(const json& j, const DeepseekConfig& c) {
  const auto refuse = [&](const char* key, const std::string& why) {
    throw ConfigError(fmt::format("config.json: \"{}\" is {}; {}", key, j.at(key).dump(), why));
  };
  if (auto it = j.find("moe_layer_freq"); it != j.end() && !it->is_null() && *it != json(1)) {
    refuse("moe_layer_freq", "transformers puts an MoE FFN on every layer from first_k_dense_replace on (use 1)");
  }
  if (auto it = j.find("ep_size"); it != j.end() && !it->is_null() && *it != json(1)) {
    refuse("ep_size", "expert parallelism is a training/inference plugin setting here, not a config key (use 1)");
  }
  if (auto it = j.find("scoring_func"); it != j.end() && !it->is_null()) {
    const std::string expected = c.is_v3() ? "sigmoid" : "softmax";
    if (*it != json(expected)) {
      refuse("scoring_func", fmt::format("transformers' {} router scores by {} (use \"{}\")", c.family, expected, expected));
    }
  }
  if (auto it = j.find("qk_head_dim"); it != j.end() && !it->is_null() && *it != json(c.qk_head_dim())) {
    refuse("qk_head_dim", fmt::format("it must be qk_nope_head_dim + qk_rope_head_dim = {}", c.qk_head_dim()));
  }
  if (auto it = j.find("num_nextn_predict_layers"); it != j.end() && !it->is_null() && *it != json(0) && *it != json(1)) {
    refuse("num_nextn_predict_layers", "multi-token prediction layers are not built (transformers skips them too)");
  }
}

}  // namespace

DeepseekConfig deepseek_from_json(const std::string& family, const json& j) {
  DeepseekConfig c = DeepseekConfig::defaults(family);
  static const std::set<std::string> known = {
      "q_lora_rank",          "kv_lora_rank",        "qk_nope_head_dim", "qk_rope_head_dim",  "v_head_dim",
      "moe_intermediate_size", "n_routed_experts",   "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace",
      "routed_scaling_factor", "topk_method",        "n_group",          "topk_group",         "norm_topk_prob",
      "rope_interleave",       "aux_loss_alpha",     "seq_aux",          "router_bias_update_speed", "moe_layer_freq",
      "ep_size",               "scoring_func",       "qk_head_dim"};
  static_cast<LlamaConfig&>(c) = llama_from_json(j, c, known);
  c.family = family;
  read(j, "q_lora_rank", c.q_lora_rank);
  read(j, "kv_lora_rank", c.kv_lora_rank);
  read(j, "qk_nope_head_dim", c.qk_nope_head_dim);
  read(j, "qk_rope_head_dim", c.qk_rope_head_dim);
  read(j, "v_head_dim", c.v_head_dim);
  read(j, "moe_intermediate_size", c.moe_intermediate_size);
  read(j, "n_routed_experts", c.n_routed_experts);
  read(j, "n_shared_experts", c.n_shared_experts);
  read(j, "num_experts_per_tok", c.num_experts_per_tok);
  read(j, "first_k_dense_replace", c.first_k_dense_replace);
  read(j, "routed_scaling_factor", c.routed_scaling_factor);
  read(j, "topk_method", c.topk_method);
  read(j, "n_group", c.n_group);
  read(j, "topk_group", c.topk_group);
  read(j, "norm_topk_prob", c.norm_topk_prob);
  read(j, "rope_interleave", c.rope_interleave);
  read(j, "aux_loss_alpha", c.aux_loss_alpha);
  read(j, "seq_aux", c.seq_aux);
  read(j, "router_bias_update_speed", c.router_bias_update_speed);
  // transformers overrides head_dim with the RoPE part of a head.
  c.head_dim = c.qk_rope_head_dim;
  // transformers' V2 router has no n_group default; V3's ignores topk_method.
  if (!c.num_key_value_heads) c.num_key_value_heads = c.num_attention_heads;
  check_ignored_keys(j, c);
  return c;
}

json deepseek_to_json(const DeepseekConfig& c) {
  json j = llama_to_json(c);
  j["model_type"] = c.family;
  j["architectures"] = {c.is_v3() ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  if (c.is_v3()) j.erase("mlp_bias");
  j["q_lora_rank"] = c.q_lora_rank ? json(*c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["qk_head_dim"] = c.qk_head_dim();
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["topk_method"] = c.topk_method;
  j["n_group"] = c.n_group ? json(*c.n_group) : json(nullptr);
  j["topk_group"] = c.topk_group ? json(*c.topk_group) : json(nullptr);
  j["norm_topk_prob"] = c.norm_topk_prob;
  if (c.is_v3()) j["rope_interleave"] = c.rope_interleave;
  if (c.aux_loss_alpha) j["aux_loss_alpha"] = *c.aux_loss_alpha;
  if (c.seq_aux) j["seq_aux"] = *c.seq_aux;
  // Always for V3: the key shows in the effective config and a [model.config] override finds it.
  if (c.is_v3() || c.router_bias_update_speed != 0.001) j["router_bias_update_speed"] = c.router_bias_update_speed;
  return j;
}

}  // namespace config_json

void DeepseekConfig::validate() const {
  const std::string name = is_v3() ? "DeepseekV3Config" : "DeepseekV2Config";
  const auto fail = [&](const std::string& what) { throw ConfigError(fmt::format("{}.{}", name, what)); };
  using config_json::check_positive;
  if (family != "deepseek_v2" && family != "deepseek_v3") fail(fmt::format("family is \"{}\"; use deepseek_v2 or deepseek_v3", family));
  for (auto [key, value] : {std::pair{"vocab_size", vocab_size}, std::pair{"hidden_size", hidden_size},
                            std::pair{"intermediate_size", intermediate_size}, std::pair{"num_hidden_layers", num_hidden_layers},
                            std::pair{"num_attention_heads", num_attention_heads},
                            std::pair{"max_position_embeddings", max_position_embeddings},
                            std::pair{"kv_lora_rank", kv_lora_rank}, std::pair{"qk_nope_head_dim", qk_nope_head_dim},
                            std::pair{"qk_rope_head_dim", qk_rope_head_dim}, std::pair{"v_head_dim", v_head_dim},
                            std::pair{"moe_intermediate_size", moe_intermediate_size},
                            std::pair{"n_routed_experts", n_routed_experts}, std::pair{"n_shared_experts", n_shared_experts}}) {
    if (value <= 0) fail(fmt::format("{} is {} but must be a positive integer", key, value));
  }
  if (q_lora_rank && *q_lora_rank <= 0) fail(fmt::format("q_lora_rank is {}; use a positive rank or null (plain q_proj)", *q_lora_rank));
  if (qk_rope_head_dim % 2 != 0) fail(fmt::format("qk_rope_head_dim is {} but RoPE needs an even size", qk_rope_head_dim));
  if (kv_heads() != num_attention_heads) {
    fail(fmt::format("num_key_value_heads is {} but multi-head latent attention expands keys and values per query head "
                     "(kv_b_proj); use num_attention_heads = {}",
                     kv_heads(), num_attention_heads));
  }
  if (head_dim && *head_dim != qk_rope_head_dim) {
    fail(fmt::format("head_dim is {} but must equal qk_rope_head_dim ({}), as transformers sets it", *head_dim, qk_rope_head_dim));
  }
  if (hidden_act != "silu") fail(fmt::format("hidden_act is \"{}\"; DeepSeek uses silu", hidden_act));
  if (num_experts_per_tok < 1 || num_experts_per_tok > n_routed_experts) {
    fail(fmt::format("num_experts_per_tok is {} but must be in [1, n_routed_experts={}]", num_experts_per_tok, n_routed_experts));
  }
  if (first_k_dense_replace < 0) fail(fmt::format("first_k_dense_replace is {} but must be >= 0", first_k_dense_replace));
  if (!(routed_scaling_factor > 0)) fail(fmt::format("routed_scaling_factor is {} but must be > 0", routed_scaling_factor));
  const std::set<std::string> methods =
      is_v3() ? std::set<std::string>{"noaux_tc"} : std::set<std::string>{"greedy", "group_limited_greedy"};
  if (!methods.contains(topk_method)) {
    fail(fmt::format("topk_method is \"{}\"; transformers' {} routes by: {}", topk_method, family, fmt::join(methods, ", ")));
  }
  if (topk_method != "greedy") {
    if (!n_group || !topk_group) fail(fmt::format("topk_method {} needs n_group and topk_group", topk_method));
    if (*n_group <= 0 || n_routed_experts % *n_group != 0) {
      fail(fmt::format("n_group is {} but must divide n_routed_experts ({})", *n_group, n_routed_experts));
    }
    if (*topk_group < 1 || *topk_group > *n_group) fail(fmt::format("topk_group is {} but must be in [1, n_group={}]", *topk_group, *n_group));
    if (is_v3() && n_routed_experts / *n_group < 2) {
      fail(fmt::format("n_group is {}: V3 scores a group by its two best experts, so groups need >= 2 of the {} experts",
                       *n_group, n_routed_experts));
    }
    if (num_experts_per_tok > *topk_group * (n_routed_experts / *n_group)) {
      fail(fmt::format("num_experts_per_tok is {} but topk_group x experts per group is only {}", num_experts_per_tok,
                       *topk_group * (n_routed_experts / *n_group)));
    }
  }
  if (norm_topk_prob && !is_v3()) {
    fail("norm_topk_prob is true but transformers' DeepSeek-V2 router never renormalises (set false)");
  }
  if (!rope_interleave && !is_v3()) fail("rope_interleave is false but DeepSeek-V2 always rotates interleaved pairs");
  if (!(router_bias_update_speed >= 0)) {
    fail(fmt::format("router_bias_update_speed is {} but must be >= 0 (0 disables the bias updates)", router_bias_update_speed));
  }
  if (!(rms_norm_eps > 0)) fail(fmt::format("rms_norm_eps is {} but must be > 0", rms_norm_eps));
  if (!(rope_theta > 0)) fail(fmt::format("rope_theta is {} but must be > 0", rope_theta));
  if (!(initializer_range >= 0)) fail(fmt::format("initializer_range is {} but must be >= 0", initializer_range));
  config_json::check_probability((name + ".attention_dropout").c_str(), attention_dropout);
  const auto& s = rope_scaling;
  static const std::set<std::string> rope_types = {"default", "linear", "dynamic", "yarn"};
  if (!rope_types.contains(s.rope_type)) {
    fail(fmt::format("rope_scaling.rope_type is \"{}\"; supported: {}", s.rope_type, fmt::join(rope_types, ", ")));
  }
  if (s.rope_type != "default" && !(s.factor > 0)) fail(fmt::format("rope_scaling.factor is {} but must be > 0", s.factor));
  if (s.partial_rotary_factor != 1.0) fail("rope_scaling.partial_rotary_factor must be 1 (qk_rope_head_dim is the rotated part)");
  if (s.rope_type == "yarn" && s.original_max_position_embeddings) {
    check_positive((name + ".rope_scaling.original_max_position_embeddings").c_str(), *s.original_max_position_embeddings);
  }
  if (mlp_bias && is_v3()) fail("mlp_bias is true but DeepSeek-V3's MLPs have no bias");
  if (pad_token_id && (*pad_token_id < 0 || *pad_token_id >= vocab_size)) {
    fail(fmt::format("pad_token_id is {} but must be in [0, vocab_size={})", *pad_token_id, vocab_size));
  }
  if (sliding_window || use_sliding_window || !layer_types.empty()) fail("sliding-window keys are set but DeepSeek attends to every position");
}

}  // namespace colossus::models
