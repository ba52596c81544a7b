#include "colossus/optim/hybrid_adam.h"

#include "colossus/core/errors.h"
#include "colossus/kernels/cuda_slots.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
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

AdamMath HybridAdam::math_of(const ParamGroup& group) const {
  return {.lr = group.lr,
          .beta1 = option(group, "beta1"),
          .beta2 = option(group, "beta2"),
          .eps = option(group, "eps"),
          .weight_decay = group.weight_decay,
          .decoupled = option(group, "adamw_mode") != 0.0,
          .bias_correction = option(group, "bias_correction") != 0.0};
}

kernels::AdamHyper HybridAdam::hyper_of(const ParamGroup& group, int64_t step) const {
  const AdamMath math = math_of(group);
  return kernels::make_adam_hyper(math.lr, math.beta1, math.beta2, math.eps, math.weight_decay, math.decoupled,
                                  math.bias_correction, step);
}

std::pair<float*, float*> HybridAdam::fused_moments(ParamState& st, const at::Tensor& master) {
  at::Tensor& m = slot(st, "exp_avg", master);
  at::Tensor& v = slot(st, "exp_avg_sq", master);
  if (!m.is_contiguous()) m = m.contiguous();
  if (!v.is_contiguous()) v = v.contiguous();
  return {m.data_ptr<float>(), v.data_ptr<float>()};
}

void HybridAdam::step() {
  at::NoGradGuard no_grad;
  if (device_step_) {
    throw ConfigError("HybridAdam: in device-step mode (CUDA graphs) the step count lives on the device; step "
                      "through step_from_low_precision (bf16 parameters with fp32 masters)");
  }
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
    const AdamMath math = math_of(group);
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
      const auto [m, v] = fused_moments(st, param);
      kernels::AdamTensorPtrs ptrs{param.data_ptr<float>(), g.data_ptr<float>(), m, v, param.numel()};
      if (param.is_cpu()) {
        cpu_batches[{-1, st.step}].push_back(ptrs);
      } else {
        cuda_batches[{param.get_device(), st.step}].push_back(ptrs);
      }
    }
    for (const auto& [key, table] : cpu_batches) {
      const auto hyper = hyper_of(group, key.second);
      kernels::adam_step_cpu(table.data(), static_cast<int64_t>(table.size()), hyper, num_threads_, isa_);
    }
    for (const auto& [key, table] : cuda_batches) {
      const auto hyper = hyper_of(group, key.second);
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
  if (device_step_) {
    step_on_device(low_precision);
    return;
  }
  size_t flat = 0;
  for (const ParamGroup& group : groups_) {
    std::map<std::pair<int, int64_t>, std::vector<kernels::AdamMixedPtrs>> batches;
    for (const at::Tensor& master : group.params) {
      const int64_t index = static_cast<int64_t>(flat);
      const at::Tensor& low = low_precision[flat++];
      ParamState& st = state_at(index);
      st.step += 1;
      const auto [m, v] = fused_moments(st, master);
      batches[{master.get_device(), st.step}].push_back(
          {master.data_ptr<float>(), low.grad().data_ptr(), m, v, low.data_ptr(), master.numel()});
    }
    for (const auto& [key, table] : batches) {
      const auto hyper = hyper_of(group, key.second);
      kernels::cuda_slots().adam_mixed(table.data(), static_cast<int64_t>(table.size()), hyper, key.first);
    }
  }
}

void HybridAdam::step_host_mixed(const std::vector<int64_t>& indices, const std::vector<at::Tensor>& grads_in_out,
                                 float grad_scale) {
  step_host_mixed(indices, grads_in_out, grads_in_out, grad_scale);
}

