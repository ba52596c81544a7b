// Fused rotary position embedding (HF's rotate_half convention) on the
// projections' contiguous (B, T, H, D) layout, q and k in one launch, and its
// backward (the transposed rotation). Raw pointers only; the reference is
// apply_rope in colossus/models/rope.cpp (ATen).
#pragma once
#include "colossus/kernels/element_dtype.h"

#include <cstdint>

namespace colossus::kernels {

// q: (batch, seq, q_heads, head_dim), k: (batch, seq, k_heads, head_dim),
// cos/sin: (seq, head_dim), all contiguous, one dtype. With h = head_dim / 2
// and i < h, per (b, t, head), in fp32 with one rounding:
//   forward:  out[i]     = x[i] * cos[t, i]         - x[i + h] * sin[t, i]
//             out[i + h] = x[i + h] * cos[t, i + h] + x[i] * sin[t, i + h]
//   backward (x the output's gradient, out the input's):
//             out[i]     = x[i] * cos[t, i]         + x[i + h] * sin[t, i + h]
//             out[i + h] = x[i + h] * cos[t, i + h] - x[i] * sin[t, i]
// k may be absent (k_heads 0, null pointers). Outputs must not alias inputs.
// q_row_stride / k_row_stride: elements from one (b, t) row of the input q /
// k to the next (0: contiguous, heads * head_dim), so the forward can read q
// and k in place from a merged q/k/v projection (b, t, q|k|v); the outputs
// are contiguous.
struct RopeArgs {
  ElementDtype dtype = ElementDtype::kBFloat16;
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t head_dim = 0;
  const void* q = nullptr;
  void* q_out = nullptr;
  int64_t q_heads = 0;
  const void* k = nullptr;
  void* k_out = nullptr;
  int64_t k_heads = 0;
  int64_t q_row_stride = 0;
  int64_t k_row_stride = 0;
  const void* cos = nullptr;
  const void* sin = nullptr;
  bool backward = false;
};

// Whether the kernel takes this head_dim: each half a whole number of
// 16-byte vectors. Pointers must also be 16-byte aligned.
inline bool rope_head_dim_supported(ElementDtype dtype, int64_t head_dim) {
  return head_dim > 0 && head_dim % (2 * vector_elements(dtype)) == 0;
}

#ifdef COLOSSUS_WITH_CUDA
// One block per (b, t) row of q and k together; each thread rotates a pair of
// 16-byte vectors (x[i..], x[i+h..]). Returns false, launching nothing, when
// the arguments are not handled: use the reference. Runs on `stream` (a
// cudaStream_t), asynchronously.
bool rope_cuda(const RopeArgs& args, void* stream);
#endif

}  // namespace colossus::kernels
