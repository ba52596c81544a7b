// TPClipOptimizer: gradient clipping by global norm for tensor-parallel
// models. Each rank holds slices of the sharded parameters and full copies of
// the replicated ones, so the norm sums every rank's terms over the tp group
// with each parameter weighted by 1/replicas: replicated elements count once,
// not tp times. (Over dp the gradients are identical after the all-reduce, so
// no dp reduction is needed.) Stateless: its state_dict is the inner one's.
#pragma once
#include "colossus/amp/loss_scaler.h"
#include "colossus/cluster/process_group.h"
#include "colossus/optim/optimizer.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace colossus::amp {
class MixedPrecisionOptimizer;
}

namespace colossus::booster {

struct TPClipOptions {
  double max_norm = 1.0;          // > 0
  double norm_type = 2.0;         // any p > 0, or infinity
  std::vector<int64_t> replicas;  // per parameter in flat order: tp ranks holding each element
  cluster::ProcessGroupPtr tp_group;
};

class TPClipOptimizer : public optim::Optimizer {
 public:
  // param_groups() start as the inner optimizer's; whatever is set on them
  // (params too: a MixedPrecisionOptimizer around this one swaps in masters)
  // reaches the inner optimizer at each step.
  TPClipOptimizer(std::unique_ptr<optim::Optimizer> inner, TPClipOptions options);

  void step() override;
  std::string name() const override { return "TPClip[" + inner_->name() + "]"; }
  optim::OptimizerState state_dict() const override { return inner_->state_dict(); }
  void load_state_dict(const optim::OptimizerState& state) override;
  double last_grad_norm() const override { return last_grad_norm_; }
  double loss_scale() const override { return inner_->loss_scale(); }
  at::Tensor scale_loss(const at::Tensor& loss) const override { return inner_->scale_loss(loss); }
  bool last_step_nonfinite() const override { return !std::isfinite(last_grad_norm_); }
  int64_t follow_parameters() override { return inner_->follow_parameters(); }

 private:
  std::unique_ptr<optim::Optimizer> inner_;
  TPClipOptions options_;
  double last_grad_norm_;
};

// The global p-norm (before clipping) of the grads of `params` (flat order,
// undefined grads skipped) with the weighting above; collective over tp_group.
double tp_grad_norm(const std::vector<at::Tensor>& params, const std::vector<int64_t>& replicas, double norm_type,
                    cluster::ProcessGroup& tp_group);

// What HybridParallelPlugin and MoeHybridParallelPlugin put around the
// user's optimizer: clipping (max_norm > 0) by the norm over norm_group with
// each parameter weighted by 1/replicas, then fp32 masters for bf16/fp16 with
// the overflow flag reduced (max) over norm_group, the masters starting at
// `originals` (the fp32 values before the cast, in the optimizer's flat order;
// may be empty; an undefined entry: the parameter's own value, nothing was
// rounded).
struct ClipAndMastersOptions {
  std::string precision = "fp32";  // fp32 | bf16 | fp16
  amp::LossScalerOptions loss_scaler = {};
  double max_norm = 0.0;
  double norm_type = 2.0;
  std::vector<int64_t> replicas;  // per parameter in flat order
  cluster::ProcessGroupPtr norm_group;
  std::vector<at::Tensor> originals;
};
struct ClipAndMasters {
  std::unique_ptr<optim::Optimizer> optimizer;
  amp::MixedPrecisionOptimizer* mixed = nullptr;  // in `optimizer`; null with fp32
};
ClipAndMasters wrap_clip_and_masters(std::unique_ptr<optim::Optimizer> optimizer, ClipAndMastersOptions options);

}  // namespace colossus::booster
