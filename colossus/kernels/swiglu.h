// Fused SwiGLU (LLaMA's MLP): out = silu(gate) * up, and its backward, one
// elementwise kernel each way. Raw pointers only; the reference is
// `at::silu(gate) * up` in colossus/models/llama.cpp (LlamaMLP::forward).
#pragma once
#include "colossus/kernels/element_dtype.h"

#include <cstdint>

namespace colossus::kernels {

// n elements each, contiguous, one dtype; fp32 math, one rounding per output.
//   forward:  out = gate * sigmoid(gate) * up
//   backward: dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))
//             dup   = dout * gate * sigmoid(gate)
struct SwigluArgs {
  ElementDtype dtype = ElementDtype::kBFloat16;
  int64_t n = 0;
  const void* gate = nullptr;
  const void* up = nullptr;
  void* out = nullptr;         // forward
  const void* dout = nullptr;  // backward
  void* dgate = nullptr;       // backward
  void* dup = nullptr;         // backward
};

// The same over a merged gate/up projection's output (one matmul for both):
// gate_up (rows, 2 * width) holds each row's gate then its up, contiguous ->
// out (rows, width) contiguous; the backward takes dout (rows, width) and
// writes dgate_up (rows, 2 * width) in gate_up's layout, so the merged
// projection's backward reads it as it is. The math and rounding above.
struct SwigluPackedArgs {
  ElementDtype dtype = ElementDtype::kBFloat16;
  int64_t rows = 0, width = 0;
  const void* gate_up = nullptr;
  void* out = nullptr;         // forward
  const void* dout = nullptr;  // backward
  void* dgate_up = nullptr;    // backward
};

#ifdef COLOSSUS_WITH_CUDA
// 16-byte vectors when every pointer is 16-byte aligned, element by element
// otherwise. Return false, launching nothing, when an operand is missing.
// Run on `stream` (a cudaStream_t), asynchronously.
bool swiglu_forward_cuda(const SwigluArgs& args, void* stream);
bool swiglu_backward_cuda(const SwigluArgs& args, void* stream);
bool swiglu_packed_forward_cuda(const SwigluPackedArgs& args, void* stream);
bool swiglu_packed_backward_cuda(const SwigluPackedArgs& args, void* stream);
#endif

}  // namespace colossus::kernels
