#include "colossus/lora/merged_model.h"

#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/lora/inject.h"
#include "colossus/lora/peft_io.h"
#include "colossus/models/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace colossus::lora {

namespace fs = std::filesystem;

std::optional<std::string> checkpoint_adapter_dir(const std::string& model_dir) {
  const fs::path adapter = fs::path(model_dir).lexically_normal().parent_path() / "adapter";
  if (fs::path(model_dir).lexically_normal().filename() != "model" || !fs::exists(adapter / "adapter_config.json"))
    return std::nullopt;
  return adapter.string();
}

std::shared_ptr<models::CausalLM> load_merged(const std::string& model_dir, const std::string& adapter_dir,
                                              const models::LoadOptions& options) {
  auto state = checkpoint::load_state_dict(model_dir);
  const bool holds_adapter = std::any_of(state.begin(), state.end(), [](const auto& item) {
    return item.first.find(".lora_A.weight") != std::string::npos;
  });
  const LoraConfig adapter = read_adapter_config(adapter_dir);
  const fs::path config_path = fs::path(model_dir) / "config.json";
  if (!fs::exists(config_path)) throw CheckpointError(fmt::format("{} has no config.json", model_dir));
  // The files already mapped above are the ones loaded: model_dir is read once.
  auto model = models::create_model(models::read_config(config_path.string()),
                                    {.dtype = options.dtype, .device = options.device, .init = false});
  if (!holds_adapter) {
    models::load_state_dict(*model, state, model_dir);
    load_peft_adapter(*model, adapter_dir);
  } else {
    apply_lora(*model, adapter);
    const auto layers = lora_layers(*model);
    const bool has_base = std::all_of(layers.begin(), layers.end(),
                                      [&](const auto& layer) { return state.contains(layer.first + ".weight"); });
    if (has_base) {
      models::load_state_dict(*model, state, model_dir);
    } else {
      // A QLoRA checkpoint holds no base linear weights (they trained in NF4):
      // the adapter goes onto the base model it was trained from.
      const std::string& base = adapter.base_model_name_or_path;
      if (base.empty() || !fs::exists(fs::path(base) / "config.json"))
        throw CheckpointError(fmt::format(
            "{} holds the adapter but not the base model's linear weights (a QLoRA run), and its adapter names no "
            "base directory that exists ('{}'); give the base model and the adapter: --lora {} on the base",
            model_dir, base, adapter_dir));
      model = models::load_pretrained(base, options);
      load_peft_adapter(*model, adapter_dir);
    }
  }
  merge_lora(*model);
  return model;
}

}  // namespace colossus::lora
