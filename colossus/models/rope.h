// Rotary position embeddings (RoPE) as Hugging Face computes them, including
// the rope_scaling variants linear, dynamic (NTK) and llama3. Frequencies are
// computed in fp32 with the same operations as transformers, so cos/sin agree
// with HF to the last bit on CPU.
#pragma once
#include "colossus/models/config.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
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
// Only "dynamic" depends on seq_len: it raises the base once seq_len exceeds
// max_position_embeddings. (HF caches the grown frequencies across calls; this
// is stateless, so it equals HF on each call's own length.)
at::Tensor rope_inv_freq(const RopeSpec& spec, int64_t seq_len);

// cos, sin: (T, head_dim) for positions 0..T-1, cast to options' dtype/device.
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const RopeSpec& spec, int64_t seq_len, const at::TensorOptions& options);

// One RoPE's cos/sin rows, cached on one device and dtype and grown by
// doubling. Rows do not depend on the table's length (except dynamic NTK past
// max_position_embeddings, computed fresh), so a step only takes its rows: no
// host-to-device copy, which also lets CUDA graphs capture it.
class RopeCache {
 public:
  explicit RopeCache(RopeSpec spec) : spec_(std::move(spec)) {}
  // (cos, sin) for positions 0..seq_len-1 in like's dtype and device.
  std::pair<at::Tensor, at::Tensor> first(const at::Tensor& like, int64_t seq_len) const;
  // (cos, sin) at `positions` (T) int64, each < position_limit (dynamic NTK
  // scales by that length, as HF does on a sequence of that length).
  std::pair<at::Tensor, at::Tensor> at(const at::Tensor& like, const at::Tensor& positions, int64_t position_limit) const;

 private:
  void ensure(const at::Tensor& like, int64_t position_limit) const;
  RopeSpec spec_;
  mutable at::Tensor cos_, sin_;
};

// x: (B, H, T, D), cos/sin: (T, D) -> (B, H, T, D); HF's rotate_half convention
// (the two halves of D rotate together, not interleaved pairs).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// The same rotation with sin's first half negated beforehand (signed_sin):
// roll, multiply, multiply-add; for inference steps, where launches count.
at::Tensor apply_rope_signed(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& signed_sin);
// sin with its first half negated.
at::Tensor signed_rope_sin(const at::Tensor& sin);

}  // namespace colossus::models
