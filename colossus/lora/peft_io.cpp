#include "colossus/lora/peft_io.h"

#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/lora/inject.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <set>

namespace colossus::lora {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

// At most `limit` names, then how many more.
std::string some_names(const std::vector<std::string>& names, size_t limit = 6) {
  std::vector<std::string> shown(names.begin(), names.begin() + std::min(limit, names.size()));
  std::string text = fmt::format("{}", shown);
  if (names.size() > limit) text += fmt::format(" and {} more", names.size() - limit);
  return text;
}

}  // namespace

std::vector<std::string> lora_parameter_names(models::CausalLM& model, const LoraConfig& config) {
  std::vector<std::string> names;
  for (const auto& t : adapter_tensors(model, config)) names.push_back(t.param_name);
  return names;
}

void save_peft_adapter(models::CausalLM& model, const LoraConfig& config, const std::string& dir) {
  save_peft_adapter(model, config, dir, {});
}

void save_peft_adapter(models::CausalLM& model, const LoraConfig& config, const std::string& dir,
                       const std::map<std::string, at::Tensor>& weights) {
  const auto layers = lora_layers(model);
  if (layers.empty()) throw ConfigError("save_peft_adapter: the model has no LoRA layers (apply_lora first)");
  config.validate();
  LoraConfig written = config;
  bool fan_in_fan_out = false;
  if (config.all_linear()) written.target_modules.clear();
  for (const auto& [path, layer] : layers) {
    fan_in_fan_out = fan_in_fan_out || layer->fan_in_fan_out();
    if (config.all_linear()) written.target_modules.push_back(path);
  }
  checkpoint::NamedTensors tensors;
  for (const auto& t : adapter_tensors(model, config)) {
    if (weights.empty()) {
      tensors.emplace_back(t.peft_key, t.tensor.detach());
      continue;
    }
    const auto it = weights.find(t.param_name);
    if (it == weights.end())
      throw CheckpointError(fmt::format("adapter weight {} is missing from the weights given", t.param_name));
    tensors.emplace_back(t.peft_key, it->second);
  }
  fs::create_directories(dir);
  // Weights first, config last: a directory whose config is new has new
  // weights.
  checkpoint::save_safetensors((fs::path(dir) / kWeightsFile).string(), tensors, {{"format", "pt"}});
  const std::string config_path = (fs::path(dir) / kConfigFile).string();
  const std::string text = lora_config_to_json(written, fan_in_fan_out).dump(2) + "\n";
  checkpoint::io::TempFile file(config_path, checkpoint::io::temp_path_for(config_path));
  file.write(text.data(), text.size());
  file.publish();
}

LoraConfig read_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfigFile).string();
  if (!fs::exists(path)) throw CheckpointError(fmt::format("{} not found: not a PEFT adapter directory", path));
  const std::string text = checkpoint::io::read_regular_file(path, std::size_t{1} << 20, "adapter config");
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) throw ConfigError(fmt::format("{}: not valid JSON", path));
  return lora_config_from_json(parsed, path);
}

LoraConfig load_peft_adapter(models::CausalLM& model, const std::string& dir) {
  const LoraConfig config = read_adapter_config(dir);
  const std::string weights_path = (fs::path(dir) / kWeightsFile).string();
  if (!fs::exists(weights_path)) {
    const bool pickled = fs::exists(fs::path(dir) / "adapter_model.bin");
    throw CheckpointError(fmt::format("{} not found{}", weights_path,
                                      pickled ? " (adapter_model.bin is a pickle, which Colossus does not read: resave "
                                                "with PEFT's save_pretrained(safe_serialization=True))"
                                              : ""));
  }
  const auto file = checkpoint::SafetensorsFile::open(weights_path);

  std::map<std::string, bool> trainable;  // to undo apply_lora on a bad file
  for (const auto& item : model.named_parameters()) trainable[item.key()] = item.value().requires_grad();
  apply_lora(model, config);
  try {
    checkpoint::NamedTensors params;
    for (const auto& t : adapter_tensors(model, config)) params.emplace_back(t.peft_key, t.tensor);
    std::set<std::string> expected;
    std::vector<std::string> missing, unexpected, mismatched;
    for (const auto& [key, param] : params) {
      expected.insert(key);
      if (!file.contains(key)) {
        missing.push_back(key);
      } else if (file.shape(key) != param.sizes().vec()) {
        mismatched.push_back(
            fmt::format("{} {} in the file, {} in the model", key, file.shape(key), param.sizes().vec()));
      }
    }
    for (const auto& key : file.keys()) {
      if (!expected.contains(key)) unexpected.push_back(key);
    }
    if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
      std::string message = fmt::format("{} does not fit the adapter that {} describes:", weights_path, kConfigFile);
      if (!missing.empty()) message += fmt::format(" missing keys {};", some_names(missing));
      if (!unexpected.empty()) message += fmt::format(" unexpected keys {};", some_names(unexpected));
      if (!mismatched.empty()) message += fmt::format(" shape mismatches {};", some_names(mismatched, 3));
      message.pop_back();
      throw CheckpointError(message);
    }
    at::NoGradGuard no_grad;
    for (const auto& [key, param] : params) param.copy_(file.get(key));
  } catch (...) {
    for (const auto& [path, layer] : lora_layers(model)) models::replace_layer(model, path, layer->base());
    for (auto& item : model.named_parameters()) {
      if (auto it = trainable.find(item.key()); it != trainable.end()) item.value().set_requires_grad(it->second);
    }
    throw;
  }
  return config;
}

}  // namespace colossus::lora
