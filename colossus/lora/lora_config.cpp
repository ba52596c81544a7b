#include "colossus/lora/lora_config.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

namespace colossus::lora {

using nlohmann::json;

void LoraConfig::validate() const {
  if (r <= 0) throw ConfigError(fmt::format("lora r = {} must be a positive integer (e.g. 8 or 16)", r));
  if (!std::isfinite(lora_alpha) || lora_alpha <= 0) {
    throw ConfigError(
        fmt::format("lora lora_alpha = {} must be a positive number (e.g. 2 * r = {})", lora_alpha, 2 * r));
  }
  if (!(lora_dropout >= 0.0 && lora_dropout < 1.0)) {
    throw ConfigError(fmt::format("lora lora_dropout = {} must be in [0, 1) (e.g. 0.05)", lora_dropout));
  }
  if (target_modules.empty()) {
    throw ConfigError(
        "lora target_modules is empty; name the layers to adapt, e.g. [\"q_proj\", \"v_proj\"], or \"all-linear\"");
  }
  for (const auto& name : target_modules) {
    if (name.empty())
      throw ConfigError("lora target_modules holds an empty name; give module names such as \"q_proj\"");
    if (name == "all-linear" && target_modules.size() > 1) {
      throw ConfigError(fmt::format(
          "lora target_modules {} mixes \"all-linear\" with names; give either \"all-linear\" alone or names",
          target_modules));
    }
  }
  for (const auto& name : modules_to_save) {
    if (name.empty())
      throw ConfigError("lora modules_to_save holds an empty name; give module names such as \"lm_head\"");
  }
  if (bias != "none" && bias != "all" && bias != "lora_only") {
    throw ConfigError(
        fmt::format("lora bias = \"{}\" is not one of PEFT's \"none\", \"all\", \"lora_only\"", bias));
  }
  if (task_type != "CAUSAL_LM") {
    throw ConfigError(fmt::format(
        "lora task_type = \"{}\" is not supported; Colossus adapts causal LMs: use \"CAUSAL_LM\"", task_type));
  }
}

double LoraConfig::scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / static_cast<double>(r);
}

namespace {

// Keys read into LoraConfig.
const std::set<std::string> kRead = {"peft_type",
                                     "task_type",
                                     "r",
                                     "lora_alpha",
                                     "lora_dropout",
                                     "target_modules",
                                     "modules_to_save",
                                     "bias",
                                     "use_rslora",
                                     "init_lora_weights",
                                     "base_model_name_or_path",
                                     "fan_in_fan_out"};
// Keys that never change what the adapter computes: bookkeeping, or options of
// features whose switch is another key (qalora_group_size needs use_qalora).
// fan_in_fan_out is derived per layer (PEFT sets it for Conv1D, clears it for
// Linear).
const std::set<std::string> kIgnored = {"peft_version",   "revision",      "auto_mapping",
                                        "inference_mode", "megatron_core", "qalora_group_size"};

bool is_off(const json& value) {
  return value.is_null() || (value.is_boolean() && !value.get<bool>()) || (value.is_object() && value.empty()) ||
         (value.is_array() && value.empty());
}

[[noreturn]] void wrong_type(const std::string& source, const std::string& key, const json& value,
                             const char* expected) {
  throw ConfigError(fmt::format("{}: \"{}\" = {} should be {}", source, key, value.dump(), expected));
}

std::vector<std::string> string_list(const std::string& source, const std::string& key, const json& value) {
  if (value.is_null()) return {};
  if (!value.is_array()) wrong_type(source, key, value, "a list of module names");
  std::vector<std::string> names;
  for (const auto& item : value) {
    if (!item.is_string()) wrong_type(source, key, value, "a list of module names");
    names.push_back(item.get<std::string>());
  }
  return names;
}

}  // namespace

