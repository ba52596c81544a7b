// A model with a LoRA adapter folded in, for inference: a Hugging Face base
// directory plus a PEFT adapter directory, or a `colossus train` LoRA
// checkpoint (its model/ holds base and adapter tensors, adapter/ the
// adapter's config), loaded and merged (PEFT's merge_and_unload), so the
// engine runs plain layers at the base model's speed.
#pragma once
#include "colossus/models/causal_lm.h"
#include "colossus/models/pretrained.h"

#include <memory>
#include <optional>
#include <string>

namespace colossus::lora {

// The adapter that belongs to `model_dir` when it is a LoRA checkpoint's
// model/ (an adapter/ beside it), else nullopt.
std::optional<std::string> checkpoint_adapter_dir(const std::string& model_dir);

// model_dir loaded as load_pretrained does, with adapter_dir's LoRA applied
// and merged into the weights. When model_dir's files hold the adapter
// tensors themselves (a training checkpoint), those are the adapter's
// weights and adapter_dir gives only its config. CheckpointError /
// ConfigError as load_pretrained and load_peft_adapter.
std::shared_ptr<models::CausalLM> load_merged(const std::string& model_dir, const std::string& adapter_dir,
                                              const models::LoadOptions& options = {});

}  // namespace colossus::lora
