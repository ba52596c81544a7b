// LoRA's options (PEFT's LoraConfig, the subset Colossus implements) and their
// adapter_config.json form: parsed from what PEFT writes, written so that
// peft.PeftModel.from_pretrained reads it back. Unsupported values are refused
// by name rather than silently ignored.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace colossus::lora {

// PEFT's init_lora_weights: true (A kaiming-uniform with a = sqrt(5), as
// nn.Linear; B zeros), "gaussian" (A normal with std 1/r; B zeros), false
// (A and B both nn.Linear's default init: the adapter is not a no-op).
enum class LoraInit { Kaiming, Gaussian, Off };

struct LoraConfig {
  int64_t r = 8;              // adapter rank, > 0
  double lora_alpha = 8.0;    // scaling = lora_alpha / r (or / sqrt(r) with use_rslora)
  double lora_dropout = 0.0;  // on the adapter's input only, in [0, 1)
  // Module names, matched as PEFT matches a list: a module whose dotted path
  // (named_modules, e.g. "model.layers.0.self_attn.q_proj") equals the entry
  // or ends with "." + entry. The single entry "all-linear" is PEFT's
  // shorthand: every Linear / Conv1D but the LM head.
  std::vector<std::string> target_modules;
  // Modules trained whole beside the adapters (PEFT's modules_to_save, e.g.
  // "lm_head"), matched as target_modules are; saved in the adapter file.
  std::vector<std::string> modules_to_save;
  // Biases that train: "none", "all" (every bias of the model) or
  // "lora_only" (those of the adapted layers), as PEFT.
  std::string bias = "none";
  bool use_rslora = false;
  LoraInit init_lora_weights = LoraInit::Kaiming;
  // Carried through adapter_config.json; not used by Colossus.
  std::string base_model_name_or_path;
  std::string task_type = "CAUSAL_LM";

  // Throws ConfigError naming the bad field, its value and what is valid.
  void validate() const;
  double scaling() const;  // lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
  bool all_linear() const { return target_modules.size() == 1 && target_modules[0] == "all-linear"; }
};

// The parsed adapter_config.json. `source` names the file in errors. Keys
// PEFT writes that select a feature Colossus lacks (use_dora, lora_bias,
// layers_to_transform, rank_pattern, ...) are refused by name unless they
// hold their off value (null, false, {} or []); validate() runs last.
LoraConfig lora_config_from_json(const nlohmann::json& json, const std::string& source);
// PEFT's keys. target_modules is written as given (resolve "all-linear"
// against a model first: save_peft_adapter does); fan_in_fan_out says
// whether the targets are GPT-2 Conv1D layers (PEFT sets it for them).
nlohmann::json lora_config_to_json(const LoraConfig& config, bool fan_in_fan_out);

}  // namespace colossus::lora
