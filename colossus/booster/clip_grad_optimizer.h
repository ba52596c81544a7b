// ClipGradOptimizer: the Booster's thin wrapper for fp32 training with
// max_norm > 0. It clips the gradients of all parameters to one global norm
// (amp::clip_grad_norm, with the same group-reduction hook as the mixed
// precision path) and then steps the optimizer it wraps. Clipping holds no
// state, so its state_dict is exactly the inner optimizer's: checkpoints move
// freely between runs with and without clipping.
#pragma once
#include "colossus/amp/clip_grad.h"
#include "colossus/optim/optimizer.h"

#include <cmath>
#include <memory>
#include <string>

namespace colossus::booster {

struct ClipGradOptions {
  double max_norm = 1.0;               // > 0
  double norm_type = 2.0;              // any p > 0, or amp::kInfNorm
  amp::NormReducer norm_reducer = {};  // empty: this rank's gradients are the whole
};

class ClipGradOptimizer : public optim::Optimizer {
 public:
  // param_groups() start as the inner optimizer's (same parameter tensors);
  // lr, weight_decay and options set here reach the inner one at each step.
  ClipGradOptimizer(std::unique_ptr<optim::Optimizer> inner, ClipGradOptions options);

  void step() override;
  std::string name() const override { return "ClipGrad[" + inner_->name() + "]"; }
  optim::OptimizerState state_dict() const override { return inner_->state_dict(); }
  void load_state_dict(const optim::OptimizerState& state) override;

  // Global gradient norm of the last step, before clipping.
  double last_grad_norm() const override { return last_grad_norm_; }
  double loss_scale() const override { return inner_->loss_scale(); }
  at::Tensor scale_loss(const at::Tensor& loss) const override { return inner_->scale_loss(loss); }
  bool last_step_nonfinite() const override { return !std::isfinite(last_grad_norm_); }
  int64_t follow_parameters() override { return inner_->follow_parameters(); }
  optim::Optimizer& inner() { return *inner_; }

 private:
  std::unique_ptr<optim::Optimizer> inner_;
  ClipGradOptions options_;
  double last_grad_norm_;
};

}  // namespace colossus::booster
