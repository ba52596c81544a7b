// Fused RMSNorm / LayerNorm with the residual add (norm.h); no torch headers
// here by design. Forward: one 256-thread block per row, the row held in
// registers (kVecs 16-byte vectors per thread), one read of x (and residual),
// one write of y (and the sum). Backward: norm_partial_blocks(rows) blocks
// stride over the rows; each thread owns the same columns in every row, so
// its dweight/dbias sums live in shared memory with no atomics and no races,
// and go out as one partial row per block; column_sum_kernel adds those rows
// in a fixed order (deterministic) and rounds once.
#include "colossus/kernels/cuda/fused_common.cuh"
#include "colossus/kernels/norm.h"

#include <cstdint>

namespace colossus::kernels {

namespace {

using fused::block_sum;
using fused::from_float;
using fused::round_to;
using fused::Vec;

constexpr int kThreads = 256;

template <typename T, int kVecs, NormKind kKind>
__global__ void __launch_bounds__(kThreads) norm_forward_kernel(NormForwardArgs a) {
  constexpr int kSize = Vec<T>::kSize;
  const int nvec = static_cast<int>(a.cols / kSize);
  const int64_t row = blockIdx.x;
  const int64_t base = row * a.cols;
  const T* x = static_cast<const T*>(a.x) + base;
  const T* residual = a.residual != nullptr ? static_cast<const T*>(a.residual) + base : nullptr;
  Vec<T> s[kVecs];
  float sum[1] = {0.f};
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int vi = threadIdx.x + k * kThreads;
    if (vi >= nvec) {
      s[k].zero();
      continue;
    }
    s[k].load(x + vi * kSize);
    if (residual != nullptr) {
      Vec<T> r;
      r.load(residual + vi * kSize);
#pragma unroll
      for (int i = 0; i < kSize; ++i) s[k].v[i] = round_to<T>(s[k].v[i] + r.v[i]);
      s[k].store(static_cast<T*>(a.residual_out) + base + vi * kSize);
    }
#pragma unroll
    for (int i = 0; i < kSize; ++i) sum[0] += kKind == NormKind::kRms ? s[k].v[i] * s[k].v[i] : s[k].v[i];
  }
  block_sum(sum);
  const float inv_cols = 1.f / static_cast<float>(a.cols);
  [[maybe_unused]] float mean = 0.f;
  float rstd = 0.f;
  if constexpr (kKind == NormKind::kRms) {
    rstd = rsqrtf(sum[0] * inv_cols + a.eps);
  } else {
    // Two passes over the registers: the variance of the centred values.
    mean = sum[0] * inv_cols;
    float var[1] = {0.f};
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      if (static_cast<int>(threadIdx.x) + k * kThreads >= nvec) continue;
#pragma unroll
      for (int i = 0; i < kSize; ++i) var[0] += (s[k].v[i] - mean) * (s[k].v[i] - mean);
    }
    block_sum(var);
    rstd = rsqrtf(var[0] * inv_cols + a.eps);
  }
  if (threadIdx.x == 0) {
    a.rstd[row] = rstd;
    if constexpr (kKind == NormKind::kLayer) a.mean[row] = mean;
  }
  const T* weight = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y) + base;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int vi = threadIdx.x + k * kThreads;
    if (vi >= nvec) continue;
    Vec<T> w;
    w.load(weight + vi * kSize);
    if constexpr (kKind == NormKind::kRms) {
#pragma unroll
      for (int i = 0; i < kSize; ++i) s[k].v[i] = round_to<T>(s[k].v[i] * rstd) * w.v[i];
    } else {
      Vec<T> b;
      if (bias != nullptr) {
        b.load(bias + vi * kSize);
      } else {
        b.zero();
      }
#pragma unroll
      for (int i = 0; i < kSize; ++i) s[k].v[i] = (s[k].v[i] - mean) * rstd * w.v[i] + b.v[i];
    }
    s[k].store(y + vi * kSize);
  }
}

// Shared memory: kSize * nvec fp32 dweight sums laid out [i][vi] (consecutive
// threads, consecutive banks), then as many dbias sums for kLayer.
template <typename T, int kVecs, NormKind kKind>
__global__ void __launch_bounds__(kThreads) norm_backward_kernel(NormBackwardArgs a) {
  constexpr int kSize = Vec<T>::kSize;
  constexpr int kSums = kKind == NormKind::kRms ? 1 : 2;
  extern __shared__ float acc[];
  const int nvec = static_cast<int>(a.cols / kSize);
  const int cols = static_cast<int>(a.cols);
  float* acc_dw = acc;
  [[maybe_unused]] float* acc_db = acc + cols;  // kLayer only
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int vi = threadIdx.x + k * kThreads;
    if (vi >= nvec) continue;
#pragma unroll
    for (int i = 0; i < kSize; ++i) {
      acc_dw[i * nvec + vi] = 0.f;
      if constexpr (kKind == NormKind::kLayer) acc_db[i * nvec + vi] = 0.f;
    }
  }
  const T* weight = static_cast<const T*>(a.weight);
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t base = row * a.cols;
    const float rstd = a.rstd[row];
    const float mean = kKind == NormKind::kLayer ? a.mean[row] : 0.f;
    Vec<T> n[kVecs], g[kVecs];  // the normalised input, and dy * weight
    float sums[kSums];
