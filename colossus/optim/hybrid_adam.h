// HybridAdam (Colossal-AI's name): Adam/AdamW whose fp32 parameters are
// updated by fused kernels wherever they live, for ZeRO/Gemini offload where
// part of the model sits in CPU memory: CPU tensors by the SIMD CPU kernel
// (AVX-512 / AVX2 / scalar chosen at run time, threads over elements), CUDA
// tensors by the multi-tensor CUDA kernel (CUDA builds). Other parameters
// (bf16/fp16, non-contiguous) take the unfused reference path.
#pragma once
#include "colossus/kernels/adam.h"
#include "colossus/optim/adam.h"

#include <optional>
#include <utility>

namespace colossus::optim {

struct HybridAdamOptions {
  double lr = 1e-3;
  Betas betas = {};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adamw_mode = true;       // decoupled weight decay (AdamW); false: L2 on the grad (Adam)
  bool bias_correction = true;
  int num_threads = 0;          // CPU kernel threads; 0: all cores
};

// Group options: "beta1", "beta2", "eps", "adamw_mode", "bias_correction" (0/1).
// State slots: "exp_avg", "exp_avg_sq" (the same as Adam/AdamW, so a state can
// move between them when the name is adjusted).
class HybridAdam : public StatefulOptimizer {
 public:
  explicit HybridAdam(std::vector<at::Tensor> params, HybridAdamOptions options = {});
  // Each group's lr and weight_decay are its own; the options fill the extras.
  explicit HybridAdam(std::vector<ParamGroup> groups, HybridAdamOptions options = {});
  void step() override;
  std::string name() const override { return "HybridAdam"; }
  // CUDA, bf16 model parameters, fp32 masters (this optimizer's parameters),
  // every gradient present: one fused launch per step count
  // (kernels::adam_step_mixed_cuda). Otherwise false.
  bool can_step_from_low_precision(const std::vector<at::Tensor>& low_precision) const override;
  void step_from_low_precision(const std::vector<at::Tensor>& low_precision) override;
  // ZeRO's CPU offload with bf16 parameters: the host fp32 masters at `indices`
  // (this optimizer's flat parameter order, across groups) step from the bf16
  // gradients in `grads_in_out[i]` (host, contiguous, the master's numel),
  // each multiplied by grad_scale (the clip coefficient; 1 for none), and the
  // updated masters rounded to bf16 are written over those gradients, ready to
  // copy to the device. One fused pass (kernels::adam_step_mixed_cpu) with no
  // fp32 gradient copy. Each index steps once per call.
  void step_host_mixed(const std::vector<int64_t>& indices, const std::vector<at::Tensor>& grads_in_out,
                       float grad_scale);
  // The same, each gradient either bf16 and the same tensor as its output
  // (the call above) or fp32 (a host accumulator, kept as it is) with the
  // bf16 parameters written into params_bf16[i].
  void step_host_mixed(const std::vector<int64_t>& indices, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& params_bf16, float grad_scale);
  // Device-step mode (Optimizer::enable_device_step): needs the CUDA build,
  // every parameter an fp32 CUDA tensor on one device, and one step count
  // shared by all of them. Then only step_from_low_precision steps.
  void enable_device_step() override;
  DeviceStepState* device_step() override { return device_step_ ? &*device_step_ : nullptr; }
  void prepare_device_step() override;
  // In device-step mode the device's step count is written into the state
  // first (one synchronisation), and a loaded state's count goes to the device.
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;

  // The CPU ISA the kernel uses (best supported by default); tests and
  // benchmarks pin one. Throws ConfigError if this CPU lacks it.
  void set_cpu_isa(kernels::CpuIsa isa);
  kernels::CpuIsa cpu_isa() const { return isa_; }

 protected:
  void validate_group(const ParamGroup& group, size_t group_index) const override;
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  HybridAdam(std::vector<ParamGroup> groups, const HybridAdamOptions& options, bool groups_given);
  void step_on_device(const std::vector<at::Tensor>& low_precision);
  // A group's update constants, and those folded for one step count.
  AdamMath math_of(const ParamGroup& group) const;
  kernels::AdamHyper hyper_of(const ParamGroup& group, int64_t step) const;
  // The fused kernels' view of a parameter's moments (made contiguous, created on first use).
  static std::pair<float*, float*> fused_moments(ParamState& st, const at::Tensor& master);
  // Every parameter's step count, which device-step mode needs to be one number.
  int64_t common_step_count(const char* what);
  int num_threads_;
  kernels::CpuIsa isa_;
  std::optional<DeviceStepState> device_step_;
};

}  // namespace colossus::optim
