// LAMB (You et al., "Large Batch Optimization for Deep Learning", 2019) with
// the semantics of apex/Colossal-AI FusedLAMB: Adam moments with bias
// correction, the update m_hat / (sqrt(v_hat) + eps) (+ weight_decay * p in
// AdamW mode), then a per-tensor trust ratio ||p|| / ||update|| (1 where
// either norm is 0) scaling lr.
#pragma once
#include "colossus/optim/adam.h"

#include <functional>
#include <vector>

namespace colossus::optim {

struct LambOptions {
  double lr = 1e-3;
  Betas betas = {};
  double eps = 1e-6;
  double weight_decay = 0.01;
  bool bias_correction = true;
  // true: decoupled decay inside the update; false: L2 added to the grad.
  bool adam_w_mode = true;
  // true: the first moment averages grads with weight (1 - beta1); false: weight 1.
  bool grad_averaging = true;
  // FusedLAMB applies the trust ratio only to groups with weight_decay != 0
  // unless use_nvlamb; the paper applies it everywhere (use_nvlamb = true).
  bool use_nvlamb = false;
  // > 0: grads are first scaled by max_grad_norm / global_norm when the global
  // L2 norm over all parameters exceeds it (FusedLAMB's default is 1.0; ours is
  // off because clipping usually happens before, in amp::clip_grad_norm).
  double max_grad_norm = 0.0;
};

// Group options: "beta1", "beta2", "eps", "bias_correction", "adam_w_mode",
// "grad_averaging", "use_nvlamb" (0 or 1 each), "max_grad_norm" (read from the
// first group: the clipping is global). State slots: "exp_avg", "exp_avg_sq".
class Lamb : public StatefulOptimizer {
 public:
  explicit Lamb(std::vector<at::Tensor> params, LambOptions options = {});
  // Each group's lr and weight_decay are its own; the options fill the extras.
  explicit Lamb(std::vector<ParamGroup> groups, LambOptions options = {});
  void step() override;
  std::string name() const override { return "Lamb"; }

  // The trust ratio of each parameter at the last step (flat order; 1 where
  // it did not apply, NaN where the parameter had no grad), for logging.
  const std::vector<double>& last_trust_ratios() const { return trust_ratios_; }

  // For sharded layouts (ZeRO): each tensor stepped here is one rank's part
  // of a parameter split over ranks (tensor i of every rank is a part of the
  // same parameter), so norms need partial sums combined over those ranks.
  // The reducer gets sums of squares in flat order and must replace each by
  // its SUM over the ranks (an all-reduce); every rank calls it the same
  // number of times with the same lengths. The tensors must be fp32/fp64.
  using PartitionReducer = std::function<void(std::vector<double>& sums)>;
  void set_partition_reducer(PartitionReducer reducer) { partition_reducer_ = std::move(reducer); }

 protected:
  void validate_group(const ParamGroup& group, size_t group_index) const override;
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  Lamb(std::vector<ParamGroup> groups, const LambOptions& options, bool groups_given);
  void step_partitioned(double grad_divisor);
  std::vector<double> trust_ratios_;
  PartitionReducer partition_reducer_;
};

}  // namespace colossus::optim
