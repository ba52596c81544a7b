// Rotary position embeddings (RoPE) as Hugging Face computes them, including
// the rope_scaling variants linear, dynamic (NTK), llama3, longrope and yarn. Frequencies are
// computed in fp32 with the same operations as transformers, so cos/sin agree
// with HF to the last bit on CPU.
#pragma once
#include "colossus/models/config.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace colossus::models {

struct RopeSpec {
  int64_t head_dim = 0;
  double theta = 10000.0;
  RopeScaling scaling;
  int64_t max_position_embeddings = 0;
};

RopeSpec rope_spec(const LlamaConfig& config);

// Inverse frequencies for a sequence of seq_len tokens: (head_dim / 2) fp32 on CPU.
// "dynamic" raises the base once seq_len exceeds max_position_embeddings
// (HF caches the grown frequencies across calls; this is stateless, so it
// equals HF on each call's own length); "longrope" takes long_factor once
// seq_len exceeds original_max_position_embeddings, as HF picks by the
// largest position + 1 (and its generate() recomputes the whole sequence
// when it crosses that length).
at::Tensor rope_inv_freq(const RopeSpec& spec, int64_t seq_len);

// The factor cos and sin are multiplied by: longrope's or yarn's attention factor, else 1.
double rope_attention_scaling(const RopeSpec& spec);
// YaRN's mscale(factor, m) = 0.1 m ln(factor) + 1 for factor > 1, else 1.
double yarn_mscale(double factor, double mscale);

// cos, sin: (rows, head_dim) for positions 0..rows-1 with the frequencies of a
// sequence of seq_len tokens (rows: seq_len when unset), cast to options' dtype/device.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const RopeSpec& spec, int64_t seq_len, const at::TensorOptions& options,
                                               std::optional<int64_t> rows = std::nullopt);

// One RoPE's cos/sin rows, cached on one device and dtype and grown by
// doubling. Rows do not depend on the table's length (except dynamic NTK past
// max_position_embeddings, computed fresh, and longrope's two factor sets,
// each its own table), so a step only takes its rows: no host-to-device copy,
// which also lets CUDA graphs capture it.
class RopeCache {
 public:
  explicit RopeCache(RopeSpec spec) : spec_(std::move(spec)) {}
  // (cos, sin) for positions 0..seq_len-1 in like's dtype and device.
  std::pair<at::Tensor, at::Tensor> first(const at::Tensor& like, int64_t seq_len) const;
  // (cos, sin) at `positions` (T) or (B, T) int64 -> (T, D) or (B, T, D),
  // each < position_limit (dynamic NTK
  // scales by that length and longrope picks its factor set by it, as HF
  // does on a sequence of that length).
  std::pair<at::Tensor, at::Tensor> at(const at::Tensor& like, const at::Tensor& positions, int64_t position_limit) const;

 private:
  // The table for sequences of seq_len tokens, with at least position_limit rows.
  const std::pair<at::Tensor, at::Tensor>& ensure(const at::Tensor& like, int64_t position_limit, int64_t seq_len) const;
  RopeSpec spec_;
  mutable std::pair<at::Tensor, at::Tensor> tables_[2];  // [0]: every RoPE; [1]: longrope's long_factor set
};

// Rows of a (rows, D) cos or sin table at positions (any shape) -> positions' shape + (D).
at::Tensor rope_rows(const at::Tensor& table, const at::Tensor& positions);

// x: (B, H, T, D), cos/sin: (T, R) -> (B, H, T, D); HF's rotate_half convention
// (the two halves of R rotate together, not interleaved pairs). R < D:
// partial RoPE (Phi-3's partial_rotary_factor), the last D - R dims pass.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The same rotation with sin's first half negated beforehand (signed_sin):
// roll, multiply, multiply-add; for inference steps, where launches count.
at::Tensor apply_rope_signed(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& signed_sin);
// sin with its first half negated.
at::Tensor signed_rope_sin(const at::Tensor& sin);

}  // namespace colossus::models
