// y = x @ W^T + b with W held in NF4 (nf4.h), as one autograd function: on
// CUDA (when the build has the kernels, kernels/nf4.h) small batches run the
// fused dequantise-and-multiply kernel and larger ones dequantise into a
// temporary for the GEMM; elsewhere it dequantises with ATen (the reference).
// The backward dequantises again rather than keeping W alive from the
// forward: QLoRA's memory saving.
#pragma once
#include "colossus/kernels/nf4.h"
#include "colossus/lora/nf4.h"

#include <ATen/core/Tensor.h>

namespace colossus::lora {

// Whether nf4_linear runs the CUDA kernels for this input: x on CUDA in
// fp32 / fp16 / bf16 and the kernels compiled in.
bool nf4_kernels_take(const at::Tensor& x);

// x (..., in) -> (..., out) in x's dtype, differentiable in x and bias (W is
// frozen). weight: (out, in) on x's device; bias: (out) in x's dtype or
// undefined; tables: nf4_lookup_tables(x.device()), kept by the caller (made
// here when undefined). Rows of x up to kernels::kNf4GemvMaxRows take the
// fused kernel.
at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& weight, const at::Tensor& tables, const at::Tensor& bias);

// The kernels' view of `weight` as (shape[0], numel / shape[0]): device
// pointers into its tensors and into `tables`, which must outlive the
// returned struct.
kernels::Nf4WeightPtrs nf4_weight_ptrs(const Nf4Tensor& weight, const at::Tensor& tables);

// `weight.shape` in `dtype` by the CUDA dequantisation kernel, bit-identical
// to dequantize_nf4. Needs nf4_kernels_take on a tensor of the weight's
// device and dtype.
at::Tensor dequantize_nf4_fused(const Nf4Tensor& weight, const at::Tensor& tables, c10::ScalarType dtype);

}  // namespace colossus::lora
