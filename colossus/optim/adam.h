// Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight
// decay), with torch.optim's semantics and order of operations (its
// single-tensor path), so trajectories match torch bit for bit in fp32.
#pragma once
#include "colossus/optim/stateful_optimizer.h"

namespace colossus::optim {

struct Betas {
  double beta1 = 0.9;
  double beta2 = 0.999;
};

struct AdamOptions {
  double lr = 1e-3;
  Betas betas = {};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
};

struct AdamWOptions {
  double lr = 1e-3;
  Betas betas = {};
  double eps = 1e-8;
  double weight_decay = 1e-2;  // torch.optim.AdamW's default
  bool amsgrad = false;
};

// The hyper-parameters of one update, as torch's functional adam takes them.
struct AdamMath {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;        // AdamW
  bool bias_correction = true;  // false: Colossal-AI's bias_correction=False
};

// One update in place, step = 1 for the first: param, grad, exp_avg and
// exp_avg_sq share shape, device and a float dtype; max_exp_avg_sq is null
// unless amsgrad. This is the unfused reference that the fused kernels
// (colossus/kernels/adam.h) are tested against.
void adam_update_reference(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                           at::Tensor* max_exp_avg_sq, int64_t step, const AdamMath& math);

// Group options: "beta1", "beta2", "eps", "amsgrad" (0 or 1).
// State slots: "exp_avg", "exp_avg_sq", and "max_exp_avg_sq" with amsgrad.
class Adam : public StatefulOptimizer {
 public:
  explicit Adam(std::vector<at::Tensor> params, AdamOptions options = {});
  // Each group's lr and weight_decay are its own; the options fill the extras.
  explicit Adam(std::vector<ParamGroup> groups, AdamOptions options = {});
  void step() override;
  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }

 protected:
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled, bool groups_given);
  void validate_group(const ParamGroup& group, size_t group_index) const override;
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}; }
  std::vector<std::string> required_slots(const ParamGroup& group) const override;

 private:
  bool decoupled_;
};

class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<at::Tensor> params, AdamWOptions options = {});
  explicit AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
};

// Shared by Adam-like optimizers: beta in [0, 1), eps >= 0, named in the error.
void validate_betas_eps(const std::string& optimizer, size_t group_index, double beta1, double beta2, double eps);

}  // namespace colossus::optim
