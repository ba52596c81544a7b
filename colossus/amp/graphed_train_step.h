// A whole training step (loss, backward, optimizer update) captured once in a
// CUDA graph and replayed from then on: one launch per step, no host
// synchronisation inside it, none of the host's per-kernel launch cost.
//
// The first `eager_steps` calls are ordinary steps (the last one on the
// capture stream), so lazily created state (optimizer moments, cuBLAS
// workspaces, kernel plans) exists before capture; the next call captures and
// replays. Every call is exactly one training step. Shapes must stay the same
// (the batch is copied into a fixed input buffer), and only lr may change
// between steps (MixedPrecisionOptimizer's device-step mode reads it and the
// step count from device memory). Gradients stay allocated between steps.
#pragma once
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/kernels/device_graph.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace colossus::amp {

struct GraphedTrainStepOptions {
  int eager_steps = 3;  // >= 1: the optimizer's state must exist before capture
};

class GraphedTrainStep {
 public:
  // `loss_fn(batch)` returns the step's scalar loss (autograd on); it is
  // called with the fixed input buffer and must not synchronise with the host.
  using LossFn = std::function<at::Tensor(const at::Tensor& batch)>;

  // Puts `optimizer` in device-step mode (throws ConfigError if it cannot be:
  // see MixedPrecisionOptimizer::enable_device_step) and needs the CUDA build.
  GraphedTrainStep(LossFn loss_fn, optim::Optimizer& optimizer, GraphedTrainStepOptions options = {});

  // One step on `batch` (any device; the first call fixes its shape and
  // dtype). Returns the loss, a device scalar of its own, without waiting.
  at::Tensor step(const at::Tensor& batch);

  bool captured() const { return captured_; }
  int64_t steps() const { return steps_; }

 private:
  at::Tensor eager_step();

  LossFn loss_fn_;
  optim::Optimizer& optimizer_;
  GraphedTrainStepOptions options_;
  std::unique_ptr<kernels::DeviceGraph> graph_;
  at::Tensor batch_;  // the fixed input buffer the graph reads
  at::Tensor loss_;   // the fixed loss the graph writes
  bool captured_ = false;
  int64_t steps_ = 0;
};

}  // namespace colossus::amp
