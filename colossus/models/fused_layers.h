// The training step's fused CUDA layers (RMSNorm / LayerNorm with the
// residual add, RoPE on q and k, SwiGLU) as autograd functions over the
// kernels in colossus/kernels/{norm,rope,swiglu}.h, reached through the CUDA
// slots. Each returns std::nullopt when its kernel does not apply (CPU
// tensors, a CPU build, a dtype, shape or layout the kernel does not take);
// the caller then runs its ATen code, which is the reference.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>

namespace colossus::models {

// x: (..., C), residual: same shape or undefined, weight: (C), same dtype.
// Returns {y, s}: s = x + residual rounded to the dtype (x itself without a
// residual), y = rmsnorm(s) * weight with HF's rounding (RMSNorm in layers.h).
std::optional<std::pair<at::Tensor, at::Tensor>> fused_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                                const at::Tensor& weight, double eps);

// The same with y = layernorm(s) * weight + bias; bias (C) or undefined.
std::optional<std::pair<at::Tensor, at::Tensor>> fused_layer_norm(const at::Tensor& x, const at::Tensor& residual,
                                                                  const at::Tensor& weight, const at::Tensor& bias,
                                                                  double eps);

// q: (B, T, Hq, D), k: (B, T, Hk, D), cos/sin: (T, D), one dtype; cos/sin
// contiguous, q and k contiguous or with evenly strided (b, t) rows (views of
// a merged q/k/v projection, read in place) -> {rotated q, rotated k},
// contiguous (apply_rope in rope.h).
std::optional<std::pair<at::Tensor, at::Tensor>> fused_rope(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& cos, const at::Tensor& sin);

// gate, up: same shape and dtype, contiguous -> silu(gate) * up.
std::optional<at::Tensor> fused_swiglu(const at::Tensor& gate, const at::Tensor& up);

// Inference decode (autograd off, a CUDA 16-bit x of 1 or 2 rows, where the
// GEMV beats cuBLAS): x W^T by the GEMV kernel (kernels/gemv.h),
// which streams W once where a GEMM's tiles would sit mostly idle. nullopt
// when it does not apply (or is switched off); the caller runs at::linear.
//   decode_linear:     x (..., K) -> x W^T + bias (bias may be undefined)
//   decode_linear_add: residual + x W^T, written into residual (contiguous)
//   decode_gated:      gate_up_weight (2F, K), gate rows then up rows ->
//                      silu(x Wg^T) * (x Wu^T) (..., F)
std::optional<at::Tensor> decode_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
std::optional<at::Tensor> decode_linear_add(const at::Tensor& x, const at::Tensor& weight, at::Tensor& residual);
std::optional<at::Tensor> decode_gated(const at::Tensor& x, const at::Tensor& gate_up_weight);
// On by default; benchmarks switch it off to measure the GEMM library's path.
void set_decode_gemv(bool enabled);
bool decode_gemv_enabled();

// gate_up (..., 2F), each row's gate then its up as one merged projection
// writes them, contiguous -> silu(gate) * up (..., F). Inference, and
// training (merged_linear.h): the gradient comes back as (..., 2F) in the
// same layout, which the merged projection's backward reads as it is.
std::optional<at::Tensor> fused_swiglu_packed(const at::Tensor& gate_up);

}  // namespace colossus::models
