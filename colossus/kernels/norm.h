// Fused RMSNorm (LLaMA) and LayerNorm (GPT-2), forward and backward, each with
// an optional residual add in front: s = x + residual (rounded to the dtype,
// as the unfused `hidden + attn` is), y = norm(s) * weight (+ bias). fp32
// statistics and accumulation for fp32/fp16/bf16 tensors. Raw pointers only;
// the reference is the ATen code of colossus/models/layers.cpp (RMSNorm,
// LayerNorm), which the models run on CPU and when these kernels do not apply.
#pragma once
#include "colossus/kernels/element_dtype.h"

#include <algorithm>
#include <cstdint>

namespace colossus::kernels {

enum class NormKind : int32_t { kRms, kLayer };

// All (rows, cols) tensors row-major and contiguous, one dtype for every
// non-fp32 pointer (x, residual, weight, bias, y, residual_out).
//   kRms:   y = dtype(dtype(s * rstd) * weight), rstd = 1 / sqrt(mean(s^2) + eps)
//           (HF's rounding: the normalised value rounds once before the scale)
//   kLayer: y = dtype((s - mean) * rstd * weight + bias), rstd = 1 / sqrt(var(s) + eps)
struct NormForwardArgs {
  NormKind kind = NormKind::kRms;
  ElementDtype dtype = ElementDtype::kBFloat16;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* x = nullptr;         // (rows, cols)
  const void* residual = nullptr;  // (rows, cols), or null: s = x
  const void* weight = nullptr;    // (cols)
  const void* bias = nullptr;      // (cols), kLayer only; null: no bias
  float eps = 1e-6f;
  void* y = nullptr;             // (rows, cols)
  void* residual_out = nullptr;  // (rows, cols) = s; needed when residual is given
  float* mean = nullptr;         // (rows) fp32, kLayer only
  float* rstd = nullptr;         // (rows) fp32
};

// Gradients of the forward above. s is the forward's normalised input
// (residual_out when there was a residual, else x); dx is the gradient of
// both x and residual (they are summed), plus dresidual_out when given.
// dweight (and dbias) sum over rows in two stages: each of
// norm_partial_blocks(rows) blocks sums its rows into a row of `partial`
// (fp32), then one pass adds those rows up in a fixed order (deterministic,
// no atomics) and rounds once to the dtype.
struct NormBackwardArgs {
  NormKind kind = NormKind::kRms;
  ElementDtype dtype = ElementDtype::kBFloat16;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* dy = nullptr;             // (rows, cols)
  const void* dresidual_out = nullptr;  // (rows, cols), or null
  const void* s = nullptr;              // (rows, cols)
  const void* weight = nullptr;         // (cols)
  const float* mean = nullptr;          // (rows), kLayer only
  const float* rstd = nullptr;          // (rows)
  void* dx = nullptr;                   // (rows, cols)
  void* dweight = nullptr;              // (cols)
  void* dbias = nullptr;                // (cols), kLayer only; null: not computed
  float* partial = nullptr;             // norm_backward_workspace_floats(kind, rows, cols) fp32
};

// 16 rows a block: enough blocks to fill a GPU on a training step's 8-16K
// rows, at most 1024 partial rows (8 MB of fp32 at 2048 columns) to add up.
inline int64_t norm_partial_blocks(int64_t rows) { return std::clamp<int64_t>((rows + 15) / 16, 1, 1024); }
inline int64_t norm_backward_workspace_floats(NormKind kind, int64_t rows, int64_t cols) {
  return norm_partial_blocks(rows) * cols * (kind == NormKind::kLayer ? 2 : 1);
}

// Whether the kernels take rows of `cols` elements of `dtype`: a whole number
// of 16-byte vectors, at most 8 of them per thread of a 256-thread block,
// and the backward's per-block sums (cols fp32, twice for kLayer) within 48 KB
// of shared memory. Pointers must also be 16-byte aligned.
inline bool norm_cols_supported(NormKind kind, ElementDtype dtype, int64_t cols) {
  const int64_t vec = vector_elements(dtype);
  const int64_t partial_bytes = cols * 4 * (kind == NormKind::kLayer ? 2 : 1);
  return cols > 0 && cols % vec == 0 && cols / vec <= 256 * 8 && partial_bytes <= 48 * 1024;
}

#ifdef COLOSSUS_WITH_CUDA
// Forward: one block per row, the row held in registers. Backward: a grid of
// norm_partial_blocks(rows) blocks striding over the rows, then a column-sum
// kernel for dweight/dbias. Both return false, launching nothing, when the
// arguments are not handled (norm_cols_supported, alignment): use the
// reference. Run on `stream` (a cudaStream_t), asynchronously.
bool norm_forward_cuda(const NormForwardArgs& args, void* stream);
bool norm_backward_cuda(const NormBackwardArgs& args, void* stream);
#endif

}  // namespace colossus::kernels