#pragma unroll
    for (int j = 0; j < kSums; ++j) sums[j] = 0.f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int vi = threadIdx.x + k * kThreads;
      if (vi >= nvec) {
        n[k].zero();
        g[k].zero();
        continue;
      }
      Vec<T> w;
      n[k].load(static_cast<const T*>(a.s) + base + vi * kSize);
      g[k].load(static_cast<const T*>(a.dy) + base + vi * kSize);
      w.load(weight + vi * kSize);
#pragma unroll
      for (int i = 0; i < kSize; ++i) {
        const float dy = g[k].v[i];
        n[k].v[i] = (n[k].v[i] - mean) * rstd;
        acc_dw[i * nvec + vi] += dy * n[k].v[i];
        if constexpr (kKind == NormKind::kLayer) acc_db[i * nvec + vi] += dy;
        g[k].v[i] = dy * w.v[i];
        sums[0] += g[k].v[i] * n[k].v[i];
        if constexpr (kKind == NormKind::kLayer) sums[kSums - 1] += g[k].v[i];
      }
    }
    block_sum(sums);
    const float inv_cols = 1.f / static_cast<float>(a.cols);
    const float dot = sums[0] * inv_cols;
    const float g_mean = kKind == NormKind::kLayer ? sums[kSums - 1] * inv_cols : 0.f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int vi = threadIdx.x + k * kThreads;
      if (vi >= nvec) continue;
      Vec<T> d;
      if (a.dresidual_out != nullptr) {
        d.load(static_cast<const T*>(a.dresidual_out) + base + vi * kSize);
      } else {
        d.zero();
      }
#pragma unroll
      for (int i = 0; i < kSize; ++i) d.v[i] += rstd * (g[k].v[i] - g_mean - n[k].v[i] * dot);
      d.store(static_cast<T*>(a.dx) + base + vi * kSize);
    }
  }
  float* partial_dw = a.partial + static_cast<int64_t>(blockIdx.x) * cols;
  [[maybe_unused]] float* partial_db = a.partial + (static_cast<int64_t>(gridDim.x) + blockIdx.x) * cols;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int vi = threadIdx.x + k * kThreads;
    if (vi >= nvec) continue;
#pragma unroll
    for (int i = 0; i < kSize; ++i) {
      partial_dw[vi * kSize + i] = acc_dw[i * nvec + vi];
      if constexpr (kKind == NormKind::kLayer) partial_db[vi * kSize + i] = acc_db[i * nvec + vi];
    }
  }
}

// out[c] = sum over b < blocks of partial[b, c]. Blocks of (32, 8) threads:
// a warp reads 32 consecutive columns of one partial row, the 8 warps take
// every 8th row, and their sums are added in the order of threadIdx.y
// (deterministic).
template <typename T>
__global__ void __launch_bounds__(kThreads) column_sum_kernel(const float* partial, int blocks, int64_t cols, T* out) {
  __shared__ float sums[8][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float total = 0.f;
  if (c < cols) {
    for (int b = threadIdx.y; b < blocks; b += 8) total += partial[b * cols + c];
  }
  sums[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float sum = 0.f;
#pragma unroll
    for (int y = 0; y < 8; ++y) sum += sums[y][threadIdx.x];
    out[c] = from_float<T>(sum);
  }
}

// Registers per thread for a row: 1, 2, 4 or 8 vectors (0: too wide).
int vecs_per_thread(int64_t cols, int64_t vec) {
  const int64_t per_thread = (cols / vec + kThreads - 1) / kThreads;
  for (int v : {1, 2, 4, 8}) {
    if (per_thread <= v) return v;
  }
  return 0;
}

template <typename T, NormKind kKind>
void launch_forward(const NormForwardArgs& a, int vecs, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.rows));
  switch (vecs) {
    case 1: norm_forward_kernel<T, 1, kKind><<<grid, kThreads, 0, stream>>>(a); break;
    case 2: norm_forward_kernel<T, 2, kKind><<<grid, kThreads, 0, stream>>>(a); break;
    case 4: norm_forward_kernel<T, 4, kKind><<<grid, kThreads, 0, stream>>>(a); break;
    default: norm_forward_kernel<T, 8, kKind><<<grid, kThreads, 0, stream>>>(a); break;
  }
}

