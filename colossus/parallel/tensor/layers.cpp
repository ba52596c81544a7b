#include "colossus/parallel/tensor/layers.h"

#include "colossus/core/errors.h"
#include "colossus/parallel/tensor/comm.h"

#include <ATen/ops/embedding.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <fmt/format.h>

namespace colossus::parallel::tensor {

namespace {

at::Tensor linear_with(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, WeightLayout layout,
                       const std::optional<models::Fp8Recipe>& fp8, models::Fp8AmaxHistory* history) {
  const at::Tensor w = layout == WeightLayout::OutIn ? weight : weight.t();
  return fp8 ? models::fp8_linear(x, w, bias, *fp8, history) : at::linear(x, w, bias);
}

void refuse_fp8_ring(const std::optional<models::Fp8Recipe>& fp8, SequenceSharding sequence, const char* layer) {
  if (fp8 && sequence == SequenceSharding::Ring) {
    throw ConfigError(fmt::format("{}: FP8 matmuls with ring sequence parallelism are not supported (the ring fuses "
                                  "its matmul with its communication); use sp_mode split_gather, or drop use_fp8",
                                  layer));
  }
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(at::Tensor weight_, at::Tensor bias_, cluster::ProcessGroupPtr group,
                                           ColumnParallelOptions options)
    : Layer("ColumnParallelLinear"), group_(std::move(group)), options_(options) {
  refuse_fp8_ring(options_.fp8, options_.sequence, "ColumnParallelLinear");
  weight = register_parameter("weight", std::move(weight_));
  if (bias_.defined()) bias = register_parameter("bias", std::move(bias_));
}

at::Tensor ColumnParallelLinear::forward(const at::Tensor& x) {
  at::Tensor w = weight, b = bias;
  if (options_.replica_slots > 0) {
    w = sum_replica_grads(w, options_.replica_slot, options_.replica_slots, *group_);
    if (b.defined()) b = sum_replica_grads(b, options_.replica_slot, options_.replica_slots, *group_);
  }
  at::Tensor y;
  switch (options_.sequence) {
    case SequenceSharding::None:
      y = linear_with(copy_to_region(x, *group_), w, b, options_.layout, options_.fp8, fp8_history_.get());
      break;
    case SequenceSharding::SplitGather:
      y = linear_with(sequence::gather_sequence(x, *group_), w, b, options_.layout, options_.fp8, fp8_history_.get());
      break;
    case SequenceSharding::Ring:
      y = sequence::ring_gather_linear(x, options_.layout == WeightLayout::OutIn ? w : w.t(), b, *group_);
      break;
  }
  return options_.gather_output ? gather_last_dim(y, *group_) : y;
}

RowParallelLinear::RowParallelLinear(at::Tensor weight_, at::Tensor bias_, cluster::ProcessGroupPtr group,
                                     RowParallelOptions options)
    : Layer("RowParallelLinear"), group_(std::move(group)), options_(options) {
  refuse_fp8_ring(options_.fp8, options_.sequence, "RowParallelLinear");
  weight = register_parameter("weight", std::move(weight_));
  if (bias_.defined()) bias = register_parameter("bias", std::move(bias_));
}

at::Tensor RowParallelLinear::forward(const at::Tensor& x) {
  at::Tensor local = options_.input_is_parallel ? x : scatter_last_dim(x, *group_);
  // The bias is added once, after the sum, not on every rank. On a sequence
  // shard each rank's bias gradient covers only its tokens; the plugin sums
  // such gradients over tp.
  at::Tensor y;
  switch (options_.sequence) {
    case SequenceSharding::None:
      y = reduce_from_region(
          linear_with(local, weight, at::Tensor(), options_.layout, options_.fp8, fp8_history_.get()), *group_);
      break;
    case SequenceSharding::SplitGather:
      y = sequence::reduce_scatter_sequence(
          linear_with(local, weight, at::Tensor(), options_.layout, options_.fp8, fp8_history_.get()), *group_);
      break;
    case SequenceSharding::Ring:
      y = sequence::ring_linear_reduce_scatter(local, options_.layout == WeightLayout::OutIn ? weight : weight.t(),
                                               *group_);
      break;
  }
  return bias.defined() ? y + bias : y;
}

VocabParallelEmbedding::VocabParallelEmbedding(at::Tensor weight_, int64_t vocab_start,
                                               std::optional<int64_t> padding_idx_, cluster::ProcessGroupPtr group,
                                               SequenceSharding sharding)
    : models::Embedding(0, weight_.size(1), padding_idx_, weight_.options().device(c10::kMeta)),
      vocab_start_(vocab_start),
      group_(std::move(group)),
      sequence_(sharding) {
  // Adopt the given tensor object as "weight" (the base class registered a
  // meta placeholder), so handles held elsewhere keep pointing at the parameter.
  weight_.set_requires_grad(true);
  parameters_["weight"] = weight_;
  weight = std::move(weight_);
}

at::Tensor VocabParallelEmbedding::forward(const at::Tensor& ids) {
  const int64_t rows = weight.size(0);
  at::Tensor outside = (ids < vocab_start_).logical_or(ids >= vocab_start_ + rows);
  at::Tensor local_ids = at::where(outside, at::zeros_like(ids), ids - vocab_start_);
  int64_t local_padding = -1;
  if (padding_idx && *padding_idx >= vocab_start_ && *padding_idx < vocab_start_ + rows) {
    local_padding = *padding_idx - vocab_start_;
  }
  at::Tensor out = at::embedding(weight, local_ids, local_padding);
  // Rows of other ranks' tokens: zero here (and zero gradient for row 0).
  out = out.masked_fill(outside.unsqueeze(-1), 0.0);
  // A gather is no matmul to overlap with: ring mode reduce-scatters in one go too.
  if (sequence_ != SequenceSharding::None) return sequence::reduce_scatter_sequence(out, *group_);
  return reduce_from_region(out, *group_);
}

VocabParallelHead::VocabParallelHead(at::Tensor weight_, cluster::ProcessGroupPtr group, SequenceSharding sharding)
    : Layer("VocabParallelHead"), group_(std::move(group)), sequence_(sharding) {
  weight = register_parameter("weight", std::move(weight_));
}

at::Tensor VocabParallelHead::forward(const at::Tensor& hidden) {
  return vocab_parallel_logits(hidden, weight, *group_, sequence_);
}

at::Tensor vocab_parallel_logits(const at::Tensor& hidden, const at::Tensor& weight, cluster::ProcessGroup& group,
                                 SequenceSharding sharding) {
  switch (sharding) {
    case SequenceSharding::None:
      break;
    case SequenceSharding::SplitGather:
      return at::linear(sequence::gather_sequence(hidden, group), weight);
    case SequenceSharding::Ring:
      return sequence::ring_gather_linear(hidden, weight, at::Tensor(), group);
  }
  return at::linear(copy_to_region(hidden, group), weight);
}

}  // namespace colossus::parallel::tensor
