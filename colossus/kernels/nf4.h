// QLoRA's NF4 weights (colossus/lora/nf4.h stores them as bitsandbytes does)
// read straight from their packed form on CUDA: a one-pass dequantisation and
// a small-batch matmul that dequantises on the fly. Raw pointers only; the
// reference is `lora::dequantize_nf4` (ATen ops) and at::linear on its output.
#pragma once
#include "colossus/kernels/element_dtype.h"

#include <cstdint>

namespace colossus::kernels {

// An NF4 weight of numel = out_features * in_features values, row-major
// (out, in) for the matmul; flat for the dequantisation. Value e is
//   code[nibble(e)] * absmax(e / blocksize)
// where nibble(e) is the high half of packed[e / 2] for even e and the low
// half for odd e, and with double quantisation block b's absmax is
//   dynamic_map[absmax_codes[b]] * absmax_scale[b / 256] + offset
// (fp32, one rounding per operation in that order, as the ATen reference).
struct Nf4WeightPtrs {
  const uint8_t* packed = nullptr;       // (ceil(numel / 2))
  const void* absmax = nullptr;          // (blocks) fp32, or uint8 codes with double_quant
  const float* absmax_scale = nullptr;   // double_quant: (ceil(blocks / 256))
  float offset = 0.f;                    // double_quant: added to every block's absmax
  const float* code = nullptr;           // (16) the NF4 code book
  const float* dynamic_map = nullptr;    // double_quant: (256) bitsandbytes' dynamic map
  int64_t out_features = 0;
  int64_t in_features = 0;
  int64_t blocksize = 64;  // a power of two in [16, 4096]
  bool double_quant = true;
};

// out (numel) in `dtype`: the products in fp32, then one rounding to dtype,
// bit-identical to lora::dequantize_nf4.
struct Nf4DequantizeArgs {
  Nf4WeightPtrs weight;
  ElementDtype dtype = ElementDtype::kBFloat16;
  void* out = nullptr;
};

// y (rows, out) = x (rows, in) @ W^T + bias, for 1 <= rows <= kNf4GemvMaxRows.
// W's values are rounded to `dtype` first (the weight at::linear would see
// after dequantize_nf4), the sums are fp32, y is rounded once. x, bias and y
// share `dtype`; bias (out) may be null.
struct Nf4GemvArgs {
  Nf4WeightPtrs weight;
  ElementDtype dtype = ElementDtype::kBFloat16;
  int64_t rows = 0;
  const void* x = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;
};

// The decode / small-batch case: above it a dequantised weight and a GEMM win.
inline constexpr int64_t kNf4GemvMaxRows = 8;

#ifdef COLOSSUS_WITH_CUDA
// Run on `stream` (a cudaStream_t), asynchronously. Return false, launching
// nothing, when an operand is missing or a size is out of range. Vector loads
// and stores where the pointers and in_features allow, element by element
// otherwise.
bool nf4_dequantize_cuda(const Nf4DequantizeArgs& args, void* stream);
bool nf4_gemv_cuda(const Nf4GemvArgs& args, void* stream);
#endif

}  // namespace colossus::kernels
