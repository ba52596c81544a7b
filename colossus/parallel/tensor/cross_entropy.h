// Cross-entropy over vocab-parallel logits without ever materialising the full
// vocabulary on one rank: local max -> all-reduce MAX, local sum of exp ->
// all-reduce SUM, the target's logit (held by one rank) -> all-reduce SUM. One
// custom autograd function with its own backward (softmax - one-hot, locally).
// Padded vocab columns (make_vocab_size_divisible_by) are masked out.
#pragma once
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace colossus::parallel::tensor {

struct VocabShard {
  int64_t vocab_start = 0;  // global index of this rank's first column
  int64_t true_vocab = 0;   // columns at or past this are padding
};

// local_logits: (N, V_local) any float dtype; targets: (N) int64, -100 ignored.
// Returns per-token losses (N) fp32, 0 where ignored; identical on every rank.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets,
                                        const VocabShard& shard, cluster::ProcessGroup& group);

// models::causal_lm_loss over vocab-parallel logits: labels (B, T) shifted
// inside, -100 ignored, mean over counted tokens or sum / num_items.
// local_logits: (B, T, V_local) -> scalar fp32.
at::Tensor vocab_parallel_causal_lm_loss(const at::Tensor& local_logits, const at::Tensor& labels,
                                         const VocabShard& shard, cluster::ProcessGroup& group,
                                         std::optional<int64_t> num_items = std::nullopt);

}  // namespace colossus::parallel::tensor