void HybridAdam::step_host_mixed(const std::vector<int64_t>& indices, const std::vector<at::Tensor>& grads,
                                 const std::vector<at::Tensor>& params_bf16, float grad_scale) {
  if (indices.size() != grads.size() || indices.size() != params_bf16.size()) {
    throw ConfigError(fmt::format("HybridAdam: step_host_mixed got {} indices, {} gradients and {} bf16 outputs",
                                  indices.size(), grads.size(), params_bf16.size()));
  }
  if (device_step_) throw ConfigError("HybridAdam: step_host_mixed in device-step mode (CUDA graphs)");
  // Group g holds flat indices [group_end[g - 1], group_end[g]).
  std::vector<int64_t> group_end;
  for (const ParamGroup& group : groups_)
    group_end.push_back((group_end.empty() ? 0 : group_end.back()) + static_cast<int64_t>(group.params.size()));
  const int64_t params = group_end.empty() ? 0 : group_end.back();
  // Batched by (group, step count): the constants depend on both; one table
  // a gradient dtype.
  std::map<std::pair<size_t, int64_t>, std::vector<kernels::AdamMixedPtrs>> bf16_batches;
  std::map<std::pair<size_t, int64_t>, std::vector<kernels::AdamMixedFp32GradPtrs>> fp32_batches;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t index = indices[i];
    if (index < 0 || index >= params) {
      throw ConfigError(fmt::format("HybridAdam: step_host_mixed index {} is outside [0, {})", index, params));
    }
    const auto after = std::upper_bound(group_end.begin(), group_end.end(), index);
    const size_t g = static_cast<size_t>(after - group_end.begin());
    const at::Tensor& master = groups_[g].params[static_cast<size_t>(index - (g == 0 ? 0 : group_end[g - 1]))];
    const at::Tensor& grad = grads[i];
    const at::Tensor& out = params_bf16[i];
    const bool fp32_grad = grad.scalar_type() == at::kFloat;
    const bool aliased = grad.data_ptr() == out.data_ptr();
    if (!master.is_cpu() || master.scalar_type() != at::kFloat || !master.is_contiguous() || !grad.is_cpu() ||
        (grad.scalar_type() != at::kBFloat16 && !fp32_grad) || !grad.is_contiguous() ||
        grad.numel() != master.numel() || !out.is_cpu() || out.scalar_type() != at::kBFloat16 ||
        !out.is_contiguous() || out.numel() != master.numel() || (!fp32_grad && !aliased)) {
      throw ConfigError(fmt::format(
          "HybridAdam: step_host_mixed needs a contiguous fp32 CPU master, a bf16 CPU gradient of its size that "
          "the bf16 parameter is written over or an fp32 one beside a bf16 output; parameter {} is {} on {} with a "
          "{} gradient of {} values on {} and a {} output of {} values",
          index, c10::toString(master.scalar_type()), master.device().str(), c10::toString(grad.scalar_type()),
          grad.numel(), grad.device().str(), c10::toString(out.scalar_type()), out.numel()));
    }
    ParamState& st = state_at(index);
    st.step += 1;
    const auto [m, v] = fused_moments(st, master);
    if (fp32_grad) {
      fp32_batches[{g, st.step}].push_back(
          {master.data_ptr<float>(), grad.data_ptr<float>(), m, v, out.data_ptr(), master.numel()});
    } else {
      bf16_batches[{g, st.step}].push_back({master.data_ptr<float>(), grad.data_ptr(), m, v, out.data_ptr(),
                                            master.numel()});
    }
  }
  for (const auto& [key, table] : bf16_batches) {
    kernels::adam_step_mixed_cpu(table.data(), static_cast<int64_t>(table.size()), hyper_of(groups_[key.first], key.second),
                                 grad_scale, num_threads_, isa_);
  }
  for (const auto& [key, table] : fp32_batches) {
    kernels::adam_step_mixed_cpu(table.data(), static_cast<int64_t>(table.size()), hyper_of(groups_[key.first], key.second),
                                 grad_scale, num_threads_, isa_);
  }
}

int64_t HybridAdam::common_step_count(const char* what) {
  int64_t flat = 0;
  for (const ParamGroup& group : groups_) flat += static_cast<int64_t>(group.params.size());
  const int64_t step = flat > 0 ? state_at(0).step : 0;
  for (int64_t i = 1; i < flat; ++i) {
    if (state_at(i).step != step) {
      throw ConfigError(fmt::format("HybridAdam: {}: parameter {} has taken {} steps but parameter 0 has taken {}; "
                                    "device-step mode (CUDA graphs) keeps one step count for all parameters",
                                    what, i, state_at(i).step, step));
    }
  }
  return step;
}

