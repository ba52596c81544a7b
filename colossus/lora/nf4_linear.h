// Nf4Linear: a frozen nn.Linear whose weight is stored in NF4 (nf4.h), the
// base layers of QLoRA; forward dequantises the weight to the input's dtype
// and runs the matmul (the reference path; the weight is about 0.52 bytes a
// parameter at rest). quantize_base_nf4 swaps a model's linear layers for
// them.
#pragma once
#include "colossus/lora/nf4.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/layers.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace colossus::lora {

class Nf4Linear : public models::Layer {
 public:
  // base's weight (out, in) quantised; its bias (if any) kept as a frozen
  // parameter "bias" in its dtype.
  explicit Nf4Linear(const models::Linear& base, int64_t blocksize = 64, bool double_quant = true);
  // x: (..., in) -> (..., out) in x's dtype. The NF4 storage follows x to its
  // device on first use (plugins move parameters, and this weight is none).
  at::Tensor forward(const at::Tensor& x) override;
  // (out, in) in `dtype` on the storage's device.
  at::Tensor dequantized_weight(c10::ScalarType dtype) const;
  const Nf4Tensor& weight() const { return weight_; }
  at::Tensor bias;  // (out) or undefined
  int64_t in_features() const { return weight_.shape[1]; }
  int64_t out_features() const { return weight_.shape[0]; }

 private:
  Nf4Tensor weight_;
};

// Replaces every Linear of `model` but the LM head (and MoE experts and
// routers) by an Nf4Linear holding its weight in NF4: QLoRA's frozen base.
// Returns how many were quantised. ConfigError for a model with GPT-2's
// Conv1D layers (not supported) or none to quantise.
int64_t quantize_base_nf4(models::CausalLM& model, int64_t blocksize = 64, bool double_quant = true);

}  // namespace colossus::lora
