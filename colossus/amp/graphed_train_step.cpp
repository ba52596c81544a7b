#include "colossus/amp/graphed_train_step.h"

#include "colossus/core/errors.h"
#include "colossus/kernels/cuda_slots.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace colossus::amp {

GraphedTrainStep::GraphedTrainStep(LossFn loss_fn, optim::Optimizer& optimizer,
                                   GraphedTrainStepOptions options)
    : loss_fn_(std::move(loss_fn)), optimizer_(optimizer), options_(options) {
  if (options_.eager_steps < 1) {
    throw ConfigError(fmt::format("GraphedTrainStep: eager_steps = {}; use 1 or more (the optimizer's state must "
                                  "exist before the step is captured)",
                                  options_.eager_steps));
  }
  if (kernels::cuda_slots().make_device_graph == nullptr) {
    throw ConfigError("GraphedTrainStep: CUDA graphs need the CUDA build (COLOSSUS_CUDA=ON); turn cuda_graph off");
  }
  optimizer_.enable_device_step();
  const optim::DeviceStepState* state = optimizer_.device_step();
  graph_ = kernels::cuda_slots().make_device_graph(state->counters.get_device());
}

at::Tensor GraphedTrainStep::eager_step() {
  at::Tensor loss = loss_fn_(batch_);
  loss.backward();
  optimizer_.step();
  return loss.detach();
}

at::Tensor GraphedTrainStep::step(const at::Tensor& batch) {
  const at::Device device = optimizer_.device_step()->counters.device();
  if (!batch_.defined()) {
    batch_ = at::empty(batch.sizes(), batch.options().device(device));
  } else if (batch.sizes() != batch_.sizes() || batch.scalar_type() != batch_.scalar_type()) {
    throw ConfigError(fmt::format("GraphedTrainStep: batch {} {} differs from the captured {} {}; a CUDA graph "
                                  "replays fixed shapes (keep the batch shape, or turn cuda_graph off)",
                                  c10::toString(batch.scalar_type()), batch.sizes(),
                                  c10::toString(batch_.scalar_type()), batch_.sizes()));
  }
  batch_.copy_(batch, /*non_blocking=*/true);
  optimizer_.prepare_device_step();
  ++steps_;
  if (captured_) {
    graph_->replay();
    return loss_.clone();
  }
  if (steps_ < options_.eager_steps) {
    at::Tensor loss = eager_step();
    optimizer_.zero_grad(/*set_to_none=*/true);
    return loss;
  }
  if (steps_ == options_.eager_steps) {
    at::Tensor loss;
    graph_->run_on_capture_stream([&] { loss = eager_step(); });
    // Backward allocates fresh gradients during capture, in the graph's pool,
    // where every replay writes them again.
    optimizer_.zero_grad(/*set_to_none=*/true);
    return loss;
  }
  // The eager steps' cached activation blocks would sit beside the graph's
  // own pool for the rest of the run: hand them back first.
  at::accelerator::emptyCache();
  try {
    graph_->capture([&] { loss_ = eager_step(); });
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("GraphedTrainStep: the training step could not be captured in a CUDA graph ({}); "
                                  "a captured step may not synchronise with the host or copy from pageable host "
                                  "memory. Turn cuda_graph off for this model",
                                  e.what()));
  }
  captured_ = true;
  graph_->replay();  // capture records the step; this runs it
  return loss_.clone();
}

}  // namespace colossus::amp
