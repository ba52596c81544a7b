// CUDA row kernel of the fused LM head + cross-entropy (cross_entropy.h); no
// torch headers here by design. One block per row: pass 1 keeps a running
// (max, sum of exp) per thread over 16-byte vectors and merges them across the
// block, pass 2 rereads the row (mostly from L2) and writes the gradient in
// place. 6 bytes of traffic per bf16 logit, against ~36 for the unfused
// upcast + log_softmax + nll + their backwards.
#include "colossus/kernels/cross_entropy.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "colossus/kernels/cuda/fused_common.cuh"

namespace colossus::kernels {

namespace {

constexpr int kThreads = 512;

using fused::from_float;
using fused::to_float;

// (max, sum of exp(x - max)) of two parts; an empty part has max -inf.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  const float a = m == -INFINITY ? 0.f : s * __expf(m - top);
  const float b = m2 == -INFINITY ? 0.f : s2 * __expf(m2 - top);
  m = top;
  s = a + b;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_rows_kernel(T* logits, int64_t ld, int64_t vocab, const int64_t* targets, int64_t ignore_index,
                              float grad_scale, bool write_grad, float* row_loss) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  T* x = logits + row * ld;
  const int64_t target = targets[row];
  const bool ignored = target == ignore_index;
  const bool in_range = target >= 0 && target < vocab;
  // Read before pass 2 overwrites the row (the block barrier below orders it).
  const float x_target = (threadIdx.x == 0 && in_range) ? to_float(x[target]) : 0.f;

  float m = -INFINITY, s = 0.f;
  for (int64_t base = static_cast<int64_t>(threadIdx.x) * kVec; base < vocab; base += kThreads * kVec) {
    uint4 raw = *reinterpret_cast<const uint4*>(x + base);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (base + j < vocab) {
        const float f = to_float(v[j]);
        if (f > m) {
          s = (m == -INFINITY ? 0.f : s * __expf(m - f)) + 1.f;
          m = f;
        } else if (f != -INFINITY) {
          s += __expf(f - m);  // NaN stays NaN: a NaN logit makes a NaN loss
        }
      }
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    merge(m, s, m2, s2);
  }
  __shared__ float warp_m[kThreads / 32], warp_s[kThreads / 32];
  __shared__ float row_lse;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kThreads / 32 ? warp_m[lane] : -INFINITY;
    s = lane < kThreads / 32 ? warp_s[lane] : 0.f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
      merge(m, s, m2, s2);
    }
    if (lane == 0) {
      row_lse = m + logf(s);
      // A target outside [0, vocab) that is not ignore_index: NaN, never a plausible loss.
      row_loss[row] = ignored ? 0.f : (in_range ? row_lse - x_target : __int_as_float(0x7fc00000));
    }
  }
  __syncthreads();
  if (!write_grad) return;
  const float lse = row_lse;
  for (int64_t base = static_cast<int64_t>(threadIdx.x) * kVec; base < ld; base += kThreads * kVec) {
    uint4 raw = *reinterpret_cast<const uint4*>(x + base);
    T* v = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t c = base + j;
      float g = 0.f;
      if (!ignored && c < vocab) g = (__expf(to_float(v[j]) - lse) - (c == target ? 1.f : 0.f)) * grad_scale;
      v[j] = from_float<T>(g);
    }
    *reinterpret_cast<uint4*>(x + base) = raw;
  }
}

template <typename T>
void launch(const CrossEntropyRowsArgs& a, cudaStream_t stream) {
  cross_entropy_rows_kernel<T><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(
      static_cast<T*>(a.logits), a.ld, a.vocab, a.targets, a.ignore_index, a.grad_scale, a.write_grad, a.row_loss);
}

}  // namespace

bool cross_entropy_rows_cuda(const CrossEntropyRowsArgs& a, void* stream) {
  const int64_t element = a.dtype == LogitsDtype::kFloat32 ? 4 : 2;
  const int64_t vec = 16 / element;
  if (a.ld % vec != 0 || reinterpret_cast<uintptr_t>(a.logits) % 16 != 0 || a.vocab > a.ld || a.vocab < 1) return false;
  if (a.rows == 0) return true;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case LogitsDtype::kFloat32: launch<float>(a, s); break;
    case LogitsDtype::kFloat16: launch<__half>(a, s); break;
    case LogitsDtype::kBFloat16: launch<__nv_bfloat16>(a, s); break;
  }
  return true;
}

}  // namespace colossus::kernels
