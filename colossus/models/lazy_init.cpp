// Lazy init (see lazy_init.h).
#include "colossus/models/lazy_init.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>

#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"

namespace colossus::models {

std::shared_ptr<CausalLM> create_lazy_model(const ModelConfig& config) {
  return create_model(config, {.device = c10::Device(c10::kMeta), .init = false});
}

bool is_lazy(const CausalLM& model) {
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (item.value().is_meta()) return true;
  }
  return false;
}

ParamSource seeded_source(std::shared_ptr<const CausalLM> model, uint64_t seed) {
  return [model = std::move(model), seed](const std::string& name, const at::Tensor& param) {
    return model->initial_value(name, param.sizes(), seed);
  };
}

ParamSource checkpoint_source(const CausalLM& model, const std::string& dir) {
  auto files = std::make_shared<const checkpoint::CheckpointFiles>(checkpoint::CheckpointFiles::open(dir));
  // Names and shapes are checked once, on views (nothing is read); then each
  // call hands out a fresh view, whose pages leave the RSS when it dies.
  std::map<std::string, at::Tensor> views;
  std::map<const void*, std::string> name_at;
  for (const auto& name : files->keys()) {
    at::Tensor view = files->get(name);
    if (view.numel() > 0) name_at.emplace(view.data_ptr(), name);
    views.emplace(name, std::move(view));
  }
  auto file_name_of = std::make_shared<std::map<std::string, std::string>>();
  // Empty tensors, and any the name mapping derived from a file tensor rather
  // than passing it through: held as they are.
  auto held = std::make_shared<std::map<std::string, at::Tensor>>();
  for (const auto& [param, view] : resolve_state_dict(model, views, dir)) {
    auto it = view.numel() > 0 ? name_at.find(view.data_ptr()) : name_at.end();
    if (it != name_at.end() && views.at(it->second).sizes() == view.sizes()) {
      file_name_of->emplace(param, it->second);
    } else {
      held->emplace(param, view);
    }
  }
  return [files, file_name_of, held, dir](const std::string& name, const at::Tensor&) {
    if (auto it = file_name_of->find(name); it != file_name_of->end()) return files->get(it->second);
    if (auto it = held->find(name); it != held->end()) return it->second;
    throw CheckpointError(fmt::format("checkpoint '{}' has no tensor '{}'", dir, name));
  };
}

void rebind_parameter(const at::Tensor& param, const at::Tensor& value) {
  TORCH_CHECK(param.sizes() == value.sizes(), "rebind_parameter: shape ", param.sizes(), " vs ", value.sizes());
  param.unsafeGetTensorImpl()->shallow_copy_from(value.getIntrusivePtr());
}

void materialize(CausalLM& model, const ParamSource& source, c10::Device device, c10::ScalarType dtype) {
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& param = item.value();
    if (!param.is_meta()) continue;
    at::Tensor values = source(item.key(), param);
    const auto target = at::isFloatingType(values.scalar_type()) ? dtype : values.scalar_type();
    rebind_parameter(param, values.to(device, target, /*non_blocking=*/false, /*copy=*/true));
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true)) {
    if (item.value().is_meta()) {
      throw ConfigError(fmt::format("materialize: buffer '{}' of {} is on the meta device; lazy init covers parameters only",
                                    item.key(), model.name()));
    }
  }
}

}  // namespace colossus::models
