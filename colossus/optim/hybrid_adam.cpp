#include "colossus/optim/hybrid_adam.h"

#include "colossus/core/errors.h"
#include "colossus/kernels/cuda_slots.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <utility>

namespace colossus::optim {

HybridAdam::HybridAdam(std::vector<at::Tensor> params, HybridAdamOptions options)
    : HybridAdam(single_group(std::move(params), options.lr, options.weight_decay), options, false) {}

HybridAdam::HybridAdam(std::vector<ParamGroup> groups, HybridAdamOptions options)
    : HybridAdam(std::move(groups), options, true) {}

HybridAdam::HybridAdam(std::vector<ParamGroup> groups, const HybridAdamOptions& o, bool groups_given)
    : StatefulOptimizer(std::move(groups), {{"beta1", o.betas.beta1},
                                            {"beta2", o.betas.beta2},
                                            {"eps", o.eps},
                                            {"adamw_mode", o.adamw_mode ? 1.0 : 0.0},
                                            {"bias_correction", o.bias_correction ? 1.0 : 0.0}}),
      num_threads_(o.num_threads),
      isa_(kernels::best_cpu_isa()) {
  if (o.num_threads < 0) {
    throw ConfigError(fmt::format("HybridAdam: num_threads={} is negative; use 0 (all cores) or a count", o.num_threads));
  }
  if (groups_given) {
    const HybridAdamOptions defaults;
    reject_unused_group_defaults(o.lr != defaults.lr, o.weight_decay != defaults.weight_decay);
  }
  finish_construction();
}

void HybridAdam::set_cpu_isa(kernels::CpuIsa isa) {
  if (!kernels::cpu_supports(isa)) {
    throw ConfigError(fmt::format("HybridAdam: this CPU does not support {}; use {}", kernels::isa_name(isa),
                                  kernels::isa_name(kernels::best_cpu_isa())));
  }
  isa_ = isa;
}

void HybridAdam::validate_group(const ParamGroup& group, size_t group_index) const {
  validate_betas_eps(name(), group_index, option(group, "beta1"), option(group, "beta2"), option(group, "eps"));
  for (const char* flag : {"adamw_mode", "bias_correction"}) {
    const double v = option(group, flag);
    if (v != 0.0 && v != 1.0) {
      throw ConfigError(fmt::format("HybridAdam: {}={} in param group {} must be 0 or 1", flag, v, group_index));
    }
  }
}

void HybridAdam::step() {
  at::NoGradGuard no_grad;
  if (kernels::cuda_slots().adam == nullptr) {
    // Refuse before anything changed, so a failed step leaves no half-update.
    for (const ParamGroup& group : groups_) {
      for (const at::Tensor& param : group.params) {
        if (param.is_cuda() && param.grad().defined()) {
          throw ConfigError(fmt::format("HybridAdam: a parameter is on {} but this program has no CUDA kernels linked "
                                        "(build with -DCOLOSSUS_CUDA=ON and link the `colossus` target)",
                                        param.device().str()));
        }
      }
    }
  }
  int64_t flat = 0;
  for (const ParamGroup& group : groups_) {
    const AdamMath math{.lr = group.lr,
                        .beta1 = option(group, "beta1"),
                        .beta2 = option(group, "beta2"),
                        .eps = option(group, "eps"),
                        .weight_decay = group.weight_decay,
                        .decoupled = option(group, "adamw_mode") != 0.0,
                        .bias_correction = option(group, "bias_correction") != 0.0};
    // Fused work batched by (device, step count): the bias corrections depend on the step.
    std::map<std::pair<int, int64_t>, std::vector<kernels::AdamTensorPtrs>> cpu_batches, cuda_batches;
    std::vector<at::Tensor> converted_grads;  // fp32 contiguous copies, alive until the kernels ran
    for (const at::Tensor& param : group.params) {
      const int64_t index = flat++;
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) {
        throw ConfigError(fmt::format("HybridAdam: parameter {} has a sparse gradient; only dense gradients are "
                                      "supported",
                                      index));
      }
      ParamState& st = state_at(index);
      st.step += 1;
      const bool fused = param.scalar_type() == at::kFloat && param.is_contiguous() &&
                         (param.is_cpu() || param.is_cuda());
      if (!fused) {
        // Reference path, in fp32 for bf16/fp16 parameters.
        const bool low = param.scalar_type() != at::kFloat && param.scalar_type() != at::kDouble;
        at::Tensor p = low ? param.to(at::kFloat) : param;
        at::Tensor g = grad.to(p.scalar_type());
        adam_update_reference(p, g, slot(st, "exp_avg", p), slot(st, "exp_avg_sq", p), nullptr, st.step, math);
        if (low) param.copy_(p);
        continue;
      }
      at::Tensor g = grad;
      if (g.scalar_type() != at::kFloat || !g.is_contiguous() || g.device() != param.device()) {
        g = grad.to(param.device(), at::kFloat).contiguous();
        converted_grads.push_back(g);
      }
      at::Tensor& m = slot(st, "exp_avg", param);
      at::Tensor& v = slot(st, "exp_avg_sq", param);
      if (!m.is_contiguous()) m = m.contiguous();
      if (!v.is_contiguous()) v = v.contiguous();
      kernels::AdamTensorPtrs ptrs{param.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                                   v.data_ptr<float>(), param.numel()};
      if (param.is_cpu()) {
        cpu_batches[{-1, st.step}].push_back(ptrs);
      } else {
        cuda_batches[{param.get_device(), st.step}].push_back(ptrs);
      }
    }
    for (const auto& [key, table] : cpu_batches) {
      const auto hyper = kernels::make_adam_hyper(math.lr, math.beta1, math.beta2, math.eps, math.weight_decay,
                                                  math.decoupled, math.bias_correction, key.second);
      kernels::adam_step_cpu(table.data(), static_cast<int64_t>(table.size()), hyper, num_threads_, isa_);
    }
    for (const auto& [key, table] : cuda_batches) {
      const auto hyper = kernels::make_adam_hyper(math.lr, math.beta1, math.beta2, math.eps, math.weight_decay,
                                                  math.decoupled, math.bias_correction, key.second);
      kernels::cuda_slots().adam(table.data(), static_cast<int64_t>(table.size()), hyper, key.first);
    }
    // converted_grads may be freed now: CUDA work is stream-ordered before any reuse.
  }
}

