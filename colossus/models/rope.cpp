#include "colossus/models/rope.h"

#include <ATen/ops/addcmul.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/roll.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>
#include <numbers>

namespace colossus::models {

RopeSpec rope_spec(const LlamaConfig& config) {
  return RopeSpec{.head_dim = config.rotary_dim(),
                  .theta = config.rope_theta,
                  .scaling = config.rope_scaling,
                  .max_position_embeddings = config.max_position_embeddings};
}

namespace {

// 1 / base^(2i / dim) for i < dim/2, in fp32 like HF.
at::Tensor default_inv_freq(const at::Tensor& base, int64_t dim) {
  at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  return at::pow(base, exponents).reciprocal();
}

at::Tensor llama3_inv_freq(const at::Tensor& inv_freq, const RopeSpec& spec) {
  const RopeScaling& s = spec.scaling;
  const double old_context = static_cast<double>(s.original_max_position_embeddings.value_or(spec.max_position_embeddings));
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  at::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
  // Long wavelengths (low frequencies) are slowed by factor, short ones kept,
  // the band between interpolated.
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  at::Tensor smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

// YaRN: per dimension pair, the original frequency (fast rotations, past
// beta_fast turns over the original context) or the factor-interpolated one
// (slow, under beta_slow turns), with a linear ramp between; fp32 like HF.
at::Tensor yarn_inv_freq(const at::Tensor& base, const RopeSpec& spec) {
  const RopeScaling& s = spec.scaling;
  const int64_t dim = spec.head_dim;
  const double theta = spec.theta;
  const double original = static_cast<double>(s.original_max_position_embeddings.value_or(spec.max_position_embeddings));
  // The dimension whose frequency turns `rotations` times over the original context.
  const auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) * std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // no zero-width ramp
  at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  at::Tensor extrapolation_factor = 1 - ramp;
  at::Tensor pos_freqs = at::pow(base, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim));
  at::Tensor extrapolation = 1.0 / pos_freqs;
  at::Tensor interpolation = 1.0 / (s.factor * pos_freqs);
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

}  // namespace

double yarn_mscale(double factor, double mscale) { return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

at::Tensor rope_inv_freq(const RopeSpec& spec, int64_t seq_len) {
  const int64_t dim = spec.head_dim;
  const RopeScaling& s = spec.scaling;
  at::Tensor base = at::scalar_tensor(spec.theta, at::kFloat);
  if (s.rope_type == "dynamic" && seq_len > spec.max_position_embeddings) {
    // NTK-aware: grow the base with the length, in fp32 tensors as HF does.
    at::Tensor length = at::scalar_tensor(seq_len, at::kLong);
    at::Tensor ratio = s.factor * length / static_cast<double>(spec.max_position_embeddings) - (s.factor - 1);
    base = spec.theta * ratio.pow(static_cast<double>(dim) / static_cast<double>(dim - 2));
  }
  if (s.rope_type == "longrope") {
    // 1 / (ext * base^(2i / dim)) in fp32, the factor set picked by the length.
    const bool long_set = seq_len > s.original_max_position_embeddings.value_or(spec.max_position_embeddings);
    at::Tensor ext = at::tensor(long_set ? s.long_factor : s.short_factor, at::kDouble).to(at::kFloat);
    at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
    return (ext * at::pow(base, exponents)).reciprocal();
  }
  if (s.rope_type == "yarn") return yarn_inv_freq(base, spec);
  at::Tensor inv_freq = default_inv_freq(base, dim);
  if (s.rope_type == "linear") return inv_freq / s.factor;
  if (s.rope_type == "llama3") return llama3_inv_freq(inv_freq, spec);
  return inv_freq;
}

double rope_attention_scaling(const RopeSpec& spec) {
  const RopeScaling& s = spec.scaling;
  if (s.rope_type == "yarn") {
    if (s.attention_factor) return *s.attention_factor;
    // transformers treats an mscale of 0 as unset.
    if (s.mscale.value_or(0.0) != 0.0 && s.mscale_all_dim.value_or(0.0) != 0.0) {
      return yarn_mscale(s.factor, *s.mscale) / yarn_mscale(s.factor, *s.mscale_all_dim);
    }
    return yarn_mscale(s.factor, 1.0);
  }
  if (s.rope_type != "longrope") return 1.0;
  if (s.attention_factor) return *s.attention_factor;
  if (s.factor <= 1.0) return 1.0;
  const double original = static_cast<double>(s.original_max_position_embeddings.value_or(spec.max_position_embeddings));
  return std::sqrt(1 + std::log(s.factor) / std::log(original));
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const RopeSpec& spec, int64_t seq_len, const at::TensorOptions& options,
                                               std::optional<int64_t> rows) {
  at::Tensor inv_freq = rope_inv_freq(spec, seq_len).to(options.device());
  at::Tensor positions = at::arange(rows.value_or(seq_len), options.dtype(at::kLong)).to(at::kFloat);
  at::Tensor freqs = positions.unsqueeze(1) * inv_freq.unsqueeze(0);  // (T, D/2)
  at::Tensor angles = at::cat({freqs, freqs}, -1);                   // (T, D)
  at::Tensor cos = angles.cos(), sin = angles.sin();
  if (spec.scaling.rope_type == "longrope" || spec.scaling.rope_type == "yarn") {
    // Scaled in fp32 before the cast, as HF.
    const double scaling = rope_attention_scaling(spec);
    cos = cos * scaling;
    sin = sin * scaling;
  }
  return {cos.to(options.dtype()), sin.to(options.dtype())};
}

const std::pair<at::Tensor, at::Tensor>& RopeCache::ensure(const at::Tensor& like, int64_t position_limit,
                                                          int64_t seq_len) const {
  // longrope keeps its two factor sets in two tables; every other type one.
  const RopeScaling& s = spec_.scaling;
  const int64_t original = s.original_max_position_embeddings.value_or(spec_.max_position_embeddings);
  const bool long_set = s.rope_type == "longrope" && seq_len > original;
  auto& [cos, sin] = tables_[long_set ? 1 : 0];
  const bool reusable = cos.defined() && cos.device() == like.device() && cos.scalar_type() == like.scalar_type() &&
                        cos.size(0) >= position_limit;
  if (reusable) return tables_[long_set ? 1 : 0];
  int64_t rows = std::max<int64_t>(cos.defined() ? cos.size(0) : 0, 256);
  while (rows < position_limit) rows *= 2;
  if (s.rope_type == "dynamic") rows = std::min(rows, std::max(position_limit, spec_.max_position_embeddings));
  // The frequencies of the set this table holds, whatever its length.
  const int64_t frequencies_for = s.rope_type == "longrope" ? (long_set ? original + 1 : original) : rows;
  std::tie(cos, sin) = rope_cos_sin(spec_, frequencies_for, like.options(), rows);
  return tables_[long_set ? 1 : 0];
}

std::pair<at::Tensor, at::Tensor> RopeCache::first(const at::Tensor& like, int64_t seq_len) const {
  if (spec_.scaling.rope_type == "dynamic" && seq_len > spec_.max_position_embeddings) {
    return rope_cos_sin(spec_, seq_len, like.options());
  }
  const auto& [cos, sin] = ensure(like, seq_len, seq_len);
  return {cos.narrow(0, 0, seq_len), sin.narrow(0, 0, seq_len)};
}

std::pair<at::Tensor, at::Tensor> RopeCache::at(const at::Tensor& like, const at::Tensor& positions,
                                               int64_t position_limit) const {
  if (spec_.scaling.rope_type == "dynamic" && position_limit > spec_.max_position_embeddings) {
    auto [cos, sin] = rope_cos_sin(spec_, position_limit, like.options());
    return {rope_rows(cos, positions), rope_rows(sin, positions)};
  }
  const auto& [cos, sin] = ensure(like, position_limit, position_limit);
  return {rope_rows(cos, positions), rope_rows(sin, positions)};
}

at::Tensor rope_rows(const at::Tensor& table, const at::Tensor& positions) {
  if (positions.dim() == 1) return table.index_select(0, positions);
  std::vector<int64_t> sizes = positions.sizes().vec();
  sizes.push_back(table.size(1));
  return table.index_select(0, positions.reshape(-1)).view(sizes);
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  if (const int64_t rotary = cos.size(-1); rotary < x.size(-1)) {  // partial RoPE: the rest passes through
    return at::cat({apply_rope(x.narrow(-1, 0, rotary), cos, sin), x.narrow(-1, rotary, x.size(-1) - rotary)}, -1);
  }
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor apply_rope_signed(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& signed_sin) {
  if (const int64_t rotary = cos.size(-1); rotary < x.size(-1)) {
    return at::cat({apply_rope_signed(x.narrow(-1, 0, rotary), cos, signed_sin), x.narrow(-1, rotary, x.size(-1) - rotary)},
                   -1);
  }
  return at::addcmul(x * cos, at::roll(x, {x.size(-1) / 2}, {-1}), signed_sin);
}

at::Tensor signed_rope_sin(const at::Tensor& sin) {
  const int64_t half = sin.size(-1) / 2;
  return at::cat({-sin.narrow(-1, 0, half), sin.narrow(-1, half, half)}, -1);
}

}  // namespace colossus::models
