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
  std::map<const std::byte*, std::string> file_tensor_at;  // by first byte
  for (const auto& name : files->keys()) {
    at::Tensor view = files->get(name);
    if (view.numel() > 0) file_tensor_at.emplace(static_cast<const std::byte*>(view.data_ptr()), name);
    views.emplace(name, std::move(view));
  }
  // Each parameter as a contiguous run of one file tensor's elements: the
  // tensor itself, or rows of it (Phi-3's fused qkv_proj split into q/k/v).
  struct Slice {
    std::string file_name;
    int64_t offset = 0;  // elements
  };
  auto slice_of = std::make_shared<std::map<std::string, Slice>>();
  auto held = std::make_shared<std::map<std::string, at::Tensor>>();  // empty ones: no data to map
  for (const auto& [param, view] : resolve_state_dict(model, views, dir)) {
    const auto* begin = static_cast<const std::byte*>(view.numel() > 0 ? view.data_ptr() : nullptr);
    auto it = begin ? file_tensor_at.upper_bound(begin) : file_tensor_at.begin();
    if (begin && it != file_tensor_at.begin() && view.is_contiguous()) {
      --it;
      const at::Tensor& whole = views.at(it->second);
      const auto offset_bytes = begin - it->first;
      if (whole.scalar_type() == view.scalar_type() &&
          offset_bytes + static_cast<std::ptrdiff_t>(view.nbytes()) <= static_cast<std::ptrdiff_t>(whole.nbytes())) {
        slice_of->emplace(param, Slice{it->second, offset_bytes / static_cast<std::ptrdiff_t>(view.element_size())});
        continue;
      }
    }
    held->emplace(param, view.numel() > 0 ? view.clone() : view);
  }
  return [files, slice_of, held, dir](const std::string& name, const at::Tensor& param) {
    if (auto it = slice_of->find(name); it != slice_of->end()) {
      at::Tensor whole = files->get(it->second.file_name);
      if (whole.sizes() == param.sizes()) return whole;
      return whole.view({-1}).narrow(0, it->second.offset, param.numel()).view(param.sizes());
    }
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
