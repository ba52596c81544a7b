// FP8 quantisation of a matmul operand in two passes over it: the largest
// magnitude (of the whole tensor, or of each row), then scale and cast,
// optionally writing the transposed bytes beside (tensorwise). The
// reference is `quantize` in colossus/models/fp8_linear.cpp, six ATen passes
// in fp32; the result is the same to the bit:
//   amax  = max |x|                          (exact)
//   scale = amax > 0 ? amax / fmax : 1       (fp32 division)
//   q     = fp8(clamp(x / scale, -fmax, fmax)), round to nearest even
// fmax: 448 (e4m3fn) or 57344 (e5m2). Raw pointers only.
#pragma once
#include "colossus/kernels/element_dtype.h"

#include <cstdint>

namespace colossus::kernels {

enum class Fp8Format : int32_t { kE4M3, kE5M2 };

struct Fp8QuantizeArgs {
  ElementDtype dtype = ElementDtype::kBFloat16;  // of x
  Fp8Format format = Fp8Format::kE4M3;
  bool rowwise = false;         // one scale per row, else one for the tensor
  int64_t rows = 0, cols = 0;   // x (rows, cols), contiguous
  const void* x = nullptr;
  void* q = nullptr;            // (rows, cols) fp8 bytes, contiguous
  float* scale = nullptr;       // (rows) rowwise, else (1)
  float* amax_scratch = nullptr;  // tensorwise: one fp32 the kernel zeroes and fills
  // Optional, tensorwise only: also the transposed bytes, (cols, rows)
  // contiguous, written by the same pass (the FP8 GEMMs of a backward take
  // each operand in both layouts). Needs rows and cols multiples of 8.
  void* q_t = nullptr;
};

#ifdef COLOSSUS_WITH_CUDA
// Returns false, launching nothing, when an operand is missing or q_t is
// asked for where it is not made (rowwise, rows or cols not a multiple of
// 8, x not 16-byte or q / q_t not 8-byte aligned). Runs on
// `stream` (a cudaStream_t), asynchronously.
bool fp8_quantize_cuda(const Fp8QuantizeArgs& args, void* stream);
#endif

}  // namespace colossus::kernels
