// Fused SwiGLU forward and backward (swiglu.h); no torch headers here by
// design. Elementwise, grid-stride over packs of kPack elements: 16-byte
// packs when every pointer is aligned (a second launch of 1-element packs
// covers the tail), 1-element packs otherwise. The forward reads gate and up
// once and writes out once (the unfused silu-then-multiply makes a rounded
// intermediate and twice the traffic); the backward reads dout, gate, up and
// writes both gradients in one pass.
#include "colossus/kernels/cuda/fused_common.cuh"
#include "colossus/kernels/swiglu.h"

#include <algorithm>
#include <cstdint>

namespace colossus::kernels {

namespace {

using fused::from_float;
using fused::to_float;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;

// kPack consecutive elements of T as floats; kPack * sizeof(T) is 16 or
// sizeof(T), so the pointer's natural alignment for that size is enough.
template <typename T, int kPack>
struct alignas(sizeof(T) * kPack) Pack {
  T e[kPack];
};

template <typename T, int kPack>
__device__ __forceinline__ void load(const T* p, float (&v)[kPack]) {
  const Pack<T, kPack> raw = *reinterpret_cast<const Pack<T, kPack>*>(p);
#pragma unroll
  for (int i = 0; i < kPack; ++i) v[i] = to_float(raw.e[i]);
}

template <typename T, int kPack>
__device__ __forceinline__ void store(T* p, const float (&v)[kPack]) {
  Pack<T, kPack> raw;
#pragma unroll
  for (int i = 0; i < kPack; ++i) raw.e[i] = from_float<T>(v[i]);
  *reinterpret_cast<Pack<T, kPack>*>(p) = raw;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }

// Elements [begin, begin + packs * kPack).
template <typename T, int kPack>
__global__ void __launch_bounds__(kThreads) swiglu_forward_kernel(SwigluArgs a, int64_t begin, int64_t packs) {
  const T* gate = static_cast<const T*>(a.gate) + begin;
  const T* up = static_cast<const T*>(a.up) + begin;
  T* out = static_cast<T*>(a.out) + begin;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * kThreads) {
    float g[kPack], u[kPack];
    load<T, kPack>(gate + p * kPack, g);
    load<T, kPack>(up + p * kPack, u);
#pragma unroll
    for (int i = 0; i < kPack; ++i) g[i] = g[i] * sigmoid(g[i]) * u[i];
    store<T, kPack>(out + p * kPack, g);
  }
}

// In place: g <- d(silu(g) * u)/dg * d, u <- silu(g) * d (dgate, dup), in fp32.
template <int kPack>
__device__ __forceinline__ void swiglu_grad(float (&g)[kPack], float (&u)[kPack], const float (&d)[kPack]) {
#pragma unroll
  for (int i = 0; i < kPack; ++i) {
    const float s = sigmoid(g[i]);
    const float silu = g[i] * s;
    const float dg = d[i] * u[i] * s * (1.f + g[i] * (1.f - s));
    u[i] = d[i] * silu;
    g[i] = dg;
  }
}

template <typename T, int kPack>
__global__ void __launch_bounds__(kThreads) swiglu_backward_kernel(SwigluArgs a, int64_t begin, int64_t packs) {
  const T* gate = static_cast<const T*>(a.gate) + begin;
  const T* up = static_cast<const T*>(a.up) + begin;
  const T* dout = static_cast<const T*>(a.dout) + begin;
  T* dgate = static_cast<T*>(a.dgate) + begin;
  T* dup = static_cast<T*>(a.dup) + begin;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * kThreads) {
    float g[kPack], u[kPack], d[kPack];
    load<T, kPack>(gate + p * kPack, g);
    load<T, kPack>(up + p * kPack, u);
    load<T, kPack>(dout + p * kPack, d);
    swiglu_grad<kPack>(g, u, d);
    store<T, kPack>(dgate + p * kPack, g);
    store<T, kPack>(dup + p * kPack, u);
  }
}

// Packs of one merged gate/up output: pack p covers elements [p * kPack,
// (p + 1) * kPack) of the (rows, width) result; width % kPack == 0.
template <typename T, int kPack>
__global__ void __launch_bounds__(kThreads) swiglu_packed_forward_kernel(SwigluPackedArgs a, int64_t packs) {
  const T* gate_up = static_cast<const T*>(a.gate_up);
  T* out = static_cast<T*>(a.out);
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t e = p * kPack, row = e / a.width, col = e % a.width;
    float g[kPack], u[kPack];
    load<T, kPack>(gate_up + row * 2 * a.width + col, g);
    load<T, kPack>(gate_up + row * 2 * a.width + a.width + col, u);
#pragma unroll
    for (int i = 0; i < kPack; ++i) g[i] = g[i] * sigmoid(g[i]) * u[i];
    store<T, kPack>(out + e, g);
  }
}

