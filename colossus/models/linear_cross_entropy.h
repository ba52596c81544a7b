// The LM head fused with the causal-LM cross-entropy: logits are made, turned
// into their gradient and consumed one chunk of tokens at a time, so the
// (tokens, vocab) logits and their fp32 copies never exist at once and the
// head's three GEMMs run on a vocab padded to a multiple of 64 (cuBLAS has no
// fast kernel for an odd leading dimension such as GPT-2's 50257). The input
// and weight gradients are computed in the forward (the loss is the graph's
// last node) and scaled by the incoming gradient in the backward.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace colossus::models {

struct LinearCrossEntropyOptions {
  int64_t ignore_index = -100;
  int64_t vocab_multiple = 64;           // the head weight is zero-padded to this many rows
  int64_t chunk_bytes = 512LL << 20;     // logits per chunk, in bytes of the hidden dtype
};

// hidden: (N, C), weight: (V, C) (the head, or the tied embedding), targets:
// (N) int64 in [0, V) or ignore_index -> scalar fp32 loss: the sum of the
// counted rows' cross-entropy divided by num_items, or by the number of
// counted rows when num_items is empty (NaN when none counts, as
// at::cross_entropy_loss's mean). Same values as
// cross_entropy(hidden @ weight^T in fp32 ...) up to the logits' rounding to
// the hidden dtype. CUDA uses the fused row kernel (kernels/cross_entropy.h);
// elsewhere the ATen reference per chunk.
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                std::optional<int64_t> num_items = std::nullopt,
                                const LinearCrossEntropyOptions& options = {});

// The causal-LM form: hidden (B, T, C), labels (B, T) shifted inside (position
// t predicts token t+1), as causal_lm_loss(head(hidden), labels, num_items).
at::Tensor causal_lm_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                          std::optional<int64_t> num_items = std::nullopt,
                                          const LinearCrossEntropyOptions& options = {});

// One chunk's rows: logits (rows, ld) whose first `vocab` columns count;
// returns the rows' losses (rows) fp32 and, when write_grad, overwrites the
// logits with (softmax - onehot) * grad_scale (padding columns and ignored
// rows 0). The fused CUDA kernel where it applies, else cross_entropy_rows_reference.
at::Tensor cross_entropy_rows(const at::Tensor& logits, int64_t vocab, const at::Tensor& targets, int64_t ignore_index,
                              double grad_scale, bool write_grad);
// The same in ATen ops (fp32 math), on any device: the reference of the kernel.
at::Tensor cross_entropy_rows_reference(const at::Tensor& logits, int64_t vocab, const at::Tensor& targets,
                                        int64_t ignore_index, double grad_scale, bool write_grad);

}  // namespace colossus::models
