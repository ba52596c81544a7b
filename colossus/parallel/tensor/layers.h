// Tensor-parallel replacements for the models' leaf layers: column- and
// row-parallel linear (both nn.Linear's (out, in) and HF Conv1D's (in, out)
// weight layouts), the vocab-parallel embedding and LM head. With sequence
// sharding (split_gather / ring) the activations outside the layers are
// (B, T/tp, C) sequence shards: column-parallel layers and the head gather the
// sequence first, row-parallel layers and the embedding reduce-scatter it
// after (sequence/split_gather.h). Each takes the
// already sliced local parameter tensors, keeps them as the same tensor objects
// (so optimizer handles stay valid) under the same names ("weight", "bias"),
// and does its communication through the autograd functions of comm.h.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/models/fp8_linear.h"
#include "colossus/models/layers.h"
#include "colossus/parallel/sequence/split_gather.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace colossus::parallel::tensor {

using sequence::SequenceSharding;

// How a linear layer stores its weight.
enum class WeightLayout { OutIn, InOut };  // nn.Linear (out, in); HF Conv1D (in, out)

struct ColumnParallelOptions {
  WeightLayout layout = WeightLayout::OutIn;
  bool gather_output = false;  // all-gather the output features (replicated output)
  // Replicated key/value heads (kv heads < tp): this rank's replica set and the
  // number of sets; gradients are summed within a set. slots == 0: not replicated.
  int64_t replica_slot = 0;
  int64_t replica_slots = 0;
  // Not None: the input is this rank's (B, T/tp, in) sequence shard, gathered
  // along the sequence before the matmul (gather_output is then refused).
  SequenceSharding sequence = SequenceSharding::None;
  // The local matmul in FP8 (models::fp8_linear: this rank's x and W shard
  // scaled on their own); not with ring sequence parallelism, whose matmul is
  // fused with its communication.
  std::optional<models::Fp8Recipe> fp8 = std::nullopt;
};

// y = x W_local^T + b_local: each rank computes out/tp of the output features.
class ColumnParallelLinear : public models::Layer {
 public:
  // weight: local (out/tp, in) for OutIn or (in, out/tp) for InOut; bias: (out/tp) or undefined.
  ColumnParallelLinear(at::Tensor weight, at::Tensor bias, cluster::ProcessGroupPtr group,
                       ColumnParallelOptions options);
  // x: (..., in) replicated -> (..., out/tp), or (..., out) with gather_output.
  // With sequence sharding: x (B, T/tp, in) -> (B, T, out/tp).
  at::Tensor forward(const at::Tensor& x) override;
  const ColumnParallelOptions& options() const { return options_; }
  at::Tensor weight;
  at::Tensor bias;

 private:
  cluster::ProcessGroupPtr group_;
  ColumnParallelOptions options_;
  std::shared_ptr<models::Fp8AmaxHistory> fp8_history_ = std::make_shared<models::Fp8AmaxHistory>();
};

struct RowParallelOptions {
  WeightLayout layout = WeightLayout::OutIn;
  bool input_is_parallel = true;  // false: the input is replicated and is split here first
  // Not None: the partial sums are reduce-scattered along the sequence, so the
  // output is this rank's (B, T/tp, out) shard (the bias is added to it).
  SequenceSharding sequence = SequenceSharding::None;
  std::optional<models::Fp8Recipe> fp8 = std::nullopt;  // as ColumnParallelOptions::fp8
};

// y = all_reduce(x_local W_local^T) + b: each rank holds in/tp input features.
class RowParallelLinear : public models::Layer {
 public:
  // weight: local (out, in/tp) for OutIn or (in/tp, out) for InOut; bias: full (out), replicated, or undefined.
  RowParallelLinear(at::Tensor weight, at::Tensor bias, cluster::ProcessGroupPtr group, RowParallelOptions options);
  // x: (..., in/tp) (or (..., in) without input_is_parallel) -> (..., out) replicated.
  // With sequence sharding: x (B, T, in/tp) -> (B, T/tp, out).
  at::Tensor forward(const at::Tensor& x) override;
  const RowParallelOptions& options() const { return options_; }
  at::Tensor weight;
  at::Tensor bias;

 private:
  cluster::ProcessGroupPtr group_;
  RowParallelOptions options_;
  std::shared_ptr<models::Fp8AmaxHistory> fp8_history_ = std::make_shared<models::Fp8AmaxHistory>();
};

// Each rank holds rows [vocab_start, vocab_start + local_rows) of the (padded)
// table; ids outside it give zeros and the all-reduce fills them in. It is an
// models::Embedding so that a tied head reads this shard as `embedding().weight`.
class VocabParallelEmbedding : public models::Embedding {
 public:
  // weight: (V_padded/tp, C); padding_idx is a global row (HF's pad token) or none.
  // sharding != None: the output is reduce-scattered along the sequence.
  VocabParallelEmbedding(at::Tensor weight, int64_t vocab_start, std::optional<int64_t> padding_idx,
                         cluster::ProcessGroupPtr group, SequenceSharding sharding = SequenceSharding::None);
  // ids: (B, T) int64 in [0, V) -> (B, T, C) replicated, or this rank's
  // (B, T/tp, C) shard with sequence sharding.
  at::Tensor forward(const at::Tensor& ids) override;
  int64_t vocab_start() const { return vocab_start_; }

 private:
  int64_t vocab_start_;
  cluster::ProcessGroupPtr group_;
  SequenceSharding sequence_;
};

// The LM head: hidden (replicated) -> this rank's slice of the (padded) vocab
// logits. The vocab-parallel cross-entropy consumes them without a gather.
class VocabParallelHead : public models::Layer {
 public:
  // weight: (V_padded/tp, C).
  VocabParallelHead(at::Tensor weight, cluster::ProcessGroupPtr group,
                    SequenceSharding sharding = SequenceSharding::None);
  // hidden: (B, T, C) -> logits (B, T, V_padded/tp); with sequence sharding
  // hidden is the (B, T/tp, C) shard and the logits cover all T tokens.
  at::Tensor forward(const at::Tensor& hidden) override;
  at::Tensor weight;

 private:
  cluster::ProcessGroupPtr group_;
  SequenceSharding sequence_;
};

// The head computation shared by VocabParallelHead and a tied head (which uses
// the embedding's shard). hidden: (B, T, C), weight: (V_padded/tp, C) -> (B, T, V_padded/tp);
// with sequence sharding hidden is (B, T/tp, C).
at::Tensor vocab_parallel_logits(const at::Tensor& hidden, const at::Tensor& weight, cluster::ProcessGroup& group,
                                 SequenceSharding sharding = SequenceSharding::None);

}  // namespace colossus::parallel::tensor
