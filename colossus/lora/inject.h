// Putting LoRA into a model from outside and taking it out again: apply_lora
// wraps the layers that LoraConfig::target_modules names (matched on their
// Hugging Face module paths, as PEFT matches) in LoraLinear, lora_parameters
// lists the adapters under PEFT's state-dict keys, merge_lora folds them back.
#pragma once
#include "colossus/checkpoint/safetensors.h"
#include "colossus/lora/lora_config.h"
#include "colossus/lora/lora_linear.h"
#include "colossus/models/causal_lm.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace colossus::lora {

// Wraps every matched Linear / Conv1D in a LoraLinear (fp32 adapters on the
// layer's device, A seeded from (seed, module path)) and freezes every other
// parameter of the model but the biases and modules_to_save the config
// trains (adapter_tensors), as PEFT's get_peft_model. Those train in place:
// the model's own bias and module tensors are the trained ones.
// Returns the config with "all-linear" resolved to the wrapped module paths
// (what PEFT writes to adapter_config.json). ConfigError when: the config is
// invalid; an entry of target_modules matches no module (the message lists
// the model's linear layers) or matches a module that is not a Linear /
// Conv1D, or a MoE router / expert (the block runs those from packed buffers;
// "all-linear" skips them, as PEFT does on transformers' Mixtral); the model
// already has LoRA layers; the model is Phi-3 (its checkpoints fuse q/k/v, so
// PEFT's module names differ from ours); a target's weight is a view into a
// fused tensor (apply LoRA before fuse_projections()). A model with LoRA
// layers also saves its adapters in save_pretrained (as "<path>.lora_A.weight"):
// merge_lora first for a plain Hugging Face checkpoint.
LoraConfig apply_lora(models::CausalLM& model, const LoraConfig& config, uint64_t seed = 0);

// The model's LoRA layers by module path ("model.layers.0.self_attn.q_proj"),
// in named_modules() order.
std::vector<std::pair<std::string, std::shared_ptr<LoraLinear>>> lora_layers(torch::nn::Module& model);

// "base_model.model.<path>.lora_A.weight" (r, in) and "...lora_B.weight"
// (out, r) for every LoRA layer: the keys PEFT writes to
// adapter_model.safetensors. The tensors are the parameters themselves.
checkpoint::NamedTensors lora_parameters(torch::nn::Module& model);

// The PEFT key of one adapter matrix; `which` is "lora_A" or "lora_B".
std::string peft_key(const std::string& module_path, const std::string& which);

// One tensor an adapter trains and PEFT saves: its key in
// adapter_model.safetensors and its parameter name in the model.
struct AdapterTensor {
  std::string peft_key;
  std::string param_name;
  at::Tensor tensor;
};
// Everything `config` trains on a model it was applied to, in PEFT's saved
// form: every LoRA layer's lora_A / lora_B; with bias "all" every ".bias"
// parameter, with "lora_only" the LoRA layers' (PEFT keys a LoRA layer's
// bias "<path>.base_layer.bias"); and every parameter of the modules_to_save
// modules (PEFT's key "<module path>.<name>": its trained copy's, adapter
// name dropped). ConfigError for a modules_to_save entry that matches no
// module, or one that holds a head tied to the embedding (PEFT would train
// an untied copy; Colossus trains in place).
std::vector<AdapterTensor> adapter_tensors(models::CausalLM& model, const LoraConfig& config);

// Snapshots every LoRA layer's adapter (LoraLinear::snapshot).
void snapshot_adapters(torch::nn::Module& model);
// While alive, the model's LoRA layers run with their snapshots: the model as
// it was at snapshot_adapters, for DPO's reference.
class SnapshotAdapters {
 public:
  explicit SnapshotAdapters(torch::nn::Module& model);
  ~SnapshotAdapters();
  SnapshotAdapters(const SnapshotAdapters&) = delete;
  SnapshotAdapters& operator=(const SnapshotAdapters&) = delete;

 private:
  std::vector<std::shared_ptr<LoraLinear>> layers_;
};

// Replaces each LoraLinear by its merged plain layer (LoraLinear::merged: W +
// scaling * B @ A), PEFT's merge_and_unload. Returns how many were merged.
int64_t merge_lora(models::CausalLM& model);

}  // namespace colossus::lora
