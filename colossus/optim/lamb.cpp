#include "colossus/optim/lamb.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace colossus::optim {

namespace {

const char* const kFlags[] = {"bias_correction", "adam_w_mode", "grad_averaging", "use_nvlamb"};

std::map<std::string, double> lamb_option_defaults(const LambOptions& o) {
  return {{"beta1", o.betas.beta1},
          {"beta2", o.betas.beta2},
          {"eps", o.eps},
          {"bias_correction", o.bias_correction ? 1.0 : 0.0},
          {"adam_w_mode", o.adam_w_mode ? 1.0 : 0.0},
          {"grad_averaging", o.grad_averaging ? 1.0 : 0.0},
          {"use_nvlamb", o.use_nvlamb ? 1.0 : 0.0},
          {"max_grad_norm", o.max_grad_norm}};
}

}  // namespace

Lamb::Lamb(std::vector<at::Tensor> params, LambOptions options)
    : Lamb(single_group(std::move(params), options.lr, options.weight_decay), options, false) {}

Lamb::Lamb(std::vector<ParamGroup> groups, LambOptions options) : Lamb(std::move(groups), options, true) {}

Lamb::Lamb(std::vector<ParamGroup> groups, const LambOptions& options, bool groups_given)
    : StatefulOptimizer(std::move(groups), lamb_option_defaults(options)) {
  if (groups_given) {
    const LambOptions defaults;
    reject_unused_group_defaults(options.lr != defaults.lr, options.weight_decay != defaults.weight_decay);
  }
  finish_construction();
}

void Lamb::validate_group(const ParamGroup& group, size_t group_index) const {
  validate_betas_eps(name(), group_index, option(group, "beta1"), option(group, "beta2"), option(group, "eps"));
  for (const char* flag : kFlags) {
    const double v = option(group, flag);
    if (v != 0.0 && v != 1.0) {
      throw ConfigError(fmt::format("Lamb: {}={} in param group {} must be 0 or 1", flag, v, group_index));
    }
  }
  const double max_norm = option(group, "max_grad_norm");
  if (!(max_norm >= 0.0)) {
    throw ConfigError(fmt::format("Lamb: max_grad_norm={} in param group {} is negative; use 0 (off) or e.g. 1.0",
                                  max_norm, group_index));
  }
}

void Lamb::step() {
  at::NoGradGuard no_grad;
  // Global grad-norm clipping first (FusedLAMB stage 0), over every group.
  double grad_divisor = 1.0;
  const double max_grad_norm = groups_.empty() ? 0.0 : option(groups_[0], "max_grad_norm");
  int64_t num_params = 0;
  for (const auto& group : groups_) num_params += static_cast<int64_t>(group.params.size());
  if (max_grad_norm > 0.0) {
    std::vector<double> sum_sq(1, 0.0);
    for (const auto& group : groups_) {
      for (const auto& p : group.params) {
        if (p.grad().defined()) sum_sq[0] += at::linalg_vector_norm(p.grad().to(at::kFloat), 2).pow(2).item<double>();
      }
    }
    if (partition_reducer_) partition_reducer_(sum_sq);
    const double global_norm = std::sqrt(sum_sq[0]);
    if (global_norm > max_grad_norm) grad_divisor = global_norm / max_grad_norm;
  }
  trust_ratios_.assign(static_cast<size_t>(num_params), std::numeric_limits<double>::quiet_NaN());
  if (partition_reducer_) return step_partitioned(grad_divisor);
  // for_each_param_with_grad visits parameters with a grad in flat order.
  int64_t visit = 0;
  std::vector<int64_t> with_grad;
  {
    int64_t i = 0;
    for (const auto& group : groups_) {
      for (const auto& p : group.params) {
        if (p.grad().defined()) with_grad.push_back(i);
        ++i;
      }
    }
  }
  for_each_param_with_grad([&](const ParamGroup& group, at::Tensor& param, const at::Tensor& grad, ParamState& st) {
    const double beta1 = option(group, "beta1"), beta2 = option(group, "beta2"), eps = option(group, "eps");
    const double wd = group.weight_decay;
    const bool adam_w_mode = option(group, "adam_w_mode") != 0.0;
    at::Tensor& exp_avg = slot(st, "exp_avg", param);
    at::Tensor& exp_avg_sq = slot(st, "exp_avg_sq", param);
    st.step += 1;
    at::Tensor g = grad_divisor != 1.0 ? grad / grad_divisor : grad;
    if (!adam_w_mode && wd != 0.0) g = g.add(param, wd);
    const double grad_weight = option(group, "grad_averaging") != 0.0 ? 1.0 - beta1 : 1.0;
    exp_avg.mul_(beta1).add_(g, grad_weight);
    exp_avg_sq.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
    double bias_correction1 = 1.0, bias_correction2 = 1.0;
    if (option(group, "bias_correction") != 0.0) {
      const double s = static_cast<double>(st.step);
      bias_correction1 = 1.0 - std::pow(beta1, s);
      bias_correction2 = 1.0 - std::pow(beta2, s);
    }
    at::Tensor update = (exp_avg / bias_correction1) / (exp_avg_sq / bias_correction2).sqrt().add_(eps);
    if (adam_w_mode && wd != 0.0) update.add_(param, wd);
    double trust_ratio = 1.0;
    if (option(group, "use_nvlamb") != 0.0 || wd != 0.0) {
      const double param_norm = at::linalg_vector_norm(param, 2).item<double>();
      const double update_norm = at::linalg_vector_norm(update, 2).item<double>();
      if (param_norm != 0.0 && update_norm != 0.0) trust_ratio = param_norm / update_norm;
    }
    trust_ratios_[static_cast<size_t>(with_grad[static_cast<size_t>(visit++)])] = trust_ratio;
    param.add_(update, -group.lr * trust_ratio);
  });
}

