#include "colossus/optim/adam.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

namespace colossus::optim {

namespace {

std::map<std::string, double> adam_option_defaults(const AdamOptions& o) {
  return {{"beta1", o.betas.beta1}, {"beta2", o.betas.beta2}, {"eps", o.eps}, {"amsgrad", o.amsgrad ? 1.0 : 0.0}};
}

AdamOptions to_adam_options(const AdamWOptions& o) {
  return {.lr = o.lr, .betas = o.betas, .eps = o.eps, .weight_decay = o.weight_decay, .amsgrad = o.amsgrad};
}

}  // namespace

void validate_betas_eps(const std::string& optimizer, size_t group_index, double beta1, double beta2, double eps) {
  for (auto [label, beta] : {std::pair{"beta1", beta1}, std::pair{"beta2", beta2}}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      throw ConfigError(fmt::format("{}: {}={} in param group {} is outside [0, 1); use e.g. betas = {{0.9, 0.999}}",
                                    optimizer, label, beta, group_index));
    }
  }
  if (!(eps >= 0.0) || !std::isfinite(eps)) {
    throw ConfigError(fmt::format("{}: eps={} in param group {} is invalid; use a finite eps >= 0, e.g. 1e-8",
                                  optimizer, eps, group_index));
  }
}

// torch/optim/adam.py, _single_tensor_adam without capturable/differentiable:
// the same ATen calls with the same (double) scalars, hence the same bits.
void adam_update_reference(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
                           at::Tensor* max_exp_avg_sq, int64_t step, const AdamMath& m) {
  at::Tensor g = grad;
  if (m.weight_decay != 0.0) {
    if (m.decoupled) {
      param.mul_(1.0 - m.lr * m.weight_decay);
    } else {
      g = g.add(param, m.weight_decay);
    }
  }
  exp_avg.lerp_(g, 1.0 - m.beta1);
  exp_avg_sq.mul_(m.beta2).addcmul_(g, g, 1.0 - m.beta2);
  double step_size = m.lr, bias_correction2_sqrt = 1.0;
  if (m.bias_correction) {
    const double s = static_cast<double>(step);
    step_size = m.lr / (1.0 - std::pow(m.beta1, s));
    bias_correction2_sqrt = std::pow(1.0 - std::pow(m.beta2, s), 0.5);
  }
  at::Tensor denom;
  if (max_exp_avg_sq != nullptr) {
    at::maximum_out(*max_exp_avg_sq, *max_exp_avg_sq, exp_avg_sq);
    denom = (max_exp_avg_sq->sqrt() / bias_correction2_sqrt).add_(m.eps);
  } else {
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(m.eps);
  }
  param.addcdiv_(exp_avg, denom, -step_size);
}

Adam::Adam(std::vector<at::Tensor> params, AdamOptions options)
    : Adam(single_group(std::move(params), options.lr, options.weight_decay), options, false, false) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options) : Adam(std::move(groups), options, false, true) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled, bool groups_given)
    : StatefulOptimizer(std::move(groups), adam_option_defaults(options)), decoupled_(decoupled) {
  if (groups_given) {
    const AdamOptions adam_defaults;
    const AdamWOptions adamw_defaults;
    const double default_wd = decoupled ? adamw_defaults.weight_decay : adam_defaults.weight_decay;
    reject_unused_group_defaults(options.lr != adam_defaults.lr, options.weight_decay != default_wd);
  }
  finish_construction();
}

void Adam::validate_group(const ParamGroup& group, size_t group_index) const {
  validate_betas_eps(name(), group_index, option(group, "beta1"), option(group, "beta2"), option(group, "eps"));
  const double amsgrad = option(group, "amsgrad");
  if (amsgrad != 0.0 && amsgrad != 1.0) {
    throw ConfigError(fmt::format("{}: amsgrad={} in param group {} must be 0 or 1", name(), amsgrad, group_index));
  }
}

void Adam::step() {
  for_each_param_with_grad([&](const ParamGroup& group, at::Tensor& param, const at::Tensor& grad, ParamState& st) {
    const AdamMath math{.lr = group.lr,
                        .beta1 = option(group, "beta1"),
                        .beta2 = option(group, "beta2"),
                        .eps = option(group, "eps"),
                        .weight_decay = group.weight_decay,
                        .decoupled = decoupled_,
                        .bias_correction = true};
    at::Tensor& exp_avg = slot(st, "exp_avg", param);
    at::Tensor& exp_avg_sq = slot(st, "exp_avg_sq", param);
    at::Tensor* max_sq = option(group, "amsgrad") != 0.0 ? &slot(st, "max_exp_avg_sq", param) : nullptr;
    st.step += 1;
    adam_update_reference(param, grad, exp_avg, exp_avg_sq, max_sq, st.step, math);
  });
}

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options)
    : Adam(single_group(std::move(params), options.lr, options.weight_decay), to_adam_options(options), true, false) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Adam(std::move(groups), to_adam_options(options), true, true) {}

std::vector<std::string> Adam::required_slots(const ParamGroup& group) const {
  if (option(group, "amsgrad") != 0.0) return slot_names();
  return {"exp_avg", "exp_avg_sq"};
}

}  // namespace colossus::optim
