// The CPU mixed-precision Adam step (adam.h: adam_step_mixed_cpu): bf16 (or
// fp32) gradient in, fp32 master and moments updated, bf16 parameter out. One scalar
// body, inlined into a baseline, an AVX2 and an AVX-512 function so the
// compiler vectorises it for each ISA; the float operations are the
// reference's in the reference's order (no FMA contraction: this file is
// built with -ffp-contract=off), so every ISA gives the same bits.
#include "colossus/kernels/adam.h"
#include "colossus/kernels/cpu/adam_simd.h"
#include "colossus/kernels/cpu/thread_split.h"

#include <bit>
#include <cmath>
#include <cstdint>

namespace colossus::kernels {

namespace {

enum Mode { kNoDecay = 0, kL2 = 1, kDecoupled = 2 };

inline float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// Round to nearest even, NaN to the canonical quiet NaN (c10::BFloat16's rule).
inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return std::isnan(value) ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// The gradient as float: widened from bf16, or read as it is.
inline float grad_at(const AdamMixedPtrs& t, int64_t i) {
  return bf16_to_float(static_cast<const uint16_t*>(t.grad_bf16)[i]);
}
inline float grad_at(const AdamMixedFp32GradPtrs& t, int64_t i) { return t.grad[i]; }

template <int kMode, typename Ptrs>
__attribute__((always_inline)) inline void mixed_body(const Ptrs& t, int64_t begin, int64_t end, const AdamHyper& h,
                                                     float grad_scale) {
  float* __restrict param = t.param;
  float* __restrict exp_avg = t.exp_avg;
  float* __restrict exp_avg_sq = t.exp_avg_sq;
  // The bf16 gradient and param_bf16 may alias (read, then written, per
  // element): no __restrict.
  uint16_t* low = static_cast<uint16_t*>(t.param_bf16);
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float p = param[i];
    float g = grad_at(t, i) * grad_scale;
    if constexpr (kMode == kL2) g = g + h.weight_decay * p;
    if constexpr (kMode == kDecoupled) p = p * h.decay_factor;
    float m = h.beta1 * exp_avg[i] + h.one_minus_beta1 * g;
    float v = h.beta2 * exp_avg_sq[i] + h.one_minus_beta2 * (g * g);
    float denom = std::sqrt(v) / h.bias_correction2_sqrt + h.eps;
    p = p - h.step_size * (m / denom);
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    low[i] = float_to_bf16(p);
  }
}

int mode_of(const AdamHyper& h) {
  if (h.weight_decay == 0.0f) return kNoDecay;
  return h.decoupled ? kDecoupled : kL2;
}

template <typename Ptrs>
using RangeFn = void (*)(const Ptrs&, int64_t, int64_t, const AdamHyper&, float);

template <typename Ptrs>
void range_scalar(const Ptrs& t, int64_t begin, int64_t end, const AdamHyper& h, float s) {
  switch (mode_of(h)) {
    case kL2: return mixed_body<kL2>(t, begin, end, h, s);
    case kDecoupled: return mixed_body<kDecoupled>(t, begin, end, h, s);
    default: return mixed_body<kNoDecay>(t, begin, end, h, s);
  }
}

template <typename Ptrs>
__attribute__((target("avx2"))) void range_avx2(const Ptrs& t, int64_t begin, int64_t end, const AdamHyper& h,
                                                float s) {
  switch (mode_of(h)) {
    case kL2: return mixed_body<kL2>(t, begin, end, h, s);
    case kDecoupled: return mixed_body<kDecoupled>(t, begin, end, h, s);
    default: return mixed_body<kNoDecay>(t, begin, end, h, s);
  }
}

template <typename Ptrs>
__attribute__((target("avx512f,avx512bw"))) void range_avx512(const Ptrs& t, int64_t begin, int64_t end,
                                                              const AdamHyper& h, float s) {
  switch (mode_of(h)) {
    case kL2: return mixed_body<kL2>(t, begin, end, h, s);
    case kDecoupled: return mixed_body<kDecoupled>(t, begin, end, h, s);
    default: return mixed_body<kNoDecay>(t, begin, end, h, s);
  }
}

template <typename Ptrs>
RangeFn<Ptrs> range_fn(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return range_avx512<Ptrs>;
    case CpuIsa::kAvx2: return range_avx2<Ptrs>;
    default: return range_scalar<Ptrs>;
  }
}

template <typename Ptrs>
void step_threaded(const Ptrs* tensors, int64_t count, const AdamHyper& h, float grad_scale, int num_threads,
                   CpuIsa isa) {
  detail::check_cpu_adam_call(isa, num_threads);
  const RangeFn<Ptrs> fn = range_fn<Ptrs>(isa);
  auto range = [fn, &h, grad_scale](const Ptrs& t, int64_t lo, int64_t hi) { fn(t, lo, hi, h, grad_scale); };
  detail::split_over_threads(tensors, count, num_threads, range);
}

}  // namespace

void adam_step_mixed_reference(const AdamMixedPtrs& t, const AdamHyper& h, float grad_scale) {
  range_scalar(t, 0, t.numel, h, grad_scale);
}

void adam_step_mixed_reference(const AdamMixedFp32GradPtrs& t, const AdamHyper& h, float grad_scale) {
  range_scalar(t, 0, t.numel, h, grad_scale);
}

void adam_step_mixed_cpu(const AdamMixedPtrs* tensors, int64_t count, const AdamHyper& h, float grad_scale,
                         int num_threads, CpuIsa isa) {
  step_threaded(tensors, count, h, grad_scale, num_threads, isa);
}

void adam_step_mixed_cpu(const AdamMixedFp32GradPtrs* tensors, int64_t count, const AdamHyper& h, float grad_scale,
                         int num_threads, CpuIsa isa) {
  step_threaded(tensors, count, h, grad_scale, num_threads, isa);
}

}  // namespace colossus::kernels