template <typename T>
void launch_forward(const NormForwardArgs& a, int vecs, cudaStream_t stream) {
  if (a.kind == NormKind::kRms) {
    launch_forward<T, NormKind::kRms>(a, vecs, stream);
  } else {
    launch_forward<T, NormKind::kLayer>(a, vecs, stream);
  }
}

template <typename T, NormKind kKind>
void launch_backward(const NormBackwardArgs& a, int vecs, cudaStream_t stream) {
  const int blocks = static_cast<int>(norm_partial_blocks(a.rows));
  const size_t shared = static_cast<size_t>(a.cols) * sizeof(float) * (kKind == NormKind::kLayer ? 2 : 1);
  switch (vecs) {
    case 1: norm_backward_kernel<T, 1, kKind><<<blocks, kThreads, shared, stream>>>(a); break;
    case 2: norm_backward_kernel<T, 2, kKind><<<blocks, kThreads, shared, stream>>>(a); break;
    case 4: norm_backward_kernel<T, 4, kKind><<<blocks, kThreads, shared, stream>>>(a); break;
    default: norm_backward_kernel<T, 8, kKind><<<blocks, kThreads, shared, stream>>>(a); break;
  }
  const unsigned col_blocks = static_cast<unsigned>((a.cols + 31) / 32);
  const dim3 col_threads(32, 8);
  column_sum_kernel<T><<<col_blocks, col_threads, 0, stream>>>(a.partial, blocks, a.cols, static_cast<T*>(a.dweight));
  if (kKind == NormKind::kLayer && a.dbias != nullptr) {
    column_sum_kernel<T><<<col_blocks, col_threads, 0, stream>>>(a.partial + static_cast<int64_t>(blocks) * a.cols,
                                                                 blocks, a.cols, static_cast<T*>(a.dbias));
  }
}

template <typename T>
void launch_backward(const NormBackwardArgs& a, int vecs, cudaStream_t stream) {
  if (a.kind == NormKind::kRms) {
    launch_backward<T, NormKind::kRms>(a, vecs, stream);
  } else {
    launch_backward<T, NormKind::kLayer>(a, vecs, stream);
  }
}

}  // namespace

bool norm_forward_cuda(const NormForwardArgs& a, void* stream) {
  if (!norm_cols_supported(a.kind, a.dtype, a.cols) || a.rows < 0 || a.rows > INT32_MAX) return false;
  if (a.x == nullptr || a.weight == nullptr || a.y == nullptr || a.rstd == nullptr) return false;
  if (a.residual != nullptr && a.residual_out == nullptr) return false;
  if (a.kind == NormKind::kLayer && a.mean == nullptr) return false;
  for (const void* p : {a.x, a.residual, a.weight, a.bias, static_cast<const void*>(a.y), static_cast<const void*>(a.residual_out)}) {
    if (!aligned16(p)) return false;
  }
  const int vecs = vecs_per_thread(a.cols, vector_elements(a.dtype));
  if (vecs == 0) return false;
  if (a.rows == 0) return true;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case ElementDtype::kFloat32: launch_forward<float>(a, vecs, s); break;
    case ElementDtype::kFloat16: launch_forward<__half>(a, vecs, s); break;
    case ElementDtype::kBFloat16: launch_forward<__nv_bfloat16>(a, vecs, s); break;
  }
  return true;
}

bool norm_backward_cuda(const NormBackwardArgs& a, void* stream) {
  if (!norm_cols_supported(a.kind, a.dtype, a.cols) || a.rows < 0) return false;
  if (a.dy == nullptr || a.s == nullptr || a.weight == nullptr || a.rstd == nullptr || a.dx == nullptr ||
      a.dweight == nullptr || a.partial == nullptr) {
    return false;
  }
  if (a.kind == NormKind::kLayer && a.mean == nullptr) return false;
  for (const void* p : {a.dy, a.dresidual_out, a.s, a.weight, static_cast<const void*>(a.dx)}) {
    if (!aligned16(p)) return false;
  }
  const int vecs = vecs_per_thread(a.cols, vector_elements(a.dtype));
  if (vecs == 0) return false;
  const auto s = static_cast<cudaStream_t>(stream);
  // rows == 0 still runs: dweight (and dbias) are then zeros.
  switch (a.dtype) {
    case ElementDtype::kFloat32: launch_backward<float>(a, vecs, s); break;
    case ElementDtype::kFloat16: launch_backward<__half>(a, vecs, s); break;
    case ElementDtype::kBFloat16: launch_backward<__nv_bfloat16>(a, vecs, s); break;
  }
  return true;
}

}  // namespace colossus::kernels
