// Direct preference optimisation as TRL's DPOTrainer computes it: each
// sequence's log-probability of its completion under the policy and under a
// frozen reference, and the pairwise loss of their log-ratios (sigmoid DPO,
// IPO, hinge, robust DPO with label smoothing).
#pragma once
#include "colossus/apps/trainer/dpo_options.h"

#include <ATen/core/Tensor.h>

namespace colossus::apps {

// logits (B, T, V), labels (B, T) with -100 where no target (HF convention:
// logits[:, t] predicts labels[:, t + 1]) -> (B,) fp32: the sum of each
// row's target log-probabilities.
at::Tensor sequence_logps(const at::Tensor& logits, const at::Tensor& labels);

// The same per example when rows hold several (packed): example_ids (B, T)
// names each token's example (-1: padding); a target counts for the example
// its token belongs to -> (examples,) fp32 sums of target log-probs.
at::Tensor example_logps(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& example_ids,
                         int64_t examples);
// Target tokens per example -> (examples,) fp32.
at::Tensor example_target_counts(const at::Tensor& labels, const at::Tensor& example_ids, int64_t examples);

struct DpoLoss {
  at::Tensor loss;              // () mean over the pairs
  at::Tensor chosen_rewards;    // (P,) beta * (policy - reference) log-prob of the chosen completion, detached
  at::Tensor rejected_rewards;  // (P,) the same for the rejected one
};

// Per pair p: policy and reference log-probs of the chosen and rejected
// completions (P,) each; chosen_tokens / rejected_tokens (P,) their target
// counts (IPO averages per token).
DpoLoss dpo_loss(const at::Tensor& policy_chosen, const at::Tensor& policy_rejected, const at::Tensor& ref_chosen,
                 const at::Tensor& ref_rejected, const at::Tensor& chosen_tokens, const at::Tensor& rejected_tokens,
                 const DpoOptions& options);

}  // namespace colossus::apps