template <typename T, int kPack>
__global__ void __launch_bounds__(kThreads) swiglu_packed_backward_kernel(SwigluPackedArgs a, int64_t packs) {
  const T* gate_up = static_cast<const T*>(a.gate_up);
  const T* dout = static_cast<const T*>(a.dout);
  T* dgate_up = static_cast<T*>(a.dgate_up);
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t e = p * kPack, row = e / a.width, col = e % a.width;
    const int64_t gate_at = row * 2 * a.width + col, up_at = gate_at + a.width;
    float g[kPack], u[kPack], d[kPack];
    load<T, kPack>(gate_up + gate_at, g);
    load<T, kPack>(gate_up + up_at, u);
    load<T, kPack>(dout + e, d);
    swiglu_grad<kPack>(g, u, d);
    store<T, kPack>(dgate_up + gate_at, g);
    store<T, kPack>(dgate_up + up_at, u);
  }
}

unsigned blocks_for(int64_t packs) {
  return static_cast<unsigned>(std::min<int64_t>(kMaxBlocks, (packs + kThreads - 1) / kThreads));
}

template <typename T, bool kBackward>
void launch(const SwigluArgs& a, bool vectorized, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t vec_elements = vectorized ? a.n / kVec * kVec : 0;
  if (vec_elements > 0) {
    const int64_t packs = vec_elements / kVec;
    if constexpr (kBackward) {
      swiglu_backward_kernel<T, kVec><<<blocks_for(packs), kThreads, 0, stream>>>(a, 0, packs);
    } else {
      swiglu_forward_kernel<T, kVec><<<blocks_for(packs), kThreads, 0, stream>>>(a, 0, packs);
    }
  }
  const int64_t rest = a.n - vec_elements;
  if (rest > 0) {
    if constexpr (kBackward) {
      swiglu_backward_kernel<T, 1><<<blocks_for(rest), kThreads, 0, stream>>>(a, vec_elements, rest);
    } else {
      swiglu_forward_kernel<T, 1><<<blocks_for(rest), kThreads, 0, stream>>>(a, vec_elements, rest);
    }
  }
}

template <bool kBackward>
bool run(const SwigluArgs& a, void* stream) {
  // Empty tensors (an expert no token was routed to) may have null data.
  if (a.n == 0) return true;
  if (a.n < 0 || a.gate == nullptr || a.up == nullptr) return false;
  if (kBackward ? (a.dout == nullptr || a.dgate == nullptr || a.dup == nullptr) : a.out == nullptr) return false;
  bool vectorized = true;
  for (const void* p : {a.gate, a.up, static_cast<const void*>(a.out), a.dout, static_cast<const void*>(a.dgate),
                        static_cast<const void*>(a.dup)}) {
    vectorized = vectorized && aligned16(p);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case ElementDtype::kFloat32: launch<float, kBackward>(a, vectorized, s); break;
    case ElementDtype::kFloat16: launch<__half, kBackward>(a, vectorized, s); break;
    case ElementDtype::kBFloat16: launch<__nv_bfloat16, kBackward>(a, vectorized, s); break;
  }
  return true;
}

template <typename T, bool kBackward>
void launch_packed(const SwigluPackedArgs& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t n = a.rows * a.width;
  const bool aligned = kBackward ? aligned16(a.gate_up) && aligned16(a.dout) && aligned16(a.dgate_up)
                                 : aligned16(a.gate_up) && aligned16(a.out);
  if (a.width % kVec == 0 && aligned) {
    if constexpr (kBackward) {
      swiglu_packed_backward_kernel<T, kVec><<<blocks_for(n / kVec), kThreads, 0, stream>>>(a, n / kVec);
    } else {
      swiglu_packed_forward_kernel<T, kVec><<<blocks_for(n / kVec), kThreads, 0, stream>>>(a, n / kVec);
    }
  } else {
    if constexpr (kBackward) {
      swiglu_packed_backward_kernel<T, 1><<<blocks_for(n), kThreads, 0, stream>>>(a, n);
    } else {
      swiglu_packed_forward_kernel<T, 1><<<blocks_for(n), kThreads, 0, stream>>>(a, n);
    }
  }
}

template <bool kBackward>
bool run_packed(const SwigluPackedArgs& a, void* stream) {
  if (a.rows < 0 || a.width < 0) return false;
  if (a.rows == 0 || a.width == 0) return true;
  if (a.gate_up == nullptr || (kBackward ? a.dout == nullptr || a.dgate_up == nullptr : a.out == nullptr)) return false;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (a.dtype) {
    case ElementDtype::kFloat32: launch_packed<float, kBackward>(a, s); break;
    case ElementDtype::kFloat16: launch_packed<__half, kBackward>(a, s); break;
    case ElementDtype::kBFloat16: launch_packed<__nv_bfloat16, kBackward>(a, s); break;
  }
  return true;
}

}  // namespace

bool swiglu_packed_forward_cuda(const SwigluPackedArgs& a, void* stream) { return run_packed<false>(a, stream); }
bool swiglu_packed_backward_cuda(const SwigluPackedArgs& a, void* stream) { return run_packed<true>(a, stream); }

bool swiglu_forward_cuda(const SwigluArgs& a, void* stream) { return run<false>(a, stream); }
bool swiglu_backward_cuda(const SwigluArgs& a, void* stream) { return run<true>(a, stream); }

}  // namespace colossus::kernels
