// Mixed-precision training around any optimizer: the model keeps bf16/fp16
// parameters, the wrapped optimizer steps fp32 master copies. Each step copies
// the model grads into fp32 master grads, unscales them (fp16: by the dynamic
// loss scale) while checking for inf/NaN, skips the step on overflow, clips by
// global norm if asked, steps the inner optimizer and rounds the masters back
// into the model parameters. fp32 model parameters are their own masters.
#pragma once
#include "colossus/amp/clip_grad.h"
#include "colossus/amp/loss_scaler.h"
#include "colossus/optim/optimizer.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace colossus::amp {

struct MixedPrecisionOptions {
  std::string precision = "bf16";  // "bf16" (no loss scaling) or "fp16" (dynamic loss scaling)
  LossScalerOptions loss_scaler = {};
  double max_norm = 0.0;  // > 0: clip master grads to this global norm
  double norm_type = 2.0;  // 2 or kInfNorm (any p > 0 works)
  // Group reductions for sharded/parallel layouts (empty: this rank is all):
  // the norm term (see clip_grad.h), and the overflow flag (must return the
  // OR over ranks, so that every rank skips the same steps).
  NormReducer norm_reducer = {};
  std::function<bool(bool local_overflow)> overflow_reducer = {};
  void validate() const;
};

class MixedPrecisionOptimizer : public optim::Optimizer {
 public:
  // `inner` must not have stepped yet: its parameters are replaced by fp32
  // masters. param_groups() here are the model's parameters; lr, weight_decay
  // and options set on them reach the inner optimizer at each step.
  MixedPrecisionOptimizer(std::unique_ptr<optim::Optimizer> inner, MixedPrecisionOptions options = {});

  void step() override;
  std::string name() const override { return "MixedPrecision[" + inner_->name() + "]"; }
  // Inner state ("state.<i>.<slot>"), masters of bf16/fp16 params
  // ("master.<i>", exact fp32) and the loss scaler, so resuming is bit-exact.
  optim::OptimizerState state_dict() const override;
  void load_state_dict(const optim::OptimizerState& state) override;

  // The factor to multiply the loss by before backward (1 for bf16).
  double loss_scale() const override { return scaler_ ? scaler_->scale() : 1.0; }
  at::Tensor scale_loss(const at::Tensor& loss) const override;
  // A bf16/fp32 step skipped for non-finite gradients (fp16 skips are the
  // loss scaler's normal work and do not count).
  bool last_step_nonfinite() const override { return !scaler_ && last_step_skipped(); }
  // Masters of parameters that no longer equal their master's rounding are
  // re-read from them (an fp32 parameter is its own master).
  int64_t follow_parameters() override;
  // In device-step mode these read the device counters (a synchronisation).
  bool last_step_skipped() const;
  int64_t skipped_steps() const;
  // Global grad norm of the last clipped step (before clipping), NaN if none.
  double last_grad_norm() const override { return last_grad_norm_; }

  // Device-step mode (optim::Optimizer::enable_device_step) for a step
  // captured in a CUDA graph: the finite check writes the inner optimizer's
  // device skip flag instead of being read back, so a step never waits for
  // the device. Needs precision bf16, max_norm 0 and the fused path (CUDA bf16
  // parameters, an inner HybridAdam); throws ConfigError naming what is missing.
  void enable_device_step() override;
  optim::DeviceStepState* device_step() override { return inner_->device_step(); }
  // Mirrors lr onto the inner optimizer and copies it to the device.
  void prepare_device_step() override;
  optim::Optimizer& inner() { return *inner_; }
  const DynamicLossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  // fp32 master of each model parameter, flat order (the parameter itself if fp32).
  const std::vector<at::Tensor>& master_params() const { return masters_; }

 private:
  static std::vector<optim::ParamGroup> groups_of(const optim::Optimizer& inner);
  // The one-pass path (optim::Optimizer::step_from_low_precision); false
  // when it does not apply and step() takes the copy path.
  bool step_fused();
  void mirror_groups_to_inner();
  std::unique_ptr<optim::Optimizer> inner_;
  MixedPrecisionOptions options_;
  std::optional<DynamicLossScaler> scaler_;
  std::vector<at::Tensor> masters_;
  std::vector<bool> has_master_copy_;  // model param is bf16/fp16
  bool last_step_skipped_ = false;
  int64_t skipped_steps_ = 0;
  double last_grad_norm_;
};

}  // namespace colossus::amp
