// Dense decode GEMV (gemv.h); no torch headers here by design. A block of
// kWarps warps owns kRowsPerBlock output features (in the gated form,
// feature n and its partner n + F) and splits `in` over all its threads in
// 16-byte chunks, each thread holding kRows x-rows' partial sums; warps
// reduce by shuffles, then the block through shared memory. Splitting K over
// the block (not one warp per feature) gives every projection thousands of
// warps, so enough loads are in flight to stream W at the memory's rate even
// for a 2048-row matrix or a long K (the down projection). Four chunks are
// loaded per iteration before any multiply.
#include "colossus/kernels/cuda/fused_common.cuh"
#include "colossus/kernels/gemv.h"

#include <cstdint>

namespace colossus::kernels {

namespace {

using fused::from_float;
using fused::to_float;
using fused::Vec;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;
constexpr int kRowsPerBlock = 2;

__device__ __forceinline__ float silu(float v) { return v / (1.f + __expf(-v)); }

template <typename T, int kRows, GemvEpilogue kEpilogue>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a) {
  constexpr int kPerVec = Vec<T>::kSize;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t in = a.in_features;
  const int64_t features = kEpilogue == GemvEpilogue::kGated ? a.out_features / 2 : a.out_features;
  const int64_t block = blockIdx.x;
  int64_t w_rows[kRowsPerBlock];
  if constexpr (kEpilogue == GemvEpilogue::kGated) {
    w_rows[0] = block;
    w_rows[1] = block + features;
  } else {
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
      // A past-the-end row recomputes the last one (no divergence) and is not written.
      w_rows[r] = block * kRowsPerBlock + r < features ? block * kRowsPerBlock + r : features - 1;
    }
  }
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.weight);
  float acc[kRowsPerBlock][kRows];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) {
#pragma unroll
    for (int m = 0; m < kRows; ++m) acc[r][m] = 0.f;
  }
  const int64_t chunks = in / kPerVec;
  int64_t c = tid;
  for (; c + kThreads * (kUnroll - 1) < chunks; c += kThreads * kUnroll) {
    Vec<T> wv[kRowsPerBlock][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) wv[r][u].load(w + w_rows[r] * in + (c + kThreads * u) * kPerVec);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int m = 0; m < kRows; ++m) {
        Vec<T> xv;
        xv.load(x + m * in + (c + kThreads * u) * kPerVec);
#pragma unroll
        for (int r = 0; r < kRowsPerBlock; ++r) {
#pragma unroll
          for (int i = 0; i < kPerVec; ++i) acc[r][m] = fmaf(wv[r][u].v[i], xv.v[i], acc[r][m]);
        }
      }
    }
  }
  for (; c < chunks; c += kThreads) {
    Vec<T> wv[kRowsPerBlock];
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) wv[r].load(w + w_rows[r] * in + c * kPerVec);
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      Vec<T> xv;
      xv.load(x + m * in + c * kPerVec);
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) {
#pragma unroll
        for (int i = 0; i < kPerVec; ++i) acc[r][m] = fmaf(wv[r].v[i], xv.v[i], acc[r][m]);
      }
    }
  }
  __shared__ float partial[kWarps][kRowsPerBlock][kRows];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) {
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], offset);
      if (lane == 0) partial[warp][r][m] = acc[r][m];
    }
  }
  __syncthreads();
  if (tid >= kRows) return;
  const int m = tid;  // one thread per x row writes its outputs
  float sum[kRowsPerBlock];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) {
    sum[r] = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) sum[r] += partial[k][r][m];
  }
  T* y = static_cast<T*>(a.y);
  if constexpr (kEpilogue == GemvEpilogue::kGated) {
    y[m * features + block] = from_float<T>(silu(sum[0]) * sum[1]);
  } else {
    const T* bias = static_cast<const T*>(a.bias);
    const T* residual = static_cast<const T*>(a.residual);
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
      const int64_t n = block * kRowsPerBlock + r;
      if (n >= features) break;
      float v = sum[r];
      if constexpr (kEpilogue == GemvEpilogue::kNone) {
        if (bias != nullptr) v += to_float(bias[n]);
      }
      if constexpr (kEpilogue == GemvEpilogue::kResidual) v += to_float(residual[m * features + n]);
      y[m * features + n] = from_float<T>(v);
    }
  }
}

template <typename T, int kRows>
void launch_epilogue(const GemvArgs& a, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(a.epilogue == GemvEpilogue::kGated
                                                ? a.out_features / 2
                                                : (a.out_features + kRowsPerBlock - 1) / kRowsPerBlock);
  switch (a.epilogue) {
    case GemvEpilogue::kNone: gemv_kernel<T, kRows, GemvEpilogue::kNone><<<blocks, kThreads, 0, stream>>>(a); break;
    case GemvEpilogue::kResidual:
      gemv_kernel<T, kRows, GemvEpilogue::kResidual><<<blocks, kThreads, 0, stream>>>(a);
      break;
    case GemvEpilogue::kGated: gemv_kernel<T, kRows, GemvEpilogue::kGated><<<blocks, kThreads, 0, stream>>>(a); break;
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
