// PEFT's adapter directory, both ways: adapter_config.json (lora_config.h)
// and adapter_model.safetensors with keys "base_model.model.<module
// path>.lora_A.weight" / "...lora_B.weight", so an adapter trained here loads
// in peft.PeftModel.from_pretrained and one trained with PEFT loads here.
#pragma once
#include "colossus/lora/lora_config.h"
#include "colossus/models/causal_lm.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace colossus::lora {

// Writes dir/adapter_model.safetensors (what `config` trains, adapter_tensors:
// the LoRA weights, trained biases and modules_to_save, in their dtype,
// metadata {"format": "pt"}) and then dir/adapter_config.json
// (`config`, "all-linear" resolved to the wrapped module paths,
// fan_in_fan_out set when the targets are Conv1D). Each file is written to a
// temporary name and renamed into place, so a reader never sees a partial
// file. ConfigError when the model has no LoRA layers.
void save_peft_adapter(models::CausalLM& model, const LoraConfig& config, const std::string& dir);
// The same with the adapter weights taken from `weights`, keyed by the
// model's parameter names ("<module path>.lora_A.weight", "<path>.bias"), instead of the
// model's tensors: for a run whose rank 0 does not hold the trained values
// (gemini's sharded chunks), read back from its saved checkpoint.
// CheckpointError naming an adapter weight `weights` lacks.
void save_peft_adapter(models::CausalLM& model, const LoraConfig& config, const std::string& dir,
                       const std::map<std::string, at::Tensor>& weights);
// The model's names of what `config` trains (adapter_tensors):
// "<module path>.lora_A.weight", ..., biases, modules_to_save parameters.
std::vector<std::string> lora_parameter_names(models::CausalLM& model, const LoraConfig& config);

// Reads dir/adapter_config.json, applies it (apply_lora) and copies the
// weights of dir/adapter_model.safetensors into the adapters (converted to
// their fp32). Returns the config. ConfigError for an unsupported config;
// CheckpointError naming the missing and unexpected keys or a shape
// mismatch, after which the model is as it was (layers unwrapped,
// requires_grad restored).
LoraConfig load_peft_adapter(models::CausalLM& model, const std::string& dir);

// dir/adapter_config.json parsed (lora_config_from_json) without touching a
// model.
LoraConfig read_adapter_config(const std::string& dir);

}  // namespace colossus::lora
