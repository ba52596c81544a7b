#include "colossus/optim/optimizer.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace colossus::optim {

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& group : groups_) {
    for (auto& param : group.params) {
      if (!param.grad().defined()) continue;
      at::Tensor& grad = param.mutable_grad();
      if (set_to_none) {
        grad.reset();
        continue;
      }
      // As torch does: a grad that is itself part of a graph is cut loose first.
      if (grad.grad_fn()) grad = grad.detach();
      grad.requires_grad_(false);
      grad.zero_();
    }
  }
}

void Optimizer::set_lr(double lr) {
  for (auto& group : groups_) group.lr = lr;
}

void Optimizer::step_from_low_precision(const std::vector<at::Tensor>& /*low_precision*/) {
  throw ConfigError(fmt::format("{} has no fused mixed-precision step; ask can_step_from_low_precision first", name()));
}

void Optimizer::enable_device_step() {
  throw ConfigError(fmt::format("{} has no device-counted step for CUDA graphs; use HybridAdam (optimizer.name = "
                                "\"hybrid_adam\")",
                                name()));
}

}  // namespace colossus::optim
