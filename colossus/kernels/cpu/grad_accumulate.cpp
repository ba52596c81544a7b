// kernels/grad_accumulate.h: a memory-bound pass (6 or 10 bytes an element),
// vectorised by the compiler; the finiteness test rides along on the bits.
#include "colossus/kernels/grad_accumulate.h"

#include <atomic>
#include <bit>
#include <cstdint>

#include "colossus/kernels/cpu/thread_split.h"

namespace colossus::kernels {

namespace {

struct AccumulatePtrs {
  float* acc;
  const uint16_t* grad;
  int64_t numel;
};

// Exponent all ones: inf or NaN.
constexpr uint32_t kExponent = 0x7F800000u;

template <bool kFirst>
uint32_t accumulate_range(const AccumulatePtrs& t, int64_t begin, int64_t end) {
  float* __restrict acc = t.acc;
  const uint16_t* __restrict grad = t.grad;
  uint32_t non_finite = 0;
#pragma omp simd reduction(| : non_finite)
  for (int64_t i = begin; i < end; ++i) {
    const float g = std::bit_cast<float>(static_cast<uint32_t>(grad[i]) << 16);
    const float sum = kFirst ? g : acc[i] + g;
    acc[i] = sum;
    non_finite |= static_cast<uint32_t>((std::bit_cast<uint32_t>(sum) & kExponent) == kExponent);
  }
  return non_finite;
}

}  // namespace

bool accumulate_bf16_cpu(float* acc, const void* grad_bf16, int64_t numel, bool first, int num_threads) {
  const AccumulatePtrs table{acc, static_cast<const uint16_t*>(grad_bf16), numel};
  std::atomic<bool> finite{true};
  detail::split_over_threads(&table, 1, num_threads, [&](const AccumulatePtrs& t, int64_t lo, int64_t hi) {
    const uint32_t bad = first ? accumulate_range<true>(t, lo, hi) : accumulate_range<false>(t, lo, hi);
    if (bad != 0) finite.store(false, std::memory_order_relaxed);
  });
  return finite.load();
}

}  // namespace colossus::kernels