// Two passes: every update first, then one reduction of all the partial
// norms (a collective must see the same calls on every rank), then the apply.
void Lamb::step_partitioned(double grad_divisor) {
  struct Pending {
    at::Tensor param, update;
    double lr;
    bool trust;
    int64_t index;
  };
  std::vector<Pending> pending;
  int64_t flat = 0;
  for (const auto& group : groups_) {
    for (const auto& p : group.params) {
      const int64_t index = flat++;
      if (!p.grad().defined()) continue;
      if (p.scalar_type() != at::kFloat && p.scalar_type() != at::kDouble) {
        throw ConfigError(fmt::format("Lamb: parameter {} is {}; a partitioned Lamb steps fp32/fp64 tensors only",
                                      index, c10::toString(p.scalar_type())));
      }
      pending.push_back({p, {}, group.lr, option(group, "use_nvlamb") != 0.0 || group.weight_decay != 0.0, index});
    }
  }
  size_t visit = 0;
  for_each_param_with_grad([&](const ParamGroup& group, at::Tensor& param, const at::Tensor& grad, ParamState& st) {
    const double beta1 = option(group, "beta1"), beta2 = option(group, "beta2"), eps = option(group, "eps");
    const double wd = group.weight_decay;
    const bool adam_w_mode = option(group, "adam_w_mode") != 0.0;
    at::Tensor& exp_avg = slot(st, "exp_avg", param);
    at::Tensor& exp_avg_sq = slot(st, "exp_avg_sq", param);
    st.step += 1;
    at::Tensor g = grad_divisor != 1.0 ? grad / grad_divisor : grad;
    if (!adam_w_mode && wd != 0.0) g = g.add(param, wd);
    const double grad_weight = option(group, "grad_averaging") != 0.0 ? 1.0 - beta1 : 1.0;
    exp_avg.mul_(beta1).add_(g, grad_weight);
    exp_avg_sq.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
    double bias_correction1 = 1.0, bias_correction2 = 1.0;
    if (option(group, "bias_correction") != 0.0) {
      const double s = static_cast<double>(st.step);
      bias_correction1 = 1.0 - std::pow(beta1, s);
      bias_correction2 = 1.0 - std::pow(beta2, s);
    }
    at::Tensor update = (exp_avg / bias_correction1) / (exp_avg_sq / bias_correction2).sqrt().add_(eps);
    if (adam_w_mode && wd != 0.0) update.add_(param, wd);
    pending[visit++].update = update;
  });
  // Per parameter: squared norm of the parameter, then of its update.
  std::vector<double> sums(2 * pending.size(), 0.0);
  for (size_t i = 0; i < pending.size(); ++i) {
    if (!pending[i].trust) continue;
    sums[2 * i] = at::linalg_vector_norm(pending[i].param, 2).pow(2).item<double>();
    sums[2 * i + 1] = at::linalg_vector_norm(pending[i].update, 2).pow(2).item<double>();
  }
  partition_reducer_(sums);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < pending.size(); ++i) {
    double trust_ratio = 1.0;
    const double param_norm = std::sqrt(sums[2 * i]), update_norm = std::sqrt(sums[2 * i + 1]);
    if (pending[i].trust && param_norm != 0.0 && update_norm != 0.0) trust_ratio = param_norm / update_norm;
    trust_ratios_[static_cast<size_t>(pending[i].index)] = trust_ratio;
    pending[i].param.add_(pending[i].update, -pending[i].lr * trust_ratio);
  }
}

}  // namespace colossus::optim
