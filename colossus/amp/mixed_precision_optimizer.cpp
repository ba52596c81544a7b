#include "colossus/amp/mixed_precision_optimizer.h"

#include "colossus/amp/unscale.h"
#include "colossus/core/errors.h"
#include "colossus/kernels/cuda_slots.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace colossus::amp {

namespace {

bool is_low_precision(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

const optim::Optimizer& require(const std::unique_ptr<optim::Optimizer>& inner) {
  if (!inner) throw ConfigError("MixedPrecisionOptimizer: the inner optimizer is null; pass e.g. std::make_unique<AdamW>(...)");
  return *inner;
}

}  // namespace

void MixedPrecisionOptions::validate() const {
  if (precision != "bf16" && precision != "fp16") {
    throw ConfigError(fmt::format("MixedPrecisionOptimizer: precision='{}' is unknown; use 'bf16' or 'fp16'", precision));
  }
  if (!(max_norm >= 0.0)) {
    throw ConfigError(fmt::format("MixedPrecisionOptimizer: max_norm={} is negative; use 0 (no clipping) or e.g. 1.0",
                                  max_norm));
  }
  if (!(norm_type > 0.0)) {
    throw ConfigError(fmt::format("MixedPrecisionOptimizer: norm_type={} is invalid; use 2 or infinity", norm_type));
  }
  if (precision == "fp16") loss_scaler.validate();
}

std::vector<optim::ParamGroup> MixedPrecisionOptimizer::groups_of(const optim::Optimizer& inner) {
  return inner.param_groups();
}

MixedPrecisionOptimizer::MixedPrecisionOptimizer(std::unique_ptr<optim::Optimizer> inner,
                                                 MixedPrecisionOptions options)
    : Optimizer(groups_of(require(inner))),
      inner_(std::move(inner)),
      options_(std::move(options)),
      last_grad_norm_(std::numeric_limits<double>::quiet_NaN()) {
  options_.validate();
  if (!inner_->state_dict().tensors.empty()) {
    throw ConfigError(fmt::format("MixedPrecisionOptimizer: the inner {} has already stepped; wrap it before its "
                                  "first step",
                                  inner_->name()));
  }
  if (options_.precision == "fp16") scaler_.emplace(options_.loss_scaler);
  const auto wrong = options_.precision == "fp16" ? at::kBFloat16 : at::kHalf;
  at::NoGradGuard no_grad;
  int64_t flat = 0;
  for (auto& group : inner_->param_groups()) {
    for (auto& param : group.params) {
      if (param.scalar_type() == wrong) {
        throw ConfigError(fmt::format("MixedPrecisionOptimizer: parameter {} is {} but precision is '{}'; use "
                                      "precision='{}' or convert the model",
                                      flat, c10::toString(wrong), options_.precision,
                                      options_.precision == "fp16" ? "bf16" : "fp16"));
      }
      const bool low = is_low_precision(param);
      has_master_copy_.push_back(low);
      if (low) param = param.detach().to(at::kFloat).clone();
      masters_.push_back(param);
      ++flat;
    }
  }
}

at::Tensor MixedPrecisionOptimizer::scale_loss(const at::Tensor& loss) const {
  return scaler_ ? loss * scaler_->scale() : loss;
}

int64_t MixedPrecisionOptimizer::follow_parameters() {
  at::NoGradGuard no_grad;
  int64_t changed = 0;
  size_t flat = 0;
  for (const auto& group : param_groups()) {
    for (const auto& param : group.params) {
      const at::Tensor& master = masters_[flat++];
      if (master.is_same(param)) continue;  // an fp32 parameter is its own master
      if (master.sizes() == param.sizes() && at::equal(master.to(param.scalar_type()), param)) continue;
      master.copy_(param);
      ++changed;
    }
  }
  return changed;
}

void MixedPrecisionOptimizer::mirror_groups_to_inner() {
  auto& inner_groups = inner_->param_groups();
  for (size_t g = 0; g < groups_.size() && g < inner_groups.size(); ++g) {
    inner_groups[g].lr = groups_[g].lr;
    inner_groups[g].weight_decay = groups_[g].weight_decay;
    inner_groups[g].options = groups_[g].options;
  }
}

void MixedPrecisionOptimizer::enable_device_step() {
  if (options_.precision != "bf16" || options_.max_norm > 0.0 || options_.overflow_reducer) {
    throw ConfigError(fmt::format(
        "MixedPrecisionOptimizer: a step captured in a CUDA graph needs precision bf16 without clipping on one "
        "process (got precision {}, max_norm {}{}); use bf16 with max_norm = 0, or turn CUDA graphs off",
        options_.precision, options_.max_norm, options_.overflow_reducer ? ", a multi-rank overflow reducer" : ""));
  }
  for (size_t i = 0; i < has_master_copy_.size(); ++i) {
    if (!has_master_copy_[i] || !masters_[i].is_cuda()) {
      throw ConfigError(fmt::format("MixedPrecisionOptimizer: a step captured in a CUDA graph needs every parameter "
                                    "in bf16 on a CUDA device; parameter {} is {} on {}",
                                    i, c10::toString(masters_[i].scalar_type()), masters_[i].device().str()));
    }
  }
  mirror_groups_to_inner();
  inner_->enable_device_step();
}

void MixedPrecisionOptimizer::prepare_device_step() {
  mirror_groups_to_inner();
  inner_->prepare_device_step();
}

bool MixedPrecisionOptimizer::last_step_skipped() const {
  if (const auto* d = inner_->device_step()) return d->counters[2].item<int64_t>() != 0;
  return last_step_skipped_;
}

int64_t MixedPrecisionOptimizer::skipped_steps() const {
  if (const auto* d = inner_->device_step()) return skipped_steps_ + d->counters[1].item<int64_t>();
  return skipped_steps_;
}

void MixedPrecisionOptimizer::step() {
  at::NoGradGuard no_grad;
  mirror_groups_to_inner();
  if (step_fused()) return;
  if (inner_->device_step() != nullptr) {
    throw ConfigError("MixedPrecisionOptimizer: in device-step mode (CUDA graphs) every step must take the fused "
                      "path, but a parameter lost its bf16 gradient; give every parameter a gradient each step");
  }
  // Model grads into fp32 master grads.
  std::vector<at::Tensor> master_grads;
  size_t flat = 0;
  for (const auto& group : groups_) {
    for (const auto& param : group.params) {
      const size_t i = flat++;
      const at::Tensor& grad = param.grad();
      if (!has_master_copy_[i]) {
        if (grad.defined()) master_grads.push_back(grad);
        continue;
      }
      at::Tensor& master_grad = masters_[i].mutable_grad();
      if (!grad.defined()) {
        master_grad.reset();
        continue;
      }
      if (!master_grad.defined() || master_grad.sizes() != masters_[i].sizes()) {
        master_grad = at::empty_like(masters_[i], at::MemoryFormat::Contiguous);
      }
      master_grad.copy_(grad);
      master_grads.push_back(master_grad);
    }
  }
  bool overflow = unscale_and_check_finite(master_grads, 1.0 / loss_scale());
  if (options_.overflow_reducer) overflow = options_.overflow_reducer(overflow);
  last_step_skipped_ = overflow;
  if (overflow) {
    ++skipped_steps_;
    if (scaler_) scaler_->update(true);
    return;
  }
  if (options_.max_norm > 0.0) {
    last_grad_norm_ = clip_grad_norm(master_grads, options_.max_norm, options_.norm_type, options_.norm_reducer);
  }
  inner_->step();
  if (scaler_) scaler_->update(false);
  flat = 0;
  for (const auto& group : groups_) {
    for (const auto& param : group.params) {
      const size_t i = flat++;
      if (has_master_copy_[i]) param.copy_(masters_[i]);
    }
  }
}

bool MixedPrecisionOptimizer::step_fused() {
  // bf16 without clipping, every parameter a CUDA bf16 copy with a gradient:
  // check the model's gradients in place (one multi-tensor pass, one sync, as
  // the copy path's check) and let the inner optimizer step from them.
  if (scaler_ || options_.max_norm > 0.0) return false;
  std::vector<at::Tensor> low_precision, grads;
  size_t flat = 0;
  for (const auto& group : groups_) {
    for (const auto& param : group.params) {
      if (!has_master_copy_[flat++] || !param.is_cuda() || !param.grad().defined()) return false;
      low_precision.push_back(param);
      grads.push_back(param.grad());
    }
  }
  const auto check = kernels::cuda_slots().nonfinite_bf16;
  if (grads.empty() || check == nullptr || !inner_->can_step_from_low_precision(low_precision)) return false;
  std::vector<const void*> data;
  std::vector<int64_t> numel;
  for (const at::Tensor& g : grads) {
    if (g.get_device() != grads.front().get_device()) return false;
    data.push_back(g.data_ptr());
    numel.push_back(g.numel());
  }
  if (optim::DeviceStepState* d = inner_->device_step()) {
    kernels::cuda_slots().nonfinite_bf16_into(data.data(), numel.data(), static_cast<int64_t>(data.size()),
                                              d->skip.data_ptr<int32_t>(), grads.front().get_device());
    inner_->step_from_low_precision(low_precision);
    return true;
  }
  bool overflow = check(data.data(), numel.data(), static_cast<int64_t>(data.size()), grads.front().get_device());
  if (options_.overflow_reducer) overflow = options_.overflow_reducer(overflow);
  if (overflow) {
    last_step_skipped_ = true;
    ++skipped_steps_;
    return true;
  }
  inner_->step_from_low_precision(low_precision);
  last_step_skipped_ = false;
  return true;
}

optim::OptimizerState MixedPrecisionOptimizer::state_dict() const {
  optim::OptimizerState inner_state = inner_->state_dict();
  optim::OptimizerState out;
  out.tensors = std::move(inner_state.tensors);
  for (size_t i = 0; i < masters_.size(); ++i) {
    if (has_master_copy_[i]) out.tensors.emplace_back(fmt::format("master.{}", i), masters_[i].detach().clone());
  }
  nlohmann::json j;
  j["optimizer"] = name();
  j["inner"] = nlohmann::json::parse(inner_state.json);
  j["loss_scaler"] = scaler_ ? nlohmann::json::parse(scaler_->state_dict()) : nlohmann::json();
  j["skipped_steps"] = skipped_steps();
  out.json = j.dump();
  return out;
}

void MixedPrecisionOptimizer::load_state_dict(const optim::OptimizerState& state) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(state.json);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: optimizer state JSON does not parse: {}", name(), e.what()));
  }
  if (j.value("optimizer", std::string()) != name()) {
    throw CheckpointError(fmt::format("optimizer state is for '{}', but this optimizer is '{}'",
                                      j.value("optimizer", std::string("?")), name()));
  }
  optim::OptimizerState inner_state;
  std::vector<std::pair<size_t, at::Tensor>> masters;
  for (const auto& [tensor_name, tensor] : state.tensors) {
    if (tensor_name.rfind("master.", 0) != 0) {
      inner_state.tensors.emplace_back(tensor_name, tensor);
      continue;
    }
    size_t index = 0;
    try {
      index = std::stoul(tensor_name.substr(7));
    } catch (const std::logic_error&) {
      throw CheckpointError(fmt::format("{}: state tensor '{}' is not named master.<index>", name(), tensor_name));
    }
    if (index >= masters_.size() || !has_master_copy_[index]) {
      throw CheckpointError(fmt::format("{}: state has '{}' but parameter {} has no fp32 master here", name(),
                                        tensor_name, index));
    }
    if (tensor.sizes() != masters_[index].sizes()) {
      throw CheckpointError(fmt::format("{}: '{}' has shape {} but the parameter has shape {}", name(), tensor_name,
                                        tensor.sizes(), masters_[index].sizes()));
    }
    masters.emplace_back(index, tensor);
  }
  size_t expected_masters = 0;
  for (bool b : has_master_copy_) expected_masters += b ? 1 : 0;
  if (masters.size() != expected_masters) {
    throw CheckpointError(fmt::format("{}: state has {} fp32 masters but this model has {} bf16/fp16 parameters",
                                      name(), masters.size(), expected_masters));
  }
  if (j.contains("loss_scaler") && !j["loss_scaler"].is_null() && !scaler_) {
    throw CheckpointError(fmt::format("{}: state was saved with fp16 loss scaling but precision is '{}'", name(),
                                      options_.precision));
  }
  inner_state.json = j.contains("inner") ? j["inner"].dump() : std::string();
  inner_->load_state_dict(inner_state);  // validates first; nothing here has changed yet
  if (scaler_) {
    if (!j.contains("loss_scaler") || j["loss_scaler"].is_null()) {
      throw CheckpointError(fmt::format("{}: state has no loss scaler but precision is 'fp16'", name()));
    }
    scaler_->load_state_dict(j["loss_scaler"].dump());
  }
  at::NoGradGuard no_grad;
  for (const auto& [index, tensor] : masters) masters_[index].copy_(tensor);
  skipped_steps_ = j.value("skipped_steps", int64_t{0});
  if (auto* d = inner_->device_step()) d->counters.narrow(0, 1, 2).zero_();  // counted from here on
  // The inner optimizer restored its groups' hyper-parameters; mirror them.
  const auto& inner_groups = inner_->param_groups();
  for (size_t g = 0; g < groups_.size() && g < inner_groups.size(); ++g) {
    groups_[g].lr = inner_groups[g].lr;
    groups_[g].weight_decay = inner_groups[g].weight_decay;
    groups_[g].options = inner_groups[g].options;
  }
}

}  // namespace colossus::amp
