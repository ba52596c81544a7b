// Dense decode GEMV (gemv.h); no torch headers here by design. A block of
// kWarps warps; each warp owns kRowsPerWarp output features (in the gated
// form, feature n and its partner n + F), its lanes stride over `in` in
// 16-byte chunks of every owned weight row, holding kRows x-rows' partial
// sums, then reduce across the warp. Four chunks are loaded per iteration
// before any multiply, so each lane keeps several loads in flight (the kernel
// is bound by streaming W once).
#include "colossus/kernels/cuda/fused_common.cuh"
#include "colossus/kernels/gemv.h"

#include <cstdint>

namespace colossus::kernels {

namespace {

using fused::from_float;
using fused::to_float;
using fused::Vec;

constexpr int kWarps = 4;
constexpr int kUnroll = 4;

__device__ __forceinline__ float silu(float v) { return v / (1.f + __expf(-v)); }

template <typename T, int kRows, GemvEpilogue kEpilogue>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemvArgs a) {
  // kGated: each warp's two weight rows are feature n and n + F.
  constexpr int kRowsPerWarp = 2;
  constexpr int kPerVec = Vec<T>::kSize;
  const int lane = threadIdx.x % 32;
  const int64_t in = a.in_features;
  const int64_t features = kEpilogue == GemvEpilogue::kGated ? a.out_features / 2 : a.out_features;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  int64_t w_rows[kRowsPerWarp];
  if constexpr (kEpilogue == GemvEpilogue::kGated) {
    if (warp >= features) return;
    w_rows[0] = warp;
    w_rows[1] = warp + features;
  } else {
    if (warp * kRowsPerWarp >= features) return;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      // A past-the-end row recomputes the last one (no divergence) and is not written.
      w_rows[r] = warp * kRowsPerWarp + r < features ? warp * kRowsPerWarp + r : features - 1;
    }
  }
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  float acc[kRowsPerWarp][kRows];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < kRows; ++m) acc[r][m] = 0.f;
  }
  const int64_t chunks = in / kPerVec;
  int64_t c = lane;
  // Full groups of kUnroll chunks per lane, then the rest one by one.
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    Vec<T> wv[kRowsPerWarp][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) wv[r][u].load(w + w_rows[r] * in + (c + 32 * u) * kPerVec);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        Vec<T> xv;
        xv.load(x + m * in + (c + 32 * u) * kPerVec);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
          for (int i = 0; i < kPerVec; ++i) acc[r][m] = fmaf(wv[r][u].v[i], xv.v[i], acc[r][m]);
        }
      }
    }
  }
  for (; c < chunks; c += 32) {
    Vec<T> wv[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) wv[r].load(w + w_rows[r] * in + c * kPerVec);
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      Vec<T> xv;
      xv.load(x + m * in + c * kPerVec);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
        for (int i = 0; i < kPerVec; ++i) acc[r][m] = fmaf(wv[r].v[i], xv.v[i], acc[r][m]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], offset);
    }
  }
  if (lane != 0) return;
  T* y = static_cast<T*>(a.y);
  if constexpr (kEpilogue == GemvEpilogue::kGated) {
#pragma unroll
    for (int m = 0; m < kRows; ++m) y[m * features + warp] = from_float<T>(silu(acc[0][m]) * acc[1][m]);
  } else {
    const T* bias = static_cast<const T*>(a.bias);
    const T* residual = static_cast<const T*>(a.residual);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t n = warp * kRowsPerWarp + r;
      if (n >= features) break;
      const float b = kEpilogue == GemvEpilogue::kNone && bias != nullptr ? to_float(bias[n]) : 0.f;
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        float v = acc[r][m] + b;
        if constexpr (kEpilogue == GemvEpilogue::kResidual) v += to_float(residual[m * features + n]);
        y[m * features + n] = from_float<T>(v);
      }
    }
  }
}

template <typename T, int kRows>
void launch_epilogue(const GemvArgs& a, cudaStream_t stream) {
  const int64_t warps = a.epilogue == GemvEpilogue::kGated ? a.out_features / 2 : (a.out_features + 1) / 2;
  const auto blocks = static_cast<unsigned>((warps + kWarps - 1) / kWarps);
  switch (a.epilogue) {
    case GemvEpilogue::kNone: gemv_kernel<T, kRows, GemvEpilogue::kNone><<<blocks, kWarps * 32, 0, stream>>>(a); break;
    case GemvEpilogue::kResidual:
      gemv_kernel<T, kRows, GemvEpilogue::kResidual><<<blocks, kWarps * 32, 0, stream>>>(a);
      break;
    case GemvEpilogue::kGated: gemv_kernel<T, kRows, GemvEpilogue::kGated><<<blocks, kWarps * 32, 0, stream>>>(a); break;
  }
}

template <typename T>
void launch_rows(const GemvArgs& a, cudaStream_t stream) {
  static_assert(kGemvMaxRows == 8, "one case per row count below");
  switch (a.rows) {
    case 1: launch_epilogue<T, 1>(a, stream); break;
    case 2: launch_epilogue<T, 2>(a, stream); break;
    case 3: launch_epilogue<T, 3>(a, stream); break;
    case 4: launch_epilogue<T, 4>(a, stream); break;
    case 5: launch_epilogue<T, 5>(a, stream); break;
    case 6: launch_epilogue<T, 6>(a, stream); break;
    case 7: launch_epilogue<T, 7>(a, stream); break;
    default: launch_epilogue<T, 8>(a, stream); break;
  }
}

}  // namespace

bool gemv_cuda(const GemvArgs& a, void* stream) {
  if (!gemv_supported(a)) return false;
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.dtype == ElementDtype::kBFloat16) {
    launch_rows<__nv_bfloat16>(a, s);
  } else {
    launch_rows<__half>(a, s);
  }
  return true;
}

}  // namespace colossus::kernels
