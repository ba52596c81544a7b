// Multiply a float buffer by a scalar in place and report whether any input
// value was inf or NaN: the unscale step of dynamic loss scaling.
// data: n float32 values. Returns true when a non-finite value was seen.
#pragma once
#include <cstdint>

namespace colossus::kernels {

bool scale_and_check_finite_cpu(float* data, int64_t n, float scale);

#ifdef COLOSSUS_WITH_CUDA
// Same on device memory; `found_nonfinite` is a device int32 set to 1 on
// inf/NaN (never cleared here). Runs on `stream` (a cudaStream_t).
void scale_and_check_finite_cuda(float* data, int64_t n, float scale, int32_t* found_nonfinite, void* stream);
#endif

}  // namespace colossus::kernels
