// Unscaling gradients after a scaled backward, fused with the inf/NaN check
// that decides whether the step is skipped.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

namespace colossus::amp {

// Multiplies every defined tensor by `inv_scale` in place and returns whether
// any value was inf/NaN before. fp32 contiguous tensors use the fused kernels
// (colossus/kernels/scale.h: CPU, and CUDA in CUDA builds, one device sync per
// device); any other tensor goes through ATen. Undefined tensors are skipped.
bool unscale_and_check_finite(const std::vector<at::Tensor>& tensors, double inv_scale);

}  // namespace colossus::amp
