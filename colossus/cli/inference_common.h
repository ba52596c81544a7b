// What `colossus generate` and `colossus serve` share: parsing --dtype and
// --device, and finding the tokenizer of a model directory.
#pragma once
#include "colossus/data/tokenizer.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/pretrained.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <string>

namespace colossus::cli {

c10::ScalarType parse_dtype(const std::string& name);  // fp32, bf16, fp16 (CLI11 has checked it)
// cpu, cuda or cuda:N; throws ConfigError when this build or machine has no GPU.
c10::Device parse_device(const std::string& name);
// "auto": the first GPU when this build has CUDA and one is visible, else the
// CPU; anything else as parse_device.
c10::Device resolve_device(const std::string& name);
// GPUs this process could use, counted without creating a CUDA context (a
// launcher that starts one rank per GPU must not hold memory on them); 0 in a
// CPU build.
int visible_gpus();
// --tensor_parallel_size `tp` against the model (its heads and FFN width, as
// the engine's sharding plan needs) and, on a GPU (device: the ranks' kind),
// one GPU per rank of the `gpus` visible; `device_option` is --device as
// given (cuda:N names a single GPU). Throws ConfigError naming the value and
// the sizes that would fit.
void check_tensor_parallel_size(int64_t tp, const models::ModelConfig& config, const std::string& device_option,
                                const c10::Device& device, int gpus);
// "auto": on a GPU the model's own dtype (config.json torch_dtype / dtype;
// fp32 checkpoints in bf16, as vLLM halves them), on the CPU fp32; else
// `name` itself (fp32, bf16, fp16).
std::string resolve_dtype(const std::string& name, const std::string& model_dir, const c10::Device& device);
// --tokenizer's value ("byte", a directory or file) or, when empty, the model
// directory's tokenizer files; throws ConfigError naming what was looked for.
std::unique_ptr<data::Tokenizer> open_tokenizer(const std::string& option, const std::string& model_dir);
// The model of model_dir (load_pretrained) with a LoRA adapter merged in:
// lora_dir (a PEFT adapter directory), or, when empty and model_dir is a
// LoRA training checkpoint's model/, its adapter/. Reports on stderr what it
// loaded and how long it took (unless `report` is false: a rank that is not 0).
std::shared_ptr<models::CausalLM> load_inference_model(const std::string& model_dir, const std::string& lora_dir,
                                                       const models::LoadOptions& options, bool report = true);
// Positions the model has: GPT-2's n_positions, LLaMA's max_position_embeddings.
int64_t context_length(const models::CausalLM& model);

}  // namespace colossus::cli
