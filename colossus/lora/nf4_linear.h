// Nf4Linear: a frozen nn.Linear whose weight is stored in NF4 (nf4.h), the
// base layers of QLoRA (about 0.52 bytes a parameter at rest). On CUDA the
// forward runs nf4_matmul.h's kernels (fused dequantise-and-multiply for
// small batches); elsewhere it dequantises the weight to the input's dtype
// with ATen and runs the matmul (the reference path). quantize_base_nf4
// swaps a model's linear layers for them.
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
  // Differentiable in x (and a trainable bias); the weight stays frozen.
  at::Tensor forward(const at::Tensor& x) override;
  // (out, in) in `dtype` on the storage's device.
  at::Tensor dequantized_weight(c10::ScalarType dtype) const;
  const Nf4Tensor& weight() const { return weight_; }
  at::Tensor bias;  // (out) or undefined
  int64_t in_features() const { return weight_.shape[1]; }
  int64_t out_features() const { return weight_.shape[0]; }

 private:
  Nf4Tensor weight_;
  at::Tensor lookup_tables_;  // nf4_lookup_tables() on weight_'s device, once the kernels run
};

// Replaces every Linear of `model` but the LM head (and MoE experts and
// routers) by an Nf4Linear holding its weight in NF4: QLoRA's frozen base.
// Returns how many were quantised. ConfigError for a model with GPT-2's
// Conv1D layers (not supported) or none to quantise.
int64_t quantize_base_nf4(models::CausalLM& model, int64_t blocksize = 64, bool double_quant = true);

}  // namespace colossus::lora
