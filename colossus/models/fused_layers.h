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

// q: (B, T, Hq, D), k: (B, T, Hk, D), cos/sin: (T, D), contiguous, one dtype
// -> {rotated q, rotated k} in the same layout (apply_rope in rope.h).
std::optional<std::pair<at::Tensor, at::Tensor>> fused_rope(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& cos, const at::Tensor& sin);

// gate, up: same shape and dtype, contiguous -> silu(gate) * up.
std::optional<at::Tensor> fused_swiglu(const at::Tensor& gate, const at::Tensor& up);

}  // namespace colossus::models