void HybridAdam::enable_device_step() {
  if (device_step_) return;
  const auto& slots = kernels::cuda_slots();
  if (slots.adam_mixed_device == nullptr || slots.adam_device_finish == nullptr) {
    throw ConfigError("HybridAdam: device-step mode (CUDA graphs) needs the CUDA kernels; this build has none "
                      "(configure with COLOSSUS_CUDA=ON)");
  }
  std::optional<at::Device> device;
  for (const ParamGroup& group : groups_) {
    for (const at::Tensor& p : group.params) {
      if (!p.is_cuda() || p.scalar_type() != at::kFloat || !p.is_contiguous() || (device && p.device() != *device)) {
        throw ConfigError(fmt::format("HybridAdam: device-step mode (CUDA graphs) needs contiguous fp32 parameters "
                                      "on one CUDA device; one is {} {} on {}",
                                      c10::toString(p.scalar_type()), p.is_contiguous() ? "contiguous" : "strided",
                                      p.device().str()));
      }
      device = p.device();
    }
  }
  if (!device) throw ConfigError("HybridAdam: device-step mode needs at least one parameter");
  const auto options = at::TensorOptions().device(*device);
  DeviceStepState state{.lr = at::zeros({static_cast<int64_t>(groups_.size())}, options.dtype(at::kDouble)),
                        .counters = at::zeros({3}, options.dtype(at::kLong)),
                        .skip = at::zeros({1}, options.dtype(at::kInt))};
  state.counters[0].fill_(common_step_count("enable_device_step"));
  device_step_ = std::move(state);
  prepare_device_step();
}

void HybridAdam::prepare_device_step() {
  if (!device_step_) return;
  std::vector<double> lrs;
  for (const ParamGroup& group : groups_) lrs.push_back(group.lr);
  // From pinned memory, asynchronously: the host allocator keeps the buffer
  // until the copy has run, so the caller never waits here.
  const at::Tensor host = at::tensor(lrs, at::TensorOptions().dtype(at::kDouble)).pin_memory();
  device_step_->lr.copy_(host, /*non_blocking=*/true);
}

void HybridAdam::step_on_device(const std::vector<at::Tensor>& low_precision) {
  const auto& slots = kernels::cuda_slots();
  DeviceStepState& d = *device_step_;
  const int device = d.counters.get_device();
  size_t flat = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    const kernels::AdamGroupConstants constants{.beta1 = option(group, "beta1"),
                                                .beta2 = option(group, "beta2"),
                                                .eps = option(group, "eps"),
                                                .weight_decay = group.weight_decay,
                                                .decoupled = option(group, "adamw_mode") != 0.0,
                                                .bias_correction = option(group, "bias_correction") != 0.0};
    std::vector<kernels::AdamMixedPtrs> table;
    for (const at::Tensor& master : group.params) {
      const int64_t index = static_cast<int64_t>(flat);
      const at::Tensor& low = low_precision[flat++];
      ParamState& st = state_at(index);
      const auto [m, v] = fused_moments(st, master);
      table.push_back({master.data_ptr<float>(), low.grad().data_ptr(), m, v, low.data_ptr(), master.numel()});
    }
    slots.adam_mixed_device(table.data(), static_cast<int64_t>(table.size()), constants,
                            d.lr.data_ptr<double>() + g, d.counters.data_ptr<int64_t>(), d.skip.data_ptr<int32_t>(),
                            device);
  }
  slots.adam_device_finish(d.counters.data_ptr<int64_t>(), d.skip.data_ptr<int32_t>(), device);
}

OptimizerState HybridAdam::state_dict() const {
  if (device_step_) {
    // The device count is the truth in device-step mode; mirroring it into
    // the host state changes nothing a caller can observe otherwise.
    auto& self = const_cast<HybridAdam&>(*this);
    const int64_t steps = device_step_->counters[0].item<int64_t>();
    int64_t flat = 0;
    for (const ParamGroup& group : groups_) flat += static_cast<int64_t>(group.params.size());
    for (int64_t i = 0; i < flat; ++i) self.state_at(i).step = steps;
  }
  return StatefulOptimizer::state_dict();
}

void HybridAdam::load_state_dict(const OptimizerState& state) {
  StatefulOptimizer::load_state_dict(state);
  if (device_step_) device_step_->counters[0].fill_(common_step_count("load_state_dict"));
}

}  // namespace colossus::optim
