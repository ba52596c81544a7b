// Fused RoPE over q and k in their (B, T, H, D) layout (rope.h); no torch
// headers here by design. One 128-thread block per (b, t): the row's cos/sin
// are read once per vector pair (from L1 after the first head), q's and k's
// heads are one index space, so the launch count is one for both tensors,
// forward and backward. 16-byte loads and stores throughout. The input rows
// may be strided (a merged q/k/v projection read in place).
#include "colossus/kernels/cuda/fused_common.cuh"
#include "colossus/kernels/rope.h"

#include <cstdint>

namespace colossus::kernels {

namespace {

using fused::Vec;

constexpr int kThreads = 128;

template <typename T, bool kBackward>
__global__ void __launch_bounds__(kThreads) rope_kernel(RopeArgs a) {
  constexpr int kSize = Vec<T>::kSize;
  const int64_t row = blockIdx.x;  // b * seq + t
  const int64_t t = row % a.seq;
  const int half = static_cast<int>(a.head_dim / 2);
  const int half_vecs = half / kSize;
  const int heads = static_cast<int>(a.q_heads + a.k_heads);
  const T* cos_row = static_cast<const T*>(a.cos) + t * a.head_dim;
  const T* sin_row = static_cast<const T*>(a.sin) + t * a.head_dim;
  for (int j = threadIdx.x; j < heads * half_vecs; j += kThreads) {
    const int head = j / half_vecs;
    const int i = (j % half_vecs) * kSize;
    const T* x;
    T* out;
    if (head < a.q_heads) {
      const int64_t offset = (row * a.q_heads + head) * a.head_dim;
      x = static_cast<const T*>(a.q) + row * a.q_row_stride + head * a.head_dim;
      out = static_cast<T*>(a.q_out) + offset;
    } else {
      const int64_t offset = (row * a.k_heads + (head - a.q_heads)) * a.head_dim;
      x = static_cast<const T*>(a.k) + row * a.k_row_stride + (head - a.q_heads) * a.head_dim;
      out = static_cast<T*>(a.k_out) + offset;
    }
    Vec<T> x1, x2, c1, c2, s1, s2;
    x1.load(x + i);
    x2.load(x + i + half);
    c1.load(cos_row + i);
    c2.load(cos_row + i + half);
    s1.load(sin_row + i);
    s2.load(sin_row + i + half);
    Vec<T> y1, y2;
#pragma unroll
    for (int e = 0; e < kSize; ++e) {
      if constexpr (kBackward) {
        y1.v[e] = x1.v[e] * c1.v[e] + x2.v[e] * s2.v[e];
        y2.v[e] = x2.v[e] * c2.v[e] - x1.v[e] * s1.v[e];
      } else {
        y1.v[e] = x1.v[e] * c1.v[e] - x2.v[e] * s1.v[e];
        y2.v[e] = x2.v[e] * c2.v[e] + x1.v[e] * s2.v[e];
      }
    }
    y1.store(out + i);
    y2.store(out + i + half);
  }
}

template <typename T>
void launch(RopeArgs a, cudaStream_t stream) {
  if (a.q_row_stride == 0) a.q_row_stride = a.q_heads * a.head_dim;
  if (a.k_row_stride == 0) a.k_row_stride = a.k_heads * a.head_dim;
  const dim3 grid(static_cast<unsigned>(a.batch * a.seq));
  if (a.backward) {
    rope_kernel<T, true><<<grid, kThreads, 0, stream>>>(a);
  } else {
    rope_kernel<T, false><<<grid, kThreads, 0, stream>>>(a);
  }
}

}  // namespace

bool rope_cuda(const RopeArgs& a, void* stream) {
  if (!rope_head_dim_supported(a.dtype, a.head_dim) || a.batch < 0 || a.seq < 0 || a.q_heads < 0 || a.k_heads < 0) {
    return false;
  }
  // A strided row holds its heads and starts on a 16-byte boundary.
  const int64_t bytes = element_bytes(a.dtype);
  if (a.q_row_stride < 0 || a.k_row_stride < 0 || (a.q_row_stride > 0 && a.q_row_stride < a.q_heads * a.head_dim) ||
      (a.k_row_stride > 0 && a.k_row_stride < a.k_heads * a.head_dim) || a.q_row_stride * bytes % 16 != 0 ||
      a.k_row_stride * bytes % 16 != 0) {
    return false;
  }
  if (a.batch * a.seq > INT32_MAX || (a.q_heads + a.k_heads) * a.head_dim > INT32_MAX) return false;
  if (a.cos == nullptr || a.sin == nullptr) return false;
  if (a.q_heads > 0 && (a.q == nullptr || a.q_out == nullptr)) return false;
  if (a.k_heads > 0 && (a.k == nullptr || a.k_out == nullptr)) return false;
  for (const void* p : {a.q, static_cast<const void*>(a.q_out), a.k, static_cast<const void*>(a.k_out), a.cos, a.sin}) {
    if (!aligned16(p)) return false;
  }
  if (a.batch * a.seq == 0 || a.q_heads + a.k_heads == 0) return true;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case ElementDtype::kFloat32: launch<float>(a, s); break;
    case ElementDtype::kFloat16: launch<__half>(a, s); break;
    case ElementDtype::kBFloat16: launch<__nv_bfloat16>(a, s); break;
  }
  return true;
}

}  // namespace colossus::kernels
