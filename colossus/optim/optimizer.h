// The optimizer interface every plugin steps through. Optimizers update any
// tensors they are given (model parameters, or ZeRO's flat fp32 shards) from
// those tensors' .grad(); per-group hyper-parameters live in ParamGroup.
// Interface agreed before implementation; see docs/architecture.md.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace colossus::optim {

struct ParamGroup {
  std::vector<at::Tensor> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
  // Optimizer-specific extras by name (betas, eps, momentum, ...), so a
  // checkpoint can store every group's settings uniformly.
  std::map<std::string, double> options;
};

// Serialisable optimizer state: per-parameter tensors named
// "state.<param index>.<slot>" (index counts params across groups in order),
// and scalars (step counts, hyper-parameters) as JSON text.
struct OptimizerState {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::string json;
};

// Step bookkeeping kept in device memory, for a training step captured once
// in a CUDA graph and replayed (amp::GraphedTrainStep): the replayed kernels
// read these instead of values baked in at capture, and nothing is read back.
struct DeviceStepState {
  at::Tensor lr;        // double [groups]: each group's lr, copied from the host before every step
  at::Tensor counters;  // int64 [3]: steps taken, steps skipped, last step skipped (0/1); kept on the device
  at::Tensor skip;      // int32 [1]: set by this step's finite check, cleared when the step ends
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update from the current gradients; parameters without a gradient are skipped.
  virtual void step() = 0;
  virtual std::string name() const = 0;
  virtual OptimizerState state_dict() const = 0;
  // Throws CheckpointError when the state does not fit the parameters (count, shapes).
  virtual void load_state_dict(const OptimizerState& state) = 0;

  // Mixed precision in one pass, for optimizers that have a fused form:
  // steps this optimizer's fp32 parameters (the masters) with the gradients
  // of `low_precision[i]` (the model's bf16 copy of flat parameter i) and
  // writes each updated master, rounded, into low_precision[i]. Callers ask
  // can_step_from_low_precision first; where it says no, they copy gradients
  // into the masters and call step().
  virtual bool can_step_from_low_precision(const std::vector<at::Tensor>& low_precision) const {
    (void)low_precision;
    return false;
  }
  virtual void step_from_low_precision(const std::vector<at::Tensor>& low_precision);

  // Device-step mode, for step_from_low_precision inside a CUDA graph: the
  // step count and lr move to device_step(), and each call launches the same
  // work without reading anything back. Only lr may change between steps (the
  // other hyper-parameters are fixed when the step is captured). Throws
  // ConfigError where this optimizer has no such form.
  virtual void enable_device_step();
  // Non-null in device-step mode.
  virtual DeviceStepState* device_step() { return nullptr; }
  // Copies each group's lr to device_step()->lr; runs on the host before each
  // step, outside any captured graph.
  virtual void prepare_device_step() {}

  // What a training step asks of the optimizer it holds, whatever wraps it
  // (mixed precision, ZeRO, Gemini, clipping), so callers never ask which
  // one it is. Plain optimizers answer for themselves; wrappers pass the
  // question on to what they wrap where they do not answer it.
  //
  // The loss to run backward on: times the loss scale where the optimizer
  // keeps one (fp16), else the loss itself.
  virtual at::Tensor scale_loss(const at::Tensor& loss) const { return loss; }
  // Whether the last step met non-finite gradients that no loss scaler
  // accounts for (a skipped bf16 step, a non-finite clipped norm). Reads only
  // what the step already brought to the host.
  virtual bool last_step_nonfinite() const { return false; }
  // The global gradient norm of the last step, before clipping, where the
  // optimizer computed one (clipping on); NaN otherwise. For run metrics.
  virtual double last_grad_norm() const { return std::numeric_limits<double>::quiet_NaN(); }
  // The loss scale the next backward uses (fp16's dynamic scaler); 1 without one.
  virtual double loss_scale() const { return 1.0; }
  // The model's parameters were overwritten (a checkpoint loaded into them, a
  // plugin's broadcast): an optimizer that keeps its own copies (fp32
  // masters) re-reads the parameters that changed. Returns how many it
  // re-read.
  virtual int64_t follow_parameters() { return 0; }
  // Gradient accumulation, for optimizers that reduce gradients themselves
  // (ZeRO's hooks): while false, backward only accumulates them locally.
  virtual void set_grad_sync(bool enabled) { (void)enabled; }
  // For optimizers that update parameters asynchronously (ZeRO's all-gather
  // overlapping the next forward): returns once the parameters hold the last
  // step's values. Forwards and checkpoint saves call it first.
  virtual void wait_for_params() {}
  // Optimizers whose state is sharded over ranks (ZeRO, Gemini): collective;
  // whole-parameter state for the parameters this rank writes in a per-rank
  // sharded checkpoint (the ranks' results together are state_dict()).
  // Others: nullopt.
  virtual std::optional<OptimizerState> rank_state_dict() const { return std::nullopt; }

  void zero_grad(bool set_to_none = true);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Sets lr on every group (schedulers call this).
  void set_lr(double lr);

 protected:
  explicit Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {}
  std::vector<ParamGroup> groups_;
};

}  // namespace colossus::optim
