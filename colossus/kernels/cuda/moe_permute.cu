// CUDA kernels of MoE token dispatch (moe_permute.h); no torch headers here
// by design. The sort is a stable counting sort with one block per expert:
// pass 1 counts the expert's assignments, pass 2 walks the assignments in
// order in tiles, ranks the expert's ones inside each tile by a warp-ballot
// prefix sum and writes them after the experts before it (E blocks each read
// the N*k ids: cheap for the E <= a few hundred of MoE layers, and
// deterministic, unlike atomics). The row kernels use one block per row
// (token), 16-byte vectors when the rows are aligned to them, fp32 math.
#include "colossus/kernels/moe_permute.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "colossus/kernels/cuda/fused_common.cuh"

namespace colossus::kernels {

namespace {

constexpr int kSortThreads = 256;
constexpr int kRowThreads = 128;
constexpr int64_t kMaxExperts = 4096;

using fused::from_float;
using fused::to_float;

// V consecutive elements as floats (one 16-byte load when V * sizeof(T) == 16).
template <typename T, int V>
__device__ __forceinline__ void load(const T* p, float (&f)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = to_float(v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = to_float(p[j]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store(T* p, const float (&f)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    uint4 raw;
    T* v = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = from_float<T>(f[j]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = from_float<T>(f[j]);
  }
}

// Sum of `value` over the block (kThreads a multiple of 32); every thread gets it.
template <int kThreads, typename U>
__device__ __forceinline__ U block_sum(U value) {
  __shared__ U warp_sums[kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  U total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  __syncthreads();  // warp_sums may be reused by the next call
  return total;
}

// Block e: how many assignments go to expert e.
__global__ void __launch_bounds__(kSortThreads)
    count_kernel(const int64_t* experts, int64_t assignments, int64_t* total_counts) {
  const int64_t e = blockIdx.x;
  int64_t mine = 0;
  for (int64_t a = threadIdx.x; a < assignments; a += kSortThreads) mine += experts[a] == e ? 1 : 0;
  const int64_t total = block_sum<kSortThreads>(mine);
  if (threadIdx.x == 0) total_counts[e] = total;
}

// Block e: expert e's kept assignments, in assignment (= token) order, to rows
// [offset_e, offset_e + kept_e).
__global__ void __launch_bounds__(kSortThreads)
    scatter_kernel(const int64_t* experts, int64_t assignments, int64_t top_k, int64_t capacity, const int64_t* total_counts, int64_t* counts,
                   int64_t* token_index, int64_t* row_assignment, int64_t* row_of) {
  const int64_t e = blockIdx.x;
  __shared__ int64_t offset;
  __shared__ int warp_counts[kSortThreads / 32];
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int64_t other = 0; other < e; ++other) {
      const int64_t c = total_counts[other];
      sum += capacity >= 0 && c > capacity ? capacity : c;
    }
    offset = sum;
    const int64_t c = total_counts[e];
    counts[e] = capacity >= 0 && c > capacity ? capacity : c;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned lanes_below = (1u << lane) - 1u;
  int64_t seen = 0;  // expert e's assignments in earlier tiles
  for (int64_t tile = 0; tile < assignments; tile += kSortThreads) {
    const int64_t a = tile + threadIdx.x;
    const bool mine = a < assignments && experts[a] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, in_tile = 0;
#pragma unroll
    for (int w = 0; w < kSortThreads / 32; ++w) {
      before += w < warp ? warp_counts[w] : 0;
      in_tile += warp_counts[w];
    }
    if (mine) {
      const int64_t position = seen + before + __popc(ballot & lanes_below);
      if (capacity < 0 || position < capacity) {
        const int64_t row = offset + position;
        token_index[row] = a / top_k;
        row_assignment[row] = a;
        row_of[a] = row;
      } else {
        row_of[a] = -1;
      }
    }
    seen += in_tile;
    __syncthreads();  // warp_counts is rewritten by the next tile
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kRowThreads)
    permute_kernel(const T* in, T* out, int64_t width, const int64_t* source, const float* scale) {
  const int64_t row = blockIdx.x;
  const T* src = in + source[row] * width;
  T* dst = out + row * width;
  const float s = scale ? scale[row] : 1.f;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < width; c += kRowThreads * V) {
    float f[V];
    load<T, V>(src + c, f);
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] *= s;
    store<T, V>(dst + c, f);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kRowThreads)
    unpermute_kernel(const T* in, T* out, int64_t top_k, int64_t width, const int64_t* row_of,
                     const float* row_weight) {
  const int64_t token = blockIdx.x;
  T* dst = out + token * width;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < width; c += kRowThreads * V) {
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
    for (int64_t slot = 0; slot < top_k; ++slot) {
      const int64_t row = row_of[token * top_k + slot];
      if (row < 0) continue;  // dropped by the capacity
      const float w = row_weight ? row_weight[row] : 1.f;
      float f[V];
      load<T, V>(in + row * width + c, f);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += w * f[j];
    }
    store<T, V>(dst + c, acc);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kRowThreads)
    row_dot_kernel(const T* grad_out, const T* rows_in, int64_t width, const int64_t* token_index,
                   float* grad_weight) {
  const int64_t row = blockIdx.x;
  const T* g = grad_out + token_index[row] * width;
  const T* y = rows_in + row * width;
  float sum = 0.f;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < width; c += kRowThreads * V) {
    float a[V], b[V];
    load<T, V>(g + c, a);
    load<T, V>(y + c, b);
#pragma unroll
    for (int j = 0; j < V; ++j) sum += a[j] * b[j];
  }
  sum = block_sum<kRowThreads>(sum);
  if (threadIdx.x == 0) grad_weight[row] = sum;
}

int64_t element_bytes(MoeRowsDtype dtype) { return dtype == MoeRowsDtype::kFloat32 ? 4 : 2; }

// Whether 16-byte vectors fit: width a multiple of them and the bases aligned
// (row starts then are too).
bool vectorizable(MoeRowsDtype dtype, int64_t width, const void* a, const void* b) {
  const int64_t bytes = width * element_bytes(dtype);
  return bytes % 16 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
}

// Launch<T, V>::run(args, stream) for the dtype and vector width.
template <template <typename, int> class Launch, typename Args>
void dispatch_rows(MoeRowsDtype dtype, bool vectors, const Args& args, cudaStream_t stream) {
  switch (dtype) {
    case MoeRowsDtype::kFloat32:
      vectors ? Launch<float, 4>::run(args, stream) : Launch<float, 1>::run(args, stream);
      break;
    case MoeRowsDtype::kFloat16:
      vectors ? Launch<__half, 8>::run(args, stream) : Launch<__half, 1>::run(args, stream);
      break;
    case MoeRowsDtype::kBFloat16:
      vectors ? Launch<__nv_bfloat16, 8>::run(args, stream) : Launch<__nv_bfloat16, 1>::run(args, stream);
      break;
  }
}

template <typename T, int V>
struct PermuteLaunch {
  static void run(const MoePermuteArgs& a, cudaStream_t s) {
    permute_kernel<T, V><<<static_cast<unsigned>(a.rows), kRowThreads, 0, s>>>(
        static_cast<const T*>(a.in), static_cast<T*>(a.out), a.width, a.source, a.scale);
  }
};

template <typename T, int V>
struct UnpermuteLaunch {
  static void run(const MoeUnpermuteArgs& a, cudaStream_t s) {
    unpermute_kernel<T, V><<<static_cast<unsigned>(a.tokens), kRowThreads, 0, s>>>(
        static_cast<const T*>(a.in), static_cast<T*>(a.out), a.top_k, a.width, a.row_of, a.row_weight);
  }
};

template <typename T, int V>
struct RowDotLaunch {
  static void run(const MoeRowDotArgs& a, cudaStream_t s) {
    row_dot_kernel<T, V><<<static_cast<unsigned>(a.rows), kRowThreads, 0, s>>>(
        static_cast<const T*>(a.grad_out), static_cast<const T*>(a.rows_in), a.width, a.token_index, a.grad_weight);
  }
};

}  // namespace

bool moe_sort_cuda(const MoeSortArgs& a, void* stream) {
  if (a.num_experts < 1 || a.num_experts > kMaxExperts || a.top_k < 1 || a.tokens < 0) return false;
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.tokens == 0) {
    const size_t bytes = static_cast<size_t>(a.num_experts) * sizeof(int64_t);
    return cudaMemsetAsync(a.counts, 0, bytes, s) == cudaSuccess &&
           cudaMemsetAsync(a.total_counts, 0, bytes, s) == cudaSuccess;
  }
  const int64_t assignments = a.tokens * a.top_k;
  const auto blocks = static_cast<unsigned>(a.num_experts);
  count_kernel<<<blocks, kSortThreads, 0, s>>>(a.experts, assignments, a.total_counts);
  scatter_kernel<<<blocks, kSortThreads, 0, s>>>(a.experts, assignments, a.top_k, a.capacity,
                                                 a.total_counts, a.counts, a.token_index, a.row_assignment, a.row_of);
  return true;
}

bool moe_permute_cuda(const MoePermuteArgs& a, void* stream) {
  if (a.rows < 0 || a.width < 1) return false;
  if (a.rows == 0) return true;
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_rows<PermuteLaunch>(a.dtype, vectorizable(a.dtype, a.width, a.in, a.out), a, s);
  return true;
}

bool moe_unpermute_cuda(const MoeUnpermuteArgs& a, void* stream) {
  if (a.tokens < 0 || a.width < 1 || a.top_k < 1) return false;
  if (a.tokens == 0) return true;
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_rows<UnpermuteLaunch>(a.dtype, vectorizable(a.dtype, a.width, a.in, a.out), a, s);
  return true;
}

bool moe_row_dot_cuda(const MoeRowDotArgs& a, void* stream) {
  if (a.rows < 0 || a.width < 1) return false;
  if (a.rows == 0) return true;
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_rows<RowDotLaunch>(a.dtype, vectorizable(a.dtype, a.width, a.grad_out, a.rows_in), a, s);
  return true;
}

}  // namespace colossus::kernels
