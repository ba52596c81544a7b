// What the optimizers here share: per-parameter state (a step count and named
// tensors such as exp_avg), group options filled from an Options struct and
// validated, the state_dict()/load_state_dict() format, and running an update
// in fp32 for bf16/fp16 parameters.
#pragma once
#include "colossus/optim/optimizer.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace colossus::optim {

// One group holding every parameter, with the given lr and weight decay.
std::vector<ParamGroup> single_group(std::vector<at::Tensor> params, double lr, double weight_decay);

class StatefulOptimizer : public Optimizer {
 public:
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;
  // The live state tensors of parameter `flat_index` (none before its first
  // update), not copies: Gemini's NVMe offload empties and refills their
  // storage in place between steps.
  std::vector<at::Tensor> state_tensors(int64_t flat_index) const;

 protected:
  struct ParamState {
    int64_t step = 0;  // updates applied to this parameter
    std::map<std::string, at::Tensor> slots;
  };

  // `option_defaults` lists every extra option this optimizer knows (betas,
  // eps, ...) with the value a group gets when its `options` map lacks it; a
  // key outside this list is a ConfigError.
  StatefulOptimizer(std::vector<ParamGroup> groups, std::map<std::string, double> option_defaults);

  // Call at the end of a derived constructor (it calls virtual validate_group).
  void finish_construction();

  // Throws ConfigError naming the bad value; lr and weight_decay >= 0 are
  // checked before this.
  virtual void validate_group(const ParamGroup& group, size_t group_index) const = 0;
  // Slot names a loaded state may carry.
  virtual std::vector<std::string> slot_names() const = 0;
  // The slots every updated parameter (step > 0) of `group` has; a loaded
  // state lacking one is refused, since zeros would silently change the
  // resumed trajectory. All of slot_names() unless an option turns one off.
  virtual std::vector<std::string> required_slots(const ParamGroup& group) const {
    (void)group;
    return slot_names();
  }

  // Per-parameter state by flat index (params counted across groups in order).
  ParamState& state_at(int64_t flat_index);
  double option(const ParamGroup& group, const std::string& key) const;
  // Throws ConfigError when options.lr / options.weight_decay were changed
  // from their defaults while explicit groups carry their own.
  void reject_unused_group_defaults(bool lr_changed, bool weight_decay_changed) const;

  // Calls `fn(group, param, grad, state)` for every parameter with a gradient,
  // in flat order, with autograd off. `param` and `grad` are the update's
  // working tensors: the parameter itself when fp32/fp64, else an fp32 copy
  // that is rounded back into the parameter after `fn` returns (state tensors
  // are then fp32 too). Sparse gradients are refused with ConfigError.
  using UpdateFn = std::function<void(const ParamGroup& group, at::Tensor& param, const at::Tensor& grad,
                                      ParamState& state)>;
  void for_each_param_with_grad(const UpdateFn& fn);

  // Zero-filled state slot with the working tensor's shape, dtype and device.
  static at::Tensor& slot(ParamState& state, const std::string& name, const at::Tensor& like);

 private:
  void validate_all_groups() const;
  std::map<std::string, double> option_defaults_;
  std::vector<ParamState> state_;
};

}  // namespace colossus::optim
