#include "colossus/booster/clip_grad_optimizer.h"

#include "colossus/core/errors.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <limits>
#include <utility>

namespace colossus::booster {

namespace {

std::vector<optim::ParamGroup> groups_of(const std::unique_ptr<optim::Optimizer>& inner) {
  if (!inner)
    throw ConfigError("ClipGradOptimizer: the inner optimizer is null; pass e.g. std::make_unique<AdamW>(...)");
  return inner->param_groups();
}

// The hyper-parameters the scheduler (or a loaded state) set on one side.
void copy_hyper_parameters(const std::vector<optim::ParamGroup>& from, std::vector<optim::ParamGroup>& to) {
  for (size_t g = 0; g < from.size() && g < to.size(); ++g) {
    to[g].lr = from[g].lr;
    to[g].weight_decay = from[g].weight_decay;
    to[g].options = from[g].options;
  }
}

}  // namespace

ClipGradOptimizer::ClipGradOptimizer(std::unique_ptr<optim::Optimizer> inner, ClipGradOptions options)
    : Optimizer(groups_of(inner)),
      inner_(std::move(inner)),
      options_(std::move(options)),
      last_grad_norm_(std::numeric_limits<double>::quiet_NaN()) {
  if (!(options_.max_norm > 0.0)) {
    throw ConfigError(fmt::format("ClipGradOptimizer: max_norm={} must be > 0, e.g. 1.0", options_.max_norm));
  }
  if (!(options_.norm_type > 0.0)) {
    throw ConfigError(fmt::format("ClipGradOptimizer: norm_type={} is invalid; use 2 or infinity", options_.norm_type));
  }
}

void ClipGradOptimizer::step() {
  copy_hyper_parameters(groups_, inner_->param_groups());
  std::vector<at::Tensor> grads;
  for (const auto& group : groups_) {
    for (const auto& param : group.params) {
      if (param.grad().defined()) grads.push_back(param.grad());
    }
  }
  {
    at::NoGradGuard no_grad;
    last_grad_norm_ = amp::clip_grad_norm(grads, options_.max_norm, options_.norm_type, options_.norm_reducer);
  }
  inner_->step();
}

void ClipGradOptimizer::load_state_dict(const optim::OptimizerState& state) {
  inner_->load_state_dict(state);
  copy_hyper_parameters(inner_->param_groups(), groups_);
}

}  // namespace colossus::booster
