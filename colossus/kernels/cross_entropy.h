// Cross-entropy over rows of logits, with the gradient written in place: the
// row kernel of the fused LM head + loss (colossus/models/linear_cross_entropy.h),
// which runs it on one chunk of tokens' logits at a time so the full
// (tokens, vocab) logits and their fp32 copies never exist. Raw pointers only;
// the reference path (ATen ops, any device) is in linear_cross_entropy.cpp.
#pragma once
#include <cstdint>

namespace colossus::kernels {

enum class LogitsDtype : int32_t { kFloat32, kFloat16, kBFloat16 };

// logits: (rows, ld) row-major; columns [0, vocab) are the classes, columns
// [vocab, ld) padding (ignored, and written as 0 when write_grad). targets:
// (rows) int64 in [0, vocab) or == ignore_index. Per row r, in fp32:
//   row_loss[r] = logsumexp(logits[r, :vocab]) - logits[r, target]   (0 when ignored)
//   when write_grad: logits[r, c] = (softmax(logits[r, :vocab])[c] - (c == target)) * grad_scale
//                    (the whole row 0 when ignored), rounded to the logits' dtype.
struct CrossEntropyRowsArgs {
  void* logits = nullptr;
  LogitsDtype dtype = LogitsDtype::kBFloat16;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t ld = 0;
  const int64_t* targets = nullptr;
  int64_t ignore_index = -100;
  float grad_scale = 1.0f;
  bool write_grad = true;
  float* row_loss = nullptr;  // (rows) fp32
};

#ifdef COLOSSUS_WITH_CUDA
// One block per row, two passes over the row (online max + sum of exp, then
// the gradient). Returns false, launching nothing, when the arguments are not
// handled (ld not a multiple of 8 elements or a misaligned row start): use the
// reference. Runs on `stream` (a cudaStream_t), asynchronously.
bool cross_entropy_rows_cuda(const CrossEntropyRowsArgs& args, void* stream);
#endif

}  // namespace colossus::kernels
