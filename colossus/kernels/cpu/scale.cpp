#include "colossus/kernels/scale.h"

#include <cmath>

namespace colossus::kernels {

bool scale_and_check_finite_cpu(float* data, int64_t n, float scale) {
  bool nonfinite = false;
#pragma omp simd reduction(| : nonfinite)
  for (int64_t i = 0; i < n; ++i) {
    nonfinite |= !std::isfinite(data[i]);
    data[i] *= scale;
  }
  return nonfinite;
}

}  // namespace colossus::kernels
