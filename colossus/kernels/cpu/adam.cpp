// CPU Adam: host-side constants, ISA choice at run time, and the split of a
// multi-tensor step over threads by element count.
#include "colossus/core/errors.h"
#include "colossus/kernels/adam.h"
#include "colossus/kernels/adam_hyper_math.h"
#include "colossus/kernels/cpu/adam_simd.h"
#include "colossus/kernels/cpu/thread_split.h"

#include <fmt/format.h>

#include <cmath>

namespace colossus::kernels {

AdamHyper make_adam_hyper(double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                          bool bias_correction, int64_t step) {
  return fold_adam_hyper(lr,
                         AdamGroupConstants{.beta1 = beta1,
                                            .beta2 = beta2,
                                            .eps = eps,
                                            .weight_decay = weight_decay,
                                            .decoupled = decoupled,
                                            .bias_correction = bias_correction},
                         step);
}

void adam_step_reference(const AdamTensorPtrs& t, const AdamHyper& h) {
  detail::adam_range_scalar(t, 0, t.numel, h);
}

bool cpu_supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return true;
    // libgcc checks both cpuid and that the OS saves the wider registers (xgetbv).
    case CpuIsa::kAvx2: return __builtin_cpu_supports("avx2");
    case CpuIsa::kAvx512: return __builtin_cpu_supports("avx512f");
  }
  return false;
}

CpuIsa best_cpu_isa() {
  static const CpuIsa best = [] {
    if (cpu_supports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
    if (cpu_supports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
    return CpuIsa::kScalar;
  }();
  return best;
}

std::string isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

namespace {

using RangeFn = void (*)(const AdamTensorPtrs&, int64_t, int64_t, const AdamHyper&);

RangeFn range_fn(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return detail::adam_range_avx512;
    case CpuIsa::kAvx2: return detail::adam_range_avx2;
    default: return detail::adam_range_scalar;
  }
}

}  // namespace

void adam_step_cpu(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& h, int num_threads) {
  adam_step_cpu(tensors, count, h, num_threads, best_cpu_isa());
}

void detail::check_cpu_adam_call(CpuIsa isa, int num_threads) {
  if (!cpu_supports(isa)) {
    throw ConfigError(fmt::format("CPU Adam: ISA '{}' is not supported by this CPU; use '{}'", isa_name(isa),
                                  isa_name(best_cpu_isa())));
  }
  if (num_threads < 0) throw ConfigError(fmt::format("CPU Adam: num_threads={} is negative; use 0 (all cores)", num_threads));
}

void adam_step_cpu(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& h, int num_threads, CpuIsa isa) {
  detail::check_cpu_adam_call(isa, num_threads);
  const RangeFn fn = range_fn(isa);
  detail::split_over_threads(tensors, count, num_threads,
                             [fn, &h](const AdamTensorPtrs& t, int64_t lo, int64_t hi) { fn(t, lo, hi, h); });
}

}  // namespace colossus::kernels
