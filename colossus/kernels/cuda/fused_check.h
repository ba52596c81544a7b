// Helpers for the fused layer kernels' wrappers and `colossus check`
// self-tests (register_norm.cpp, register_rope.cpp, register_swiglu.cpp).
#pragma once
#include "colossus/kernels/element_dtype.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace colossus::kernels::fused_check {

inline ElementDtype element_dtype(at::ScalarType t) {
  return t == at::kFloat ? ElementDtype::kFloat32 : t == at::kHalf ? ElementDtype::kFloat16 : ElementDtype::kBFloat16;
}

inline void* stream_of(int device_index) { return at::cuda::getCurrentCUDAStream(device_index).stream(); }

// ||out - ref|| / ||ref|| in fp64 on the CPU; NaN when out holds a NaN (so
// `!(err <= bound)` fails it).
inline double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  const at::Tensor r = ref.detach().cpu().to(at::kDouble);
  return (out.detach().cpu().to(at::kDouble) - r).norm().item<double>() / std::max(r.norm().item<double>(), 1e-30);
}

// fp32 ~1e-5 (a few roundings of fp32 sums); bf16/fp16 1e-2 (inputs and
// outputs rounded to 8 or 11 bits).
inline double bound_for(at::ScalarType t) { return t == at::kFloat ? 1e-5 : 1e-2; }

// A CUDA tensor full of NaN: what a kernel that writes nothing leaves.
inline at::Tensor poisoned(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::full(sizes, NAN, options);
}

}  // namespace colossus::kernels::fused_check
