// config.json reading and writing shared by the family files
// (config.cpp, config_families.cpp): typed reads that name the key on a
// wrong JSON type, unknown keys kept as JSON text, LLaMA's keys that the
// LLaMA-architecture families extend. Internal to colossus/models.
#pragma once
#include "colossus/core/errors.h"
#include "colossus/models/config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <optional>
#include <set>
#include <string>

namespace colossus::models::config_json {

using nlohmann::json;

template <class T>
inline const char* json_type_name() {
  if constexpr (std::is_same_v<T, bool>) return "a boolean";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else return "a string";
}

// Some writers emit integers as floats (2048.0).
inline bool is_whole_number(const json& value) {
  if (!value.is_number_float()) return false;
  double x = value.get<double>();
  return std::isfinite(x) && x == std::trunc(x);
}

// Reads j[key] into out when present and not null; a value of the wrong JSON
// type is an error naming the key rather than a silent default.
template <class T>
void read(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) ok = it->is_boolean();
  else if constexpr (std::is_integral_v<T>) ok = it->is_number_integer() || is_whole_number(*it);
  else if constexpr (std::is_floating_point_v<T>) ok = it->is_number();
  else ok = it->is_string();
  if (!ok) throw ConfigError(fmt::format("config.json: \"{}\" is {} but must be {}", key, it->dump(), json_type_name<T>()));
  out = it->get<T>();
}

template <class T>
void read(const json& j, const char* key, std::optional<T>& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if (it->is_null()) {
    out.reset();
    return;
  }
  T value{};
  read(j, key, value);
  out = value;
}

// Everything not in `known` goes to extra, as JSON text.
inline ExtraJson collect_extra(const json& j, const std::set<std::string>& known) {
  ExtraJson extra;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!known.contains(it.key())) extra[it.key()] = it.value().dump();
  }
  return extra;
}

inline void write_extra(json& j, const ExtraJson& extra) {
  for (const auto& [key, text] : extra) {
    if (!j.contains(key)) j[key] = json::parse(text);
  }
}

inline void check_positive(const char* what, int64_t value) {
  if (value <= 0) throw ConfigError(fmt::format("{} is {} but must be a positive integer", what, value));
}

inline void check_probability(const char* what, double value) {
  if (!(value >= 0.0 && value < 1.0)) throw ConfigError(fmt::format("{} is {} but must be in [0, 1)", what, value));
}

// One rope_scaling / rope_parameters object (its rope_theta aside); and the
// JSON of c's RoPE (with rope_theta for v5's rope_parameters).
RopeScaling rope_from_json(const json& r, const char* key);
json rope_to_json(const LlamaConfig& c, bool with_theta);

// LLaMA's keys (every LLaMA-architecture family reads them), and its JSON.
// `known` lists the keys the caller reads besides LLaMA's, kept out of extra.
LlamaConfig llama_from_json(const json& j, LlamaConfig defaults = {}, const std::set<std::string>& known = {});
json llama_to_json(const LlamaConfig& c);
// A LLaMA-architecture family by its model_type ("llama", "qwen2", "qwen3",
// "mistral"), with that family's keys and defaults (config_families.cpp).
LlamaConfig llama_family_from_json(const std::string& family, const json& j);
json llama_family_to_json(const LlamaConfig& c);
// Qwen2-MoE / Qwen3-MoE by model_type ("qwen2_moe", "qwen3_moe"), and what
// MixtralConfig::validate checks per moe_family (config_moe_families.cpp).
MixtralConfig qwen_moe_from_json(const std::string& moe_family, const json& j);
json qwen_moe_to_json(const MixtralConfig& c);
void validate_moe_family(const MixtralConfig& c);
// DeepSeek-V2 / V3 ("deepseek_v2", "deepseek_v3"; config_deepseek.cpp).
DeepseekConfig deepseek_from_json(const std::string& family, const json& j);
json deepseek_to_json(const DeepseekConfig& c);

}  // namespace colossus::models::config_json
