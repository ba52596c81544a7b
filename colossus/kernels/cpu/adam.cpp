// CPU Adam: host-side constants, ISA choice at run time, and the split of a
// multi-tensor step over threads by element count.
#include "colossus/core/errors.h"
#include "colossus/kernels/adam.h"
#include "colossus/kernels/adam_hyper_math.h"
#include "colossus/kernels/cpu/adam_simd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

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

// Below this many elements a second thread costs more than it saves
// (thread start is ~20-50 us; a core does ~1M elements per ms).
constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;
// Split points are multiples of this, so threads never share a cache line.
constexpr int64_t kSplitAlign = 1024;

// Runs elements [begin, end) of the concatenation of all tensors.
void run_flat_range(RangeFn fn, const AdamTensorPtrs* tensors, int64_t count, int64_t begin, int64_t end,
                    const AdamHyper& h) {
  int64_t offset = 0;
  for (int64_t i = 0; i < count && offset < end; ++i) {
    const int64_t n = tensors[i].numel;
    const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + n);
    if (lo < hi) fn(tensors[i], lo - offset, hi - offset, h);
    offset += n;
  }
}

}  // namespace

void adam_step_cpu(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& h, int num_threads) {
  adam_step_cpu(tensors, count, h, num_threads, best_cpu_isa());
}

void adam_step_cpu(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& h, int num_threads, CpuIsa isa) {
  if (!cpu_supports(isa)) {
    throw ConfigError(fmt::format("CPU Adam: ISA '{}' is not supported by this CPU; use '{}'", isa_name(isa),
                                  isa_name(best_cpu_isa())));
  }
  if (num_threads < 0) throw ConfigError(fmt::format("CPU Adam: num_threads={} is negative; use 0 (all cores)", num_threads));
  const RangeFn fn = range_fn(isa);
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += tensors[i].numel;
  int64_t threads = num_threads > 0 ? num_threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::max<int64_t>(1, std::min(threads, total / kMinElementsPerThread));
  if (threads == 1) {
    run_flat_range(fn, tensors, count, 0, total, h);
    return;
  }
  int64_t per_thread = (total + threads - 1) / threads;
  per_thread = (per_thread + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(threads - 1));
  for (int64_t k = 1; k < threads; ++k) {
    const int64_t begin = std::min(total, k * per_thread), end = std::min(total, (k + 1) * per_thread);
    if (begin < end) workers.emplace_back(run_flat_range, fn, tensors, count, begin, end, std::cref(h));
  }
  run_flat_range(fn, tensors, count, 0, std::min(total, per_thread), h);
  for (auto& w : workers) w.join();
}

}  // namespace colossus::kernels