bool HybridAdam::can_step_from_low_precision(const std::vector<at::Tensor>& low_precision) const {
  if (kernels::cuda_slots().adam_mixed == nullptr) return false;
  size_t flat = 0;
  for (const ParamGroup& group : groups_) {
    for (const at::Tensor& master : group.params) {
      if (flat >= low_precision.size()) return false;
      const at::Tensor& low = low_precision[flat++];
      if (!low.defined() || !low.grad().defined()) return false;
      const at::Tensor& grad = low.grad();
      if (!master.is_cuda() || master.scalar_type() != at::kFloat || !master.is_contiguous() ||
          low.scalar_type() != at::kBFloat16 || !low.is_contiguous() || grad.scalar_type() != at::kBFloat16 ||
          !grad.is_contiguous() || grad.is_sparse() || low.device() != master.device() ||
          grad.device() != master.device() || low.numel() != master.numel()) {
        return false;
      }
    }
  }
  return flat == low_precision.size();
}

void HybridAdam::step_from_low_precision(const std::vector<at::Tensor>& low_precision) {
  if (!can_step_from_low_precision(low_precision)) {
    throw ConfigError("HybridAdam: step_from_low_precision needs CUDA fp32 masters with bf16 model copies and "
                      "gradients for every parameter; use step() after copying the gradients");
  }
  at::NoGradGuard no_grad;
  size_t flat = 0;
  for (const ParamGroup& group : groups_) {
    const AdamMath math{.lr = group.lr,
                        .beta1 = option(group, "beta1"),
                        .beta2 = option(group, "beta2"),
                        .eps = option(group, "eps"),
                        .weight_decay = group.weight_decay,
                        .decoupled = option(group, "adamw_mode") != 0.0,
                        .bias_correction = option(group, "bias_correction") != 0.0};
    std::map<std::pair<int, int64_t>, std::vector<kernels::AdamMixedPtrs>> batches;
    for (const at::Tensor& master : group.params) {
      const int64_t index = static_cast<int64_t>(flat);
      const at::Tensor& low = low_precision[flat++];
      ParamState& st = state_at(index);
      st.step += 1;
      at::Tensor& m = slot(st, "exp_avg", master);
      at::Tensor& v = slot(st, "exp_avg_sq", master);
      if (!m.is_contiguous()) m = m.contiguous();
      if (!v.is_contiguous()) v = v.contiguous();
      batches[{master.get_device(), st.step}].push_back({master.data_ptr<float>(), low.grad().data_ptr(),
                                                         m.data_ptr<float>(), v.data_ptr<float>(), low.data_ptr(),
                                                         master.numel()});
    }
    for (const auto& [key, table] : batches) {
      const auto hyper = kernels::make_adam_hyper(math.lr, math.beta1, math.beta2, math.eps, math.weight_decay,
                                                  math.decoupled, math.bias_correction, key.second);
      kernels::cuda_slots().adam_mixed(table.data(), static_cast<int64_t>(table.size()), hyper, key.first);
    }
  }
}

}  // namespace colossus::optim
