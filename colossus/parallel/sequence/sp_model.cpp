#include "colossus/parallel/sequence/sp_model.h"

#include "colossus/core/errors.h"
#include "colossus/parallel/sequence/ring_attention.h"
#include "colossus/parallel/sequence/ulysses.h"

#include <ATen/core/Reduction.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include <fmt/format.h>

namespace colossus::parallel::sequence {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward: all-reduce (sum) over the sp group. Backward: the gradient times
// sp (see sequence_parallel_causal_lm_loss).
struct SumOverSequence : torch::autograd::Function<SumOverSequence> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, cluster::ProcessGroup *group) {
    ctx->saved_data["sp"] = static_cast<int64_t>(group->size());
    at::Tensor out = x.contiguous().clone();
    group->all_reduce(out).wait();
    return out;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    return {grads[0] * static_cast<double>(ctx->saved_data["sp"].toInt()), at::Tensor()};
  }
};

}  // namespace

SequenceLayout layout_of(SequenceParallelMode mode) {
  return mode == SequenceParallelMode::RingAttention ? SequenceLayout::ZigZag : SequenceLayout::Contiguous;
}

at::Tensor SequenceParallelAttention::attend(int64_t /*layer*/, const at::Tensor &q, const at::Tensor &k,
                                             const at::Tensor &v, const models::AttentionSpec &spec) {
  // Ring and Ulysses attention are causal over the whole sequence: exact for
  // a window only while the sequence fits in it.
  if (!spec.plain_causal_for(seq_len_)) {
    throw ConfigError(fmt::format("sequence parallelism runs full causal attention, but this model's attention has "
                                  "{}; use sp_size = 1{}",
                                  spec.softcap != 0.0 ? fmt::format("soft-capped scores ({})", spec.softcap)
                                                      : fmt::format("a sliding_window of {} over {} tokens",
                                                                    spec.window, seq_len_),
                                  spec.softcap != 0.0 ? "" : fmt::format(" or sequences of at most {} tokens", spec.window)));
  }
  const double scale = spec.scale;
  if (document_mask.defined() && mode_ == SequenceParallelMode::AllToAll) {
    return ulysses_attention(q, k, v, group_, {.causal = false, .scale = scale, .seq_len = seq_len_, .mask = document_mask});
  }
  if (mode_ == SequenceParallelMode::RingAttention) {
    return ring_attention(q, k, v, group_,
                          {.causal = true,
                           .scale = scale,
                           .seq_len = seq_len_,
                           .layout = SequenceLayout::ZigZag,
                           .inner_ring_size = inner_ring_size_,
                           .documents = document_ids});
  }
  return ulysses_attention(q, k, v, group_, {.causal = true, .scale = scale, .seq_len = seq_len_});
}

at::Tensor padded_document_mask(const at::Tensor &mask, int64_t sp) {
  const int64_t seq_len = mask.size(-1), padded = padded_length(seq_len, sp, SequenceLayout::Contiguous);
  if (padded == seq_len) return mask;
  at::Tensor grown = at::eye(padded, mask.options()).expand({mask.size(0), 1, padded, padded}).clone();
  grown.narrow(2, 0, seq_len).narrow(3, 0, seq_len).copy_(mask);
  return grown;
}

at::Tensor local_position_tensor(int64_t seq_len, cluster::ProcessGroup &group, SequenceLayout layout,
                                 c10::Device device) {
  const int64_t sp = group.size();
  std::vector<int64_t> pos = local_positions(padded_length(seq_len, sp, layout) / sp, sp, group.rank(), layout);
  for (int64_t &p : pos) p = std::min(p, seq_len - 1);
  return at::tensor(pos, at::TensorOptions().dtype(at::kLong)).to(device);
}

