// Dense matrix-vector products for decode: y (rows, out) = x (rows, in) @ W^T
// for a handful of rows (one per sequence of a small decode batch), where a
// GEMM library's tiles sit mostly idle and the step is bound by streaming W
// once. A group of 1, 2 or 4 warps owns two output features and splits their
// weight rows' K between its warps, reading them with 16-byte loads; fp32
// sums, one rounding per output. Two epilogues save a
// kernel each in a decoder layer:
//   residual: y = x @ W^T + residual (the down / output projection and the
//             residual add; y may be the residual itself);
//   gated:    W holds 2F rows (a merged gate/up projection) and
//             y (rows, F) = silu(x @ W[:F]^T) * (x @ W[F:]^T), SwiGLU with
//             one rounding.
// Raw pointers only; the reference is at::linear (+ the epilogue in fp32).
#pragma once
#include "colossus/kernels/element_dtype.h"

#include <cstdint>

namespace colossus::kernels {

inline constexpr int64_t kGemvMaxRows = 8;

enum class GemvEpilogue : int32_t { kNone, kResidual, kGated };

// x (rows, in), W (out, in), y and residual (rows, out or F), bias (out) or
// null; all contiguous, one dtype, 16-byte aligned; in % 8 == 0 (16 bytes of
// bf16/fp16). fp32 is not taken (the decode weights are 16-bit).
struct GemvArgs {
  ElementDtype dtype = ElementDtype::kBFloat16;
  GemvEpilogue epilogue = GemvEpilogue::kNone;
  int64_t rows = 0, in_features = 0, out_features = 0;  // out_features: W's rows
  const void* x = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;      // kNone only
  const void* residual = nullptr;  // kResidual
  void* y = nullptr;
  // Warps sharing one output group's `in` (1, 2 or 4); 0 picks it from the
  // shape (gemv_k_split). Set only to test or time a split.
  int32_t k_split = 0;
};

// Output groups: feature pairs (the gated form: one feature and its partner).
inline int64_t gemv_groups(const GemvArgs& a) {
  return a.epilogue == GemvEpilogue::kGated ? a.out_features / 2 : (a.out_features + 1) / 2;
}

// Narrow projections split `in` over 2 or 4 warps so that the launch has
// about 4,096 warps or more (an H100/H200 holds 64 a multiprocessor), as
// long as each warp keeps at least 64 chunks of 16 bytes (2 a lane).
inline int32_t gemv_k_split(const GemvArgs& a) {
  if (a.k_split != 0) return a.k_split;
  const int64_t groups = gemv_groups(a), chunks = a.in_features / 8;
  int32_t split = 1;
  while (split < 4 && groups * split < 4096 && chunks / (split * 2) >= 64) split *= 2;
  return split;
}

// Whether the kernel takes these arguments (sizes, dtype, alignment).
inline bool gemv_supported(const GemvArgs& a) {
  if (a.dtype == ElementDtype::kFloat32 || a.rows < 1 || a.rows > kGemvMaxRows || a.in_features < 8 ||
      a.in_features % 8 != 0 || a.out_features < 1 || a.x == nullptr || a.weight == nullptr || a.y == nullptr) {
    return false;
  }
  if (a.epilogue == GemvEpilogue::kGated && a.out_features % 2 != 0) return false;
  if (a.epilogue == GemvEpilogue::kResidual && a.residual == nullptr) return false;
  if (a.epilogue != GemvEpilogue::kNone && a.bias != nullptr) return false;
  if (a.k_split != 0 && a.k_split != 1 && a.k_split != 2 && a.k_split != 4) return false;
  return aligned16(a.x) && aligned16(a.weight);
}

#ifdef COLOSSUS_WITH_CUDA
// On `stream` (a cudaStream_t), asynchronously. False, launching nothing,
// when gemv_supported is false.
bool gemv_cuda(const GemvArgs& args, void* stream);
#endif

}  // namespace colossus::kernels
