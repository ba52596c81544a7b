#include "colossus/models/pretrained.h"

#include "colossus/core/errors.h"
#include "colossus/core/precision.h"
#include "colossus/models/deepseek.h"
#include "colossus/models/gemma.h"
#include "colossus/models/gpt2.h"
#include "colossus/models/llama.h"
#include "colossus/models/mixtral.h"
#include "colossus/models/phi3.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <vector>

namespace colossus::models {

namespace fs = std::filesystem;

namespace {

// A config with absurd sizes (a typo'd n_layer) is refused before any
// allocation, naming its sizes, instead of growing until the OOM killer ends
// the process. Host memory bounds what one process can create; a larger model
// is built lazily (meta device) and sharded.
void check_fits_in_host_memory(const ModelConfig& config, const CreateOptions& options) {
  if (options.device.is_meta()) return;
  const double bytes = estimated_parameters(config) * static_cast<double>(c10::elementSize(options.dtype));
  const double host = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  const double limit = options.device.is_cpu() ? host : std::max(host, 1.0e12);
  if (bytes > limit) {
    throw ConfigError(fmt::format("the {} config describes about {:.3g} parameters ({} layers, hidden size {}): {:.3g} GB "
                                  "in {}, more than this machine's {:.3g} GB of memory; check num_layers/hidden sizes",
                                  model_type(config), estimated_parameters(config), num_layers(config),
                                  hidden_size(config), bytes / 1e9, c10::toString(options.dtype), limit / 1e9));
  }
}

}  // namespace

std::shared_ptr<CausalLM> create_model(const ModelConfig& config, const CreateOptions& options) {
  validate(config);
  check_fits_in_host_memory(config, options);
  at::TensorOptions tensor_options = at::TensorOptions().dtype(options.dtype).device(options.device);
  std::shared_ptr<CausalLM> model;
  if (const auto* gpt2 = std::get_if<GPT2Config>(&config)) {
    model = std::make_shared<GPT2LMHeadModel>(*gpt2, tensor_options);
  } else if (const auto* mixtral = std::get_if<MixtralConfig>(&config)) {
    model = std::make_shared<MixtralForCausalLM>(*mixtral, tensor_options);
  } else if (const auto* deepseek = std::get_if<DeepseekConfig>(&config)) {
    model = std::make_shared<DeepseekForCausalLM>(*deepseek, tensor_options);
  } else {
    const auto& llama = std::get<LlamaConfig>(config);
    if (llama.is_gemma()) {
      model = std::make_shared<GemmaForCausalLM>(llama, tensor_options);
    } else if (llama.family == "phi3") {
      model = std::make_shared<Phi3ForCausalLM>(llama, tensor_options);
    } else {
      model = std::make_shared<LlamaForCausalLM>(llama, tensor_options);
    }
  }
  if (options.init) model->init_weights(options.seed);
  return model;
}

namespace {

std::string join_limited(const std::vector<std::string>& items) {
  constexpr size_t shown = 8;
  std::string out;
  for (size_t i = 0; i < items.size() && i < shown; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > shown) out += fmt::format(" and {} more", items.size() - shown);
  return out;
}

// Keys HF itself skips when loading into the model.
bool ignorable(const CausalLM& model, const std::string& key) {
  if (model.tied_embeddings() && key == "lm_head.weight") return true;
  if (model_type(model.config()) == "gpt2") {
    return key.ends_with(".attn.bias") || key.ends_with(".attn.masked_bias");
  }
  return false;
}

// The tensors a checkpoint holds: the parameters, then the buffers (DeepSeek-V3's
// router bias; no other model registers any).
torch::OrderedDict<std::string, at::Tensor> checkpointed_tensors(const CausalLM& model) {
  auto tensors = model.named_parameters(/*recurse=*/true);
  for (const auto& item : model.named_buffers(/*recurse=*/true)) tensors.insert(item.key(), item.value());
  return tensors;
}

std::string dtype_name(c10::ScalarType dtype) {
  if (auto name = hf_dtype_name(dtype)) return *name;
  throw CheckpointError(fmt::format(
      "save_pretrained: parameters of dtype {} have no HF torch_dtype; use float32, bfloat16, float16 or float64",
      c10::toString(dtype)));
}

}  // namespace

bool checkpoint_fuses_projections(const ModelConfig& config) {
  const auto* llama = std::get_if<LlamaConfig>(&config);
  return llama != nullptr && llama->family == "phi3";
}

checkpoint::NamedTensors checkpoint_tensors(const ModelConfig& config, checkpoint::NamedTensors params) {
  if (!checkpoint_fuses_projections(config)) return params;
  return fuse_phi3_checkpoint(std::move(params));
}

std::map<std::string, at::Tensor> model_tensors(const ModelConfig& config, std::map<std::string, at::Tensor> state,
                                                const std::string& source) {
  if (!checkpoint_fuses_projections(config)) return state;
  return split_phi3_checkpoint(std::get<LlamaConfig>(config), std::move(state), source);
}

std::map<std::string, at::Tensor> resolve_state_dict(const CausalLM& model,
                                                     const std::map<std::string, at::Tensor>& file_state,
                                                     const std::string& source) {
  // Phi-3's fused qkv_proj / gate_up_proj become the model's q/k/v and gate/up (views).
  const std::map<std::string, at::Tensor> state = model_tensors(model.config(), file_state, source);
  auto params = checkpointed_tensors(model);
  const std::string base_prefix = model.blocks_path().substr(0, model.blocks_path().find('.')) + ".";
  std::vector<std::string> unexpected, mismatched, dtype_mismatched;
  std::map<std::string, const at::Tensor*> assigned;
  std::set<std::string> present;  // model names the file has, matching shape or not
  for (const auto& [key, tensor] : state) {
    std::string name = key;
    if (!params.contains(name) && params.contains(base_prefix + key)) name = base_prefix + key;
    if (!params.contains(name) || present.contains(name)) {
      if (!ignorable(model, key)) unexpected.push_back(key);
      continue;
    }
    present.insert(name);
    const at::Tensor& param = params[name];
    if (tensor.sizes() != param.sizes()) {
      mismatched.push_back(fmt::format("{} (file {} vs model {})", key, c10::str(tensor.sizes()), c10::str(param.sizes())));
      continue;
    }
    // A floating-point file into a floating-point model of another precision
    // is the cast the caller asked for by the model's dtype (a bf16 HF
    // checkpoint into an fp32 model); integers, bools or complex values into a
    // float parameter (or back) are no precision change but another meaning.
    if (tensor.scalar_type() != param.scalar_type() &&
        !(at::isFloatingType(tensor.scalar_type()) && at::isFloatingType(param.scalar_type()))) {
      dtype_mismatched.push_back(fmt::format("{} (file {} vs model {})", key, c10::toString(tensor.scalar_type()),
                                             c10::toString(param.scalar_type())));
      continue;
    }
    assigned[name] = &tensor;
  }
  std::vector<std::string> missing;
  for (const auto& item : params) {
    if (!present.contains(item.key())) missing.push_back(item.key());
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty() || !dtype_mismatched.empty()) {
    std::string message = fmt::format("checkpoint {} does not match {}:", source, model.name());
    if (!missing.empty()) message += fmt::format(" missing {} tensor(s): {};", missing.size(), join_limited(missing));
    if (!unexpected.empty()) message += fmt::format(" unexpected {} tensor(s): {};", unexpected.size(), join_limited(unexpected));
    if (!mismatched.empty()) message += fmt::format(" shape mismatch: {};", join_limited(mismatched));
    if (!dtype_mismatched.empty()) {
      message += fmt::format(" dtype mismatch (only floating-point precisions convert): {};",
                             join_limited(dtype_mismatched));
    }
    message.pop_back();
    throw CheckpointError(message);
  }
  std::map<std::string, at::Tensor> resolved;
  for (const auto& [name, tensor] : assigned) resolved.emplace(name, *tensor);
  return resolved;
}

void load_state_dict(CausalLM& model, const std::map<std::string, at::Tensor>& state, const std::string& source) {
  auto resolved = resolve_state_dict(model, state, source);
  auto params = checkpointed_tensors(model);
  at::NoGradGuard no_grad;
  for (auto& [name, tensor] : resolved) params[name].copy_(tensor);
}

std::shared_ptr<CausalLM> load_pretrained(const std::string& dir, const LoadOptions& options) {
  const fs::path config_path = fs::path(dir) / "config.json";
  if (!fs::exists(config_path)) throw CheckpointError(fmt::format("{} has no config.json", dir));
  ModelConfig config = read_config(config_path.string());
  auto model = create_model(config, {.dtype = options.dtype, .device = options.device, .init = false});
  load_state_dict(*model, checkpoint::load_state_dict(dir), dir);
  return model;
}

checkpoint::NamedTensors state_dict(const CausalLM& model) {
  checkpoint::NamedTensors tensors;
  for (const auto& item : checkpointed_tensors(model)) tensors.emplace_back(item.key(), item.value().detach());
  return checkpoint_tensors(model.config(), std::move(tensors));
}

void save_pretrained(const CausalLM& model, const std::string& dir, const SaveOptions& options) {
  checkpoint::NamedTensors tensors = state_dict(model);
  if (tensors.empty()) throw CheckpointError("save_pretrained: the model has no parameters");
  const c10::ScalarType dtype = tensors.front().second.scalar_type();
  fs::create_directories(dir);
  ModelConfig config = model.config();
  std::visit(
      [&](auto& c) {
        c.extra.erase("dtype");
        c.extra["torch_dtype"] = fmt::format("\"{}\"", dtype_name(dtype));
      },
      config);
  write_config(config, (fs::path(dir) / "config.json").string());
  checkpoint::save_sharded(dir, tensors, {.max_shard_bytes = options.max_shard_bytes});
}

}  // namespace colossus::models
