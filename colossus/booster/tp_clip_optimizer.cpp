#include "colossus/booster/tp_clip_optimizer.h"

#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/clamp_max.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace colossus::booster {

namespace {

std::vector<optim::ParamGroup> groups_of(const std::unique_ptr<optim::Optimizer>& inner) {
  if (!inner) throw ConfigError("TPClipOptimizer: the inner optimizer is null");
  return inner->param_groups();
}

at::Tensor norm_total(const std::vector<at::Tensor>& params, const std::vector<int64_t>& replicas, double norm_type,
                      cluster::ProcessGroup& tp_group) {
  const bool inf = std::isinf(norm_type);
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  at::Tensor local;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    at::Tensor n = at::linalg_vector_norm(g, norm_type).to(at::kFloat);
    // The max needs no weighting: a replica's max is the same on every holder.
    at::Tensor term = inf ? n : n.pow(norm_type) / static_cast<double>(replicas.at(i));
    if (!local.defined()) {
      local = term;
    } else {
      local = inf ? at::maximum(local, term) : local + term;
    }
  }
  // No gradient on this rank: it still joins the all-reduce (on the device the
  // collective needs: NCCL moves only GPU memory).
  if (!local.defined()) local = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  local = local.reshape({1}).contiguous();
  if (tp_group.size() > 1) tp_group.all_reduce(local, inf ? cluster::ReduceOp::Max : cluster::ReduceOp::Sum).wait();
  return inf ? local : local.pow(1.0 / norm_type);
}

}  // namespace

double tp_grad_norm(const std::vector<at::Tensor>& params, const std::vector<int64_t>& replicas, double norm_type,
                    cluster::ProcessGroup& tp_group) {
  at::NoGradGuard no_grad;
  return norm_total(params, replicas, norm_type, tp_group).item<double>();
}

TPClipOptimizer::TPClipOptimizer(std::unique_ptr<optim::Optimizer> inner, TPClipOptions options)
    : Optimizer(groups_of(inner)),
      inner_(std::move(inner)),
      options_(std::move(options)),
      last_grad_norm_(std::numeric_limits<double>::quiet_NaN()) {
  if (!(options_.max_norm > 0.0))
    throw ConfigError(fmt::format("TPClipOptimizer: max_norm={} must be > 0", options_.max_norm));
  if (!(options_.norm_type > 0.0))
    throw ConfigError(fmt::format("TPClipOptimizer: norm_type={} is invalid", options_.norm_type));
  if (!options_.tp_group) throw ConfigError("TPClipOptimizer: the tp group is null");
  size_t count = 0;
  for (const auto& group : groups_) count += group.params.size();
  if (count != options_.replicas.size()) {
    throw ConfigError(
        fmt::format("TPClipOptimizer: {} replica counts for {} parameters", options_.replicas.size(), count));
  }
}

void TPClipOptimizer::step() {
  inner_->param_groups() = groups_;
  std::vector<at::Tensor> params;
  for (const auto& group : groups_) params.insert(params.end(), group.params.begin(), group.params.end());
  {
    at::NoGradGuard no_grad;
    at::Tensor total = norm_total(params, options_.replicas, options_.norm_type, *options_.tp_group);
    // As torch's clip_grad_norm_: reciprocal-then-multiply, applied even when 1.
    at::Tensor coef = at::clamp_max((total + 1e-6).reciprocal() * options_.max_norm, 1.0);
    for (const auto& p : params) {
      if (p.grad().defined()) p.grad().mul_(coef.to(p.grad().device()));
    }
    last_grad_norm_ = total.item<double>();
  }
  inner_->step();
}

void TPClipOptimizer::load_state_dict(const optim::OptimizerState& state) {
  inner_->load_state_dict(state);
  for (size_t g = 0; g < groups_.size() && g < inner_->param_groups().size(); ++g) {
    groups_[g].lr = inner_->param_groups()[g].lr;
    groups_[g].weight_decay = inner_->param_groups()[g].weight_decay;
    groups_[g].options = inner_->param_groups()[g].options;
  }
}

ClipAndMasters wrap_clip_and_masters(std::unique_ptr<optim::Optimizer> optimizer, ClipAndMastersOptions options) {
  if (options.max_norm > 0.0) {
    optimizer = std::make_unique<TPClipOptimizer>(std::move(optimizer), TPClipOptions{.max_norm = options.max_norm,
                                                                                      .norm_type = options.norm_type,
                                                                                      .replicas = std::move(options.replicas),
                                                                                      .tp_group = options.norm_group});
  }
  if (options.precision == "fp32") return {std::move(optimizer), nullptr};
  // The gradients are partitioned over norm_group: an overflow anywhere in it
  // skips the step on all its ranks.
  auto overflow = [group = options.norm_group](bool local) {
    return group->all_reduce_scalar(local ? 1.0 : 0.0, cluster::ReduceOp::Max) > 0.0;
  };
  auto mixed = std::make_unique<amp::MixedPrecisionOptimizer>(
      std::move(optimizer),
      amp::MixedPrecisionOptions{
          .precision = options.precision, .loss_scaler = options.loss_scaler, .overflow_reducer = overflow});
  // Masters start at the exact fp32 values, not their bf16/fp16 rounding.
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < options.originals.size(); ++i) {
    if (options.originals[i].defined()) mixed->master_params()[i].copy_(options.originals[i]);
  }
  amp::MixedPrecisionOptimizer* raw = mixed.get();
  return {std::move(mixed), raw};
}

}  // namespace colossus::booster
