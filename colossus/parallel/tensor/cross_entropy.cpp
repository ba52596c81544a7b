#include "colossus/parallel/tensor/cross_entropy.h"

#include "colossus/core/errors.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <limits>

namespace colossus::parallel::tensor {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kIgnoreIndex = -100;

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  // logits: (N, V_local), targets: (N) -> losses (N) fp32.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local_logits, const at::Tensor& targets,
                            int64_t vocab_start, int64_t true_vocab, cluster::ProcessGroup* group) {
    const int64_t local_vocab = local_logits.size(1);
    at::Tensor logits = local_logits.to(at::kFloat);
    // Padding columns take no probability mass.
    at::Tensor columns = at::arange(vocab_start, vocab_start + local_vocab, targets.options());
    at::Tensor padded = columns >= true_vocab;
    if (vocab_start + local_vocab > true_vocab) {
      logits = logits.masked_fill(padded.unsqueeze(0), -std::numeric_limits<float>::infinity());
    }
    at::Tensor max = std::get<0>(logits.max(-1));  // (N)
    if (group->size() > 1) group->all_reduce(max, cluster::ReduceOp::Max).wait();
    at::Tensor shifted = logits - max.unsqueeze(-1);
    at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(-1);
    // The target's (shifted) logit lives on one rank; the others add zero.
    at::Tensor valid = targets != kIgnoreIndex;
    at::Tensor mine = valid.logical_and(targets >= vocab_start).logical_and(targets < vocab_start + local_vocab);
    at::Tensor local_target = at::where(mine, targets - vocab_start, at::zeros_like(targets));
    at::Tensor target_logit =
        shifted.gather(1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(mine.logical_not(), 0.0);
    if (group->size() > 1) {
      // One all-reduce for both sums: (2, N).
      at::Tensor both = at::stack({sum_exp, target_logit});
      group->all_reduce(both).wait();
      sum_exp = both[0];
      target_logit = both[1];
    }
    at::Tensor loss = (sum_exp.log() - target_logit).masked_fill(valid.logical_not(), 0.0);
    at::Tensor softmax = exp.div_(sum_exp.unsqueeze(-1));
    ctx->save_for_backward({softmax, local_target, mine, valid});
    ctx->saved_data["dtype"] = static_cast<int64_t>(local_logits.scalar_type());
    return loss;
  }

  // d loss_n / d logit_nj = softmax_nj - [j is n's target], scaled by grad_n.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();
    const at::Tensor& local_target = saved[1];
    const at::Tensor& mine = saved[2];
    const at::Tensor& valid = saved[3];
    grad.scatter_add_(1, local_target.unsqueeze(-1), -mine.to(grad.scalar_type()).unsqueeze(-1));
    at::Tensor scale = grads[0].to(at::kFloat).masked_fill(valid.logical_not(), 0.0);
    grad.mul_(scale.unsqueeze(-1));
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets,
                                        const VocabShard& shard, cluster::ProcessGroup& group) {
  if (local_logits.dim() != 2 || targets.dim() != 1 || local_logits.size(0) != targets.size(0)) {
    throw ConfigError(
        fmt::format("vocab_parallel_cross_entropy needs logits (N, V_local) and targets (N); got {} and {}",
                    c10::str(local_logits.sizes()), c10::str(targets.sizes())));
  }
  return VocabParallelCrossEntropy::apply(local_logits, targets, shard.vocab_start, shard.true_vocab, &group);
}

at::Tensor vocab_parallel_causal_lm_loss(const at::Tensor& local_logits, const at::Tensor& labels,
                                         const VocabShard& shard, cluster::ProcessGroup& group,
                                         std::optional<int64_t> num_items) {
  if (local_logits.dim() != 3 || labels.dim() != 2 || local_logits.size(0) != labels.size(0) ||
      local_logits.size(1) != labels.size(1) || labels.scalar_type() != at::kLong) {
    throw ConfigError(
        fmt::format("vocab-parallel causal LM loss needs logits (B, T, V_local) and int64 labels (B, T); "
                    "got {} and {} {}",
                    c10::str(local_logits.sizes()), c10::toString(labels.scalar_type()), c10::str(labels.sizes())));
  }
  if (num_items && *num_items <= 0)
    throw ConfigError(fmt::format("causal LM loss: num_items is {} but must be > 0", *num_items));
  // Position t predicts token t+1, as models::causal_lm_loss.
  at::Tensor pad = at::full({labels.size(0), 1}, kIgnoreIndex, labels.options());
  at::Tensor targets = at::cat({labels.narrow(1, 1, labels.size(1) - 1), pad}, 1).reshape(-1);
  at::Tensor losses =
      vocab_parallel_cross_entropy(local_logits.reshape({-1, local_logits.size(2)}), targets, shard, group);
  if (num_items) return losses.sum() / static_cast<double>(*num_items);
  // cross_entropy's mean: over counted tokens (NaN when there are none, as torch).
  return losses.sum() / (targets != kIgnoreIndex).sum().to(at::kFloat);
}

}  // namespace colossus::parallel::tensor
