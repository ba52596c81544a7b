// Scalar, AVX2 and AVX-512 bodies of the fused CPU Adam step. Each performs
// the same float operations in the same order as the scalar reference (no FMA,
// IEEE sqrt and division), so all three agree bit for bit; the SIMD ones are
// compiled for their ISA through target attributes and chosen at run time.
#include "colossus/kernels/cpu/adam_simd.h"

#include <immintrin.h>

#include <cmath>

namespace colossus::kernels::detail {

namespace {

// How weight decay enters: not at all, as L2 on the grad (Adam), or as a
// multiplicative decay of the param (AdamW). Fixed per call, so a template.
enum Mode { kNoDecay = 0, kL2 = 1, kDecoupled = 2 };

template <int kMode>
void scalar_body(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h) {
  float* __restrict param = t.param;
  const float* __restrict grad = t.grad;
  float* __restrict exp_avg = t.exp_avg;
  float* __restrict exp_avg_sq = t.exp_avg_sq;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float p = param[i];
    float g = grad[i];
    if constexpr (kMode == kL2) g = g + h.weight_decay * p;
    if constexpr (kMode == kDecoupled) p = p * h.decay_factor;
    float m = h.beta1 * exp_avg[i] + h.one_minus_beta1 * g;
    float v = h.beta2 * exp_avg_sq[i] + h.one_minus_beta2 * (g * g);
    float denom = std::sqrt(v) / h.bias_correction2_sqrt + h.eps;
    param[i] = p - h.step_size * (m / denom);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

template <int kMode>
__attribute__((target("avx2"))) void avx2_body(const AdamTensorPtrs& t, int64_t begin, int64_t end,
                                               const AdamHyper& h) {
  const __m256 beta1 = _mm256_set1_ps(h.beta1), beta2 = _mm256_set1_ps(h.beta2);
  const __m256 omb1 = _mm256_set1_ps(h.one_minus_beta1), omb2 = _mm256_set1_ps(h.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(h.eps), wd = _mm256_set1_ps(h.weight_decay);
  const __m256 decay = _mm256_set1_ps(h.decay_factor), step = _mm256_set1_ps(h.step_size);
  const __m256 bc2 = _mm256_set1_ps(h.bias_correction2_sqrt);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 p = _mm256_loadu_ps(t.param + i);
    __m256 g = _mm256_loadu_ps(t.grad + i);
    if constexpr (kMode == kL2) g = _mm256_add_ps(g, _mm256_mul_ps(wd, p));
    if constexpr (kMode == kDecoupled) p = _mm256_mul_ps(p, decay);
    __m256 m = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(t.exp_avg + i)), _mm256_mul_ps(omb1, g));
    __m256 v = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(t.exp_avg_sq + i)),
                             _mm256_mul_ps(omb2, _mm256_mul_ps(g, g)));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2), eps);
    p = _mm256_sub_ps(p, _mm256_mul_ps(step, _mm256_div_ps(m, denom)));
    _mm256_storeu_ps(t.param + i, p);
    _mm256_storeu_ps(t.exp_avg + i, m);
    _mm256_storeu_ps(t.exp_avg_sq + i, v);
  }
  scalar_body<kMode>(t, i, end, h);
}

struct Avx512Consts {
  __m512 beta1, beta2, omb1, omb2, eps, wd, decay, step, bc2;
};

// 16 elements at i; kMasked: only the lanes in k (the tail). The main loop
// stays unmasked: masked loads/stores on every iteration measured 2x slower
// on AMD EPYC (Zen) here.
template <int kMode, bool kMasked>
__attribute__((target("avx512f"))) inline void avx512_16(const AdamTensorPtrs& t, int64_t i, __mmask16 k,
                                                        const Avx512Consts& c) {
  auto load = [k](const float* ptr) __attribute__((target("avx512f"))) {
    return kMasked ? _mm512_maskz_loadu_ps(k, ptr) : _mm512_loadu_ps(ptr);
  };
  auto store = [k](float* ptr, __m512 x) __attribute__((target("avx512f"))) {
    if constexpr (kMasked) {
      _mm512_mask_storeu_ps(ptr, k, x);
    } else {
      _mm512_storeu_ps(ptr, x);
    }
  };
  __m512 p = load(t.param + i);
  __m512 g = load(t.grad + i);
  if constexpr (kMode == kL2) g = _mm512_add_ps(g, _mm512_mul_ps(c.wd, p));
  if constexpr (kMode == kDecoupled) p = _mm512_mul_ps(p, c.decay);
  __m512 m = _mm512_add_ps(_mm512_mul_ps(c.beta1, load(t.exp_avg + i)), _mm512_mul_ps(c.omb1, g));
  __m512 v = _mm512_add_ps(_mm512_mul_ps(c.beta2, load(t.exp_avg_sq + i)), _mm512_mul_ps(c.omb2, _mm512_mul_ps(g, g)));
  // maskz_sqrt, not sqrt: GCC 12's _mm512_sqrt_ps trips -Wmaybe-uninitialized.
  __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_maskz_sqrt_ps(k, v), c.bc2), c.eps);
  p = _mm512_sub_ps(p, _mm512_mul_ps(c.step, _mm512_div_ps(m, denom)));
  store(t.param + i, p);
  store(t.exp_avg + i, m);
  store(t.exp_avg_sq + i, v);
}

template <int kMode>
__attribute__((target("avx512f"))) void avx512_body(const AdamTensorPtrs& t, int64_t begin, int64_t end,
                                                   const AdamHyper& h) {
  const Avx512Consts c{_mm512_set1_ps(h.beta1),        _mm512_set1_ps(h.beta2),
                       _mm512_set1_ps(h.one_minus_beta1), _mm512_set1_ps(h.one_minus_beta2),
                       _mm512_set1_ps(h.eps),          _mm512_set1_ps(h.weight_decay),
                       _mm512_set1_ps(h.decay_factor), _mm512_set1_ps(h.step_size),
                       _mm512_set1_ps(h.bias_correction2_sqrt)};
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) avx512_16<kMode, false>(t, i, static_cast<__mmask16>(0xFFFF), c);
  // A masked final block instead of a scalar tail: the same operations.
  if (i < end) avx512_16<kMode, true>(t, i, static_cast<__mmask16>((1u << (end - i)) - 1u), c);
}

int mode_of(const AdamHyper& h) {
  if (h.weight_decay == 0.0f) return kNoDecay;
  return h.decoupled ? kDecoupled : kL2;
}

}  // namespace

void adam_range_scalar(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h) {
  switch (mode_of(h)) {
    case kL2: return scalar_body<kL2>(t, begin, end, h);
    case kDecoupled: return scalar_body<kDecoupled>(t, begin, end, h);
    default: return scalar_body<kNoDecay>(t, begin, end, h);
  }
}

void adam_range_avx2(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h) {
  switch (mode_of(h)) {
    case kL2: return avx2_body<kL2>(t, begin, end, h);
    case kDecoupled: return avx2_body<kDecoupled>(t, begin, end, h);
    default: return avx2_body<kNoDecay>(t, begin, end, h);
  }
}

void adam_range_avx512(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h) {
  switch (mode_of(h)) {
    case kL2: return avx512_body<kL2>(t, begin, end, h);
    case kDecoupled: return avx512_body<kDecoupled>(t, begin, end, h);
    default: return avx512_body<kNoDecay>(t, begin, end, h);
  }
}

}  // namespace colossus::kernels::detail
