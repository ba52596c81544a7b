// Learning-rate schedules driving an optimizer's param groups, with Hugging
// Face's definitions (transformers.get_constant_schedule_with_warmup,
// get_linear_schedule_with_warmup, get_cosine_schedule_with_warmup and
// get_cosine_with_min_lr_schedule_with_warmup): each group's lr is its lr at
// construction (the base) times a factor of the step count. Construction sets
// the step-0 lr; each step() advances one step, as torch's LambdaLR.
#pragma once
#include "colossus/optim/optimizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace colossus::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  virtual std::string name() const = 0;

  // Advances one step and writes the new lr into every group.
  void step();
  // Group 0's current lr, and every group's.
  double lr() const;
  std::vector<double> lrs() const;
  // Steps taken since construction (0 before the first step()).
  int64_t last_step() const { return step_; }
  // The lr a group with base lr `base_lr` has at `step`.
  virtual double lr_at(int64_t step, double base_lr) const = 0;

  // JSON {"scheduler", "step", "base_lrs"}; loading sets the groups' lrs.
  // Throws CheckpointError on another scheduler's state or a group-count mismatch.
  std::string state_dict() const;
  void load_state_dict(const std::string& json);

  // Drives `optimizer` from now on instead of the one it was built on (the
  // Booster's wrapper around it: fp32 masters, clipping), keeping the base lrs
  // and the step count, and writes the current step's lrs into its groups.
  // Throws ConfigError when its param-group count differs from the base lrs'.
  void attach(Optimizer& optimizer);

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Call at the end of a derived constructor: writes the step-0 lrs.
  void start();
  const std::vector<double>& base_lrs() const { return base_lrs_; }

 private:
  void apply();
  Optimizer* optimizer_;
  std::vector<double> base_lrs_;
  int64_t step_ = 0;
};

struct ConstantLROptions {
  int64_t warmup_steps = 0;  // linear ramp from 0 over this many steps
};

class ConstantLR : public LRScheduler {
 public:
  ConstantLR(Optimizer& optimizer, ConstantLROptions options = {});
  std::string name() const override { return "constant"; }
  double lr_at(int64_t step, double base_lr) const override;

 private:
  ConstantLROptions options_;
};

struct LinearLROptions {
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // lr reaches 0 here; required (> 0)
};

// Linear warmup from 0, then linear decay to 0 at total_steps.
class LinearWarmupDecayLR : public LRScheduler {
 public:
  LinearWarmupDecayLR(Optimizer& optimizer, LinearLROptions options);
  std::string name() const override { return "linear"; }
  double lr_at(int64_t step, double base_lr) const override;

 private:
  LinearLROptions options_;
};

struct CosineLROptions {
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // required (> 0)
  double num_cycles = 0.5;  // 0.5: one half-cosine from the base lr down to the floor
  // The floor, at most one of: a fraction of each group's base lr, or an
  // absolute lr (each group decays to it; must not exceed any base lr).
  double min_lr_ratio = 0.0;
  double min_lr = 0.0;
};

// Linear warmup from 0, then cosine decay to the floor at total_steps.
class CosineWarmupLR : public LRScheduler {
 public:
  CosineWarmupLR(Optimizer& optimizer, CosineLROptions options);
  std::string name() const override { return "cosine"; }
  double lr_at(int64_t step, double base_lr) const override;

 private:
  CosineLROptions options_;
};

}  // namespace colossus::optim
