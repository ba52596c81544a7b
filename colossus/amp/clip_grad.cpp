#include "colossus/amp/clip_grad.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <optional>

namespace colossus::amp {

at::Tensor vector_norm(const at::Tensor& g, double norm_type) {
  constexpr int64_t kRow = 4096;
  const bool blocked = g.device().is_cpu() && g.scalar_type() != at::kDouble && std::isfinite(norm_type) &&
                       g.numel() >= 2 * kRow;
  if (!blocked) {
    // 16-bit norms accumulate and come back in fp32.
    const bool half = g.scalar_type() == at::kBFloat16 || g.scalar_type() == at::kHalf;
    return at::linalg_vector_norm(g, norm_type, c10::nullopt, false,
                                  half ? std::optional<at::ScalarType>(at::kFloat) : std::nullopt);
  }
  const at::Tensor flat = g.reshape({-1});
  const int64_t whole = flat.numel() / kRow * kRow;
  // sum over rows of ||row||_p^p, and the tail's, in fp64.
  // 16-bit input is widened first, so it takes the fp32 kernel and gives the
  // bits the same values in fp32 give (the bf16 host step's norm must equal
  // the fp32 master-gradient path's).
  const at::Tensor rows = flat.narrow(0, 0, whole).view({-1, kRow});
  at::Tensor sum = at::linalg_vector_norm(rows.scalar_type() == at::kFloat ? rows : rows.to(at::kFloat), norm_type,
                                          at::IntArrayRef{1})
                       .to(at::kDouble)
                       .pow(norm_type)
                       .sum();
  if (whole < flat.numel()) sum = sum + flat.narrow(0, whole, flat.numel() - whole).to(at::kDouble).abs().pow(norm_type).sum();
  const auto out_type = at::isFloatingType(g.scalar_type()) ? at::kFloat : g.scalar_type();
  return sum.pow(1.0 / norm_type).to(out_type);
}

namespace {

// torch's clip_grad_norm_: per-tensor norms, then the norm of those norms.
// Returned as a one-element fp32 tensor (undefined when there is nothing).
at::Tensor total_norm_tensor(const std::vector<at::Tensor>& grads, double norm_type, const NormReducer& reduce,
                             const std::vector<double>& weights) {
  if (!(norm_type > 0.0)) {
    throw ConfigError(fmt::format("clip_grad_norm: norm_type={} is invalid; use 2 or infinity", norm_type));
  }
  if (!weights.empty() && weights.size() != grads.size()) {
    throw ConfigError(fmt::format("clip_grad_norm: {} weights for {} gradients", weights.size(), grads.size()));
  }
  std::vector<at::Tensor> norms;
  std::vector<double> kept_weights;
  c10::optional<at::Device> device;
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    if (!g.defined()) continue;
    if (!device) device = g.device();
    at::Tensor n = vector_norm(g, norm_type);
    if (n.scalar_type() != at::kFloat && n.scalar_type() != at::kDouble) n = n.to(at::kFloat);
    norms.push_back(n.to(*device));
    if (!weights.empty()) kept_weights.push_back(weights[i]);
  }
  if (norms.empty()) return {};
  at::Tensor stacked = at::stack(norms);
  at::Tensor total;
  if (kept_weights.empty() || std::isinf(norm_type)) {
    total = at::linalg_vector_norm(stacked, norm_type);
  } else {
    at::Tensor w = at::tensor(kept_weights, at::TensorOptions().dtype(at::kDouble)).to(stacked.options());
    total = (stacked.pow(norm_type) * w).sum().pow(1.0 / norm_type);
  }
  if (reduce) {
    if (std::isinf(norm_type)) {
      total = reduce(total, norm_type);
    } else {
      total = reduce(total.pow(norm_type), norm_type).pow(1.0 / norm_type);
    }
  }
  return total;
}

}  // namespace

double grad_norm(const std::vector<at::Tensor>& grads, double norm_type, const NormReducer& reduce,
                 const std::vector<double>& weights) {
  at::NoGradGuard no_grad;
  at::Tensor total = total_norm_tensor(grads, norm_type, reduce, weights);
  return total.defined() ? total.item<double>() : 0.0;
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, double norm_type,
                      const NormReducer& reduce, const std::vector<double>& weights) {
  if (!(max_norm >= 0.0)) {
    throw ConfigError(fmt::format("clip_grad_norm: max_norm={} is invalid; use a value >= 0, e.g. 1.0", max_norm));
  }
  at::NoGradGuard no_grad;
  at::Tensor total = total_norm_tensor(grads, norm_type, reduce, weights);
  if (!total.defined()) return 0.0;
  // As torch: the coefficient is applied even when it is 1 (a no-op), and a
  // non-finite norm makes the grads non-finite rather than raising. Python's
  // `max_norm / tensor` is reciprocal-then-multiply; so is this, for equal bits.
  at::Tensor coef = at::clamp_max((total + 1e-6).reciprocal() * max_norm, 1.0);
  for (const at::Tensor& g : grads) {
    if (g.defined()) g.mul_(coef.to(g.device()));
  }
  return total.item<double>();
}

}  // namespace colossus::amp