namespace {

// The full (B, T) tensor shifted one token left (x[:, t + 1] at t, `fill` at
// the end), then this rank's shard of it, with `fill` where the shard pads.
at::Tensor shifted_shard(const at::Tensor &x, int64_t fill, cluster::ProcessGroup &sp_group, SequenceLayout layout) {
  const int64_t b = x.size(0), t = x.size(1);
  at::Tensor shifted = at::cat({x.narrow(1, 1, t - 1), at::full({b, 1}, fill, x.options())}, 1);
  at::Tensor local = shard_sequence(shifted, 1, sp_group.size(), sp_group.rank(), layout);
  if (local.size(1) * sp_group.size() != t) {
    std::vector<int64_t> pos = local_positions(local.size(1), sp_group.size(), sp_group.rank(), layout);
    at::Tensor is_pad = at::tensor(pos, at::TensorOptions().dtype(at::kLong)).to(x.device()) >= t;
    local = local.masked_fill(is_pad.unsqueeze(0), fill);
  }
  return local;
}

}  // namespace

at::Tensor sequence_parallel_example_logps(const at::Tensor &local_logits, const at::Tensor &labels,
                                           const at::Tensor &example_ids, int64_t examples,
                                           cluster::ProcessGroup &sp_group, SequenceLayout layout) {
  const at::Tensor targets = shifted_shard(labels, -100, sp_group, layout);
  const at::Tensor owners = shifted_shard(example_ids.to(labels.device()), -1, sp_group, layout);
  const at::Tensor mask = targets.ne(-100);
  const at::Tensor log_probs = local_logits.to(at::kFloat).log_softmax(-1);
  const at::Tensor picked = log_probs.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) * mask;
  at::Tensor sums = at::zeros({examples}, picked.options())
                        .index_add(0, owners.clamp_min(0).reshape({-1}), picked.reshape({-1}));
  if (sp_group.size() == 1) return sums;
  return SumOverSequence::apply(sums, &sp_group);
}

at::Tensor sequence_parallel_causal_lm_loss(const at::Tensor &local_logits, const at::Tensor &labels,
                                            cluster::ProcessGroup &sp_group, SequenceLayout layout,
                                            const tensor::VocabShard *vocab, cluster::ProcessGroup *tp_group,
                                            std::optional<int64_t> num_items) {
  const int64_t b = labels.size(0), t = labels.size(1);
  // Shift on the full labels, then shard them like the tokens; padding is
  // ignored.
  at::Tensor targets = at::cat({labels.narrow(1, 1, t - 1), at::full({b, 1}, -100, labels.options())}, 1);
  at::Tensor local_targets = shard_sequence(targets, 1, sp_group.size(), sp_group.rank(), layout);
  if (local_targets.size(1) * sp_group.size() != t) {
    // shard_sequence pads with 0: mark padded targets ignored.
    std::vector<int64_t> pos = local_positions(local_targets.size(1), sp_group.size(), sp_group.rank(), layout);
    at::Tensor is_pad = at::tensor(pos, at::TensorOptions().dtype(at::kLong)).to(labels.device()) >= t;
    local_targets = local_targets.masked_fill(is_pad.unsqueeze(0), -100);
  }
  at::Tensor flat_logits = local_logits.reshape({-1, local_logits.size(-1)});
  at::Tensor flat_targets = local_targets.reshape({-1});
  at::Tensor per_token =
      vocab != nullptr
          ? tensor::vocab_parallel_cross_entropy(flat_logits, flat_targets, *vocab, *tp_group)
          : at::cross_entropy_loss(flat_logits.to(at::kFloat), flat_targets, {}, at::Reduction::None, -100);
  at::Tensor denom = num_items ? at::full({}, static_cast<double>(*num_items), per_token.options())
                               : (targets != -100).sum().to(per_token.scalar_type());
  at::Tensor local = per_token.sum() / denom;
  if (sp_group.size() == 1) return local;
  return SumOverSequence::apply(local, &sp_group);
}

}  // namespace colossus::parallel::sequence
