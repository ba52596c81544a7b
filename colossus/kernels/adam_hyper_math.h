// make_adam_hyper's arithmetic as one inline function that host and device
// code both compile, so the graph-capturable CUDA step (which folds lr and the
// step count on the device) performs the same double operations as the host.
#pragma once
#include "colossus/kernels/adam.h"

#include <math.h>

#if defined(__CUDACC__)
#define COLOSSUS_HOST_DEVICE __host__ __device__
#else
#define COLOSSUS_HOST_DEVICE
#endif

namespace colossus::kernels {

COLOSSUS_HOST_DEVICE inline AdamHyper fold_adam_hyper(double lr, const AdamGroupConstants& c, int64_t step) {
  AdamHyper h;
  h.beta1 = static_cast<float>(c.beta1);
  h.beta2 = static_cast<float>(c.beta2);
  // torch passes these as (double) Python scalars that ATen rounds to float.
  h.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  h.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  h.eps = static_cast<float>(c.eps);
  h.weight_decay = static_cast<float>(c.weight_decay);
  h.decay_factor = static_cast<float>(1.0 - lr * c.weight_decay);
  h.decoupled = c.decoupled;
  if (c.bias_correction) {
    const double s = static_cast<double>(step);
    h.step_size = static_cast<float>(lr / (1.0 - pow(c.beta1, s)));
    h.bias_correction2_sqrt = static_cast<float>(pow(1.0 - pow(c.beta2, s), 0.5));
  } else {
    h.step_size = static_cast<float>(lr);
    h.bias_correction2_sqrt = 1.0f;
  }
  return h;
}

}  // namespace colossus::kernels