LoraConfig lora_config_from_json(const json& config_json, const std::string& source) {
  if (!config_json.is_object())
    throw ConfigError(fmt::format("{}: expected a JSON object (PEFT's adapter_config.json)", source));
  LoraConfig config;
  if (auto it = config_json.find("peft_type");
      it == config_json.end() || !it->is_string() || it->get<std::string>() != "LORA") {
    throw ConfigError(fmt::format("{}: peft_type = {} is not supported; Colossus loads \"LORA\" adapters", source,
                                  it == config_json.end() ? std::string("(missing)") : it->dump()));
  }
  for (const auto& [key, value] : config_json.items()) {
    if (kRead.contains(key) || kIgnored.contains(key) || is_off(value)) continue;
    throw ConfigError(
        fmt::format("{}: \"{}\" = {} is not supported by Colossus LoRA (only its off value: null, false, {{}} or []); "
                    "supported keys: {}",
                    source, key, value.dump(), std::vector<std::string>(kRead.begin(), kRead.end())));
  }
  const auto get = [&](const char* key) -> const json* {
    auto it = config_json.find(key);
    return it == config_json.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* v = get("task_type")) {
    if (!v->is_string()) wrong_type(source, "task_type", *v, "a string");
    config.task_type = v->get<std::string>();
  }
  if (const json* v = get("r")) {
    if (!v->is_number_integer()) wrong_type(source, "r", *v, "an integer");
    config.r = v->get<int64_t>();
  }
  if (const json* v = get("lora_alpha")) {
    if (!v->is_number()) wrong_type(source, "lora_alpha", *v, "a number");
    config.lora_alpha = v->get<double>();
  }
  if (const json* v = get("lora_dropout")) {
    if (!v->is_number()) wrong_type(source, "lora_dropout", *v, "a number");
    config.lora_dropout = v->get<double>();
  }
  if (const json* v = get("target_modules")) {
    if (v->is_string()) {
      std::string name = v->get<std::string>();
      std::string lower = name;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
      // PEFT reads any other single string as a regular expression
      // (re.fullmatch).
      if (lower != "all-linear") {
        throw ConfigError(
            fmt::format("{}: target_modules = \"{}\" is a regular expression to PEFT, which Colossus does not support; "
                        "give a list of module names or \"all-linear\"",
                        source, name));
      }
      config.target_modules = {"all-linear"};
    } else {
      config.target_modules = string_list(source, "target_modules", *v);
    }
  }
  if (const json* v = get("modules_to_save")) config.modules_to_save = string_list(source, "modules_to_save", *v);
  if (const json* v = get("bias")) {
    if (!v->is_string()) wrong_type(source, "bias", *v, "\"none\", \"all\" or \"lora_only\"");
    config.bias = v->get<std::string>();
  }
  if (const json* v = get("use_rslora")) {
    if (!v->is_boolean()) wrong_type(source, "use_rslora", *v, "true or false");
    config.use_rslora = v->get<bool>();
  }
  if (const json* v = get("init_lora_weights")) {
    if (v->is_boolean()) {
      config.init_lora_weights = v->get<bool>() ? LoraInit::Kaiming : LoraInit::Off;
    } else if (v->is_string() && v->get<std::string>() == "gaussian") {
      config.init_lora_weights = LoraInit::Gaussian;
    } else {
      throw ConfigError(fmt::format("{}: init_lora_weights = {} is not supported; use true, false or \"gaussian\"",
                                    source, v->dump()));
    }
  }
  if (const json* v = get("base_model_name_or_path")) {
    if (!v->is_string()) wrong_type(source, "base_model_name_or_path", *v, "a string");
    config.base_model_name_or_path = v->get<std::string>();
  }
  try {
    config.validate();
  } catch (const ConfigError& error) {
    throw ConfigError(fmt::format("{}: {}", source, error.what()));
  }
  return config;
}

json lora_config_to_json(const LoraConfig& config, bool fan_in_fan_out) {
  json out = json::object();
  out["peft_type"] = "LORA";
  out["task_type"] = config.task_type;
  out["base_model_name_or_path"] =
      config.base_model_name_or_path.empty() ? json(nullptr) : json(config.base_model_name_or_path);
  out["r"] = config.r;
  // PEFT writes an integer alpha; keep that form when it is one.
  if (config.lora_alpha == std::floor(config.lora_alpha) && std::abs(config.lora_alpha) < 1e15) {
    out["lora_alpha"] = static_cast<int64_t>(config.lora_alpha);
  } else {
    out["lora_alpha"] = config.lora_alpha;
  }
  out["lora_dropout"] = config.lora_dropout;
  out["target_modules"] = config.all_linear() ? json("all-linear") : json(config.target_modules);
  out["modules_to_save"] = config.modules_to_save.empty() ? json(nullptr) : json(config.modules_to_save);
  out["bias"] = config.bias;
  out["use_rslora"] = config.use_rslora;
  out["fan_in_fan_out"] = fan_in_fan_out;
  switch (config.init_lora_weights) {
    case LoraInit::Kaiming:
      out["init_lora_weights"] = true;
      break;
    case LoraInit::Gaussian:
      out["init_lora_weights"] = "gaussian";
      break;
    case LoraInit::Off:
      out["init_lora_weights"] = false;
      break;
  }
  out["use_dora"] = false;
  out["lora_bias"] = false;
  out["inference_mode"] = true;
  out["layers_to_transform"] = nullptr;
  out["layers_pattern"] = nullptr;
  out["rank_pattern"] = json::object();
  out["alpha_pattern"] = json::object();
  out["exclude_modules"] = nullptr;
  out["revision"] = nullptr;
  return out;
}

}  // namespace colossus::lora
