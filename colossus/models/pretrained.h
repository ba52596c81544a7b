// Building models from a config (seeded HF initialisation) and moving them to
// and from Hugging Face directories (config.json + safetensors shards) that
// transformers' from_pretrained / save_pretrained read and write.
#pragma once
#include "colossus/checkpoint/safetensors.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/config.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace colossus::models {

struct CreateOptions {
  uint64_t seed = 0;
  c10::ScalarType dtype = c10::kFloat;
  c10::Device device = c10::kCPU;
  // false leaves the parameters uninitialised (for loading, or on the meta device).
  bool init = true;
};

// GPT2LMHeadModel or LlamaForCausalLM for the config; validates it first.
std::shared_ptr<CausalLM> create_model(const ModelConfig& config, const CreateOptions& options = {});

struct LoadOptions {
  c10::ScalarType dtype = c10::kFloat;  // tensors are converted from the file's dtype
  c10::Device device = c10::kCPU;
};

// Reads dir/config.json and the safetensors in dir (single file or index +
// shards). Strict: tensors the model has but the files lack, tensors the files
// have but the model does not, shape mismatches and dtype mismatches other
// than between floating-point precisions (an I32 tensor into a float
// parameter) are one CheckpointError naming them. Tolerated as HF does: a
// tied lm_head.weight, GPT-2's legacy attn.bias / attn.masked_bias mask
// buffers, and names without the base-model prefix ("h.0..." for
// "transformer.h.0...").
std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, const LoadOptions& options = {});

// Copies `state` into the model's parameters with the strict rules above;
// `source` names the checkpoint in errors.
void load_state_dict(CausalLM& model, const std::map<std::string, at::Tensor>& state, const std::string& source);
// The same rules without copying: every model parameter name (named_parameters
// keys) -> its tensor in `state`. For loaders that copy parameter by parameter
// into storage of their own (ZeRO-3 chunks, lazy init).
std::map<std::string, at::Tensor> resolve_state_dict(const CausalLM& model,
                                                     const std::map<std::string, at::Tensor>& state,
                                                     const std::string& source);

// The tensors a checkpoint holds, by HF name, in named_parameters() order;
// a tied head is not repeated. For Phi-3 these are the fused qkv_proj and
// gate_up_proj (checkpoint_tensors below), new tensors rather than views.
checkpoint::NamedTensors state_dict(const CausalLM& model);

// Parameters by model name (named_parameters) <-> tensors by checkpoint name.
// The same for every family but Phi-3, whose checkpoints hold
// self_attn.qkv_proj.weight ([q | k | v] rows) and mlp.gate_up_proj.weight
// ([gate | up] rows) where the model keeps q/k/v_proj and gate/up_proj, so
// tensor parallelism, ZeRO and the engine see LLaMA's layers. Whole tensors
// only: a TP shard or a rank's share is converted after it is gathered.
bool checkpoint_fuses_projections(const ModelConfig& config);
checkpoint::NamedTensors checkpoint_tensors(const ModelConfig& config, checkpoint::NamedTensors params);
// Splits the fused tensors back into the model's names (views into them);
// a fused tensor of the wrong shape is a CheckpointError naming it.
std::map<std::string, at::Tensor> model_tensors(const ModelConfig& config, std::map<std::string, at::Tensor> state,
                                                const std::string& source);

struct SaveOptions {
  int64_t max_shard_bytes = int64_t{5} << 30;
};

// Writes dir/config.json (with torch_dtype) and the weights through
// checkpoint::save_sharded (model.safetensors, or shards + index past
// max_shard_bytes; it also removes the shards of an earlier save).
void save_pretrained(const CausalLM& model, const std::string& dir, const SaveOptions& options = {});

}  // namespace colossus::models
