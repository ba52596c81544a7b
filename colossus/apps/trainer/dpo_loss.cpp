#include "colossus/apps/trainer/dpo_loss.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace colossus::apps {

void DpoOptions::validate() const {
  if (!(beta > 0.0)) throw ConfigError(fmt::format("dpo.beta = {} must be > 0 (TRL's default: 0.1)", beta));
  if (loss_type != "sigmoid" && loss_type != "ipo" && loss_type != "hinge" && loss_type != "robust")
    throw ConfigError(fmt::format("dpo.loss_type = \"{}\" is unknown; valid: sigmoid, ipo, hinge, robust", loss_type));
  if (loss_type == "robust" && !(label_smoothing >= 0.0 && label_smoothing < 0.5))
    throw ConfigError(fmt::format("dpo.label_smoothing = {} must be in [0, 0.5) for loss_type robust", label_smoothing));
  if (loss_type != "robust" && label_smoothing != 0.0)
    throw ConfigError(fmt::format("dpo.label_smoothing = {} applies to loss_type \"robust\" only (as in TRL); set it "
                                  "to 0 or use loss_type = \"robust\"",
                                  label_smoothing));
}

namespace {

// (B, T-1) fp32: each target's log-probability, 0 where there is none.
at::Tensor target_logps(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t t = logits.size(1);
  const at::Tensor targets = labels.slice(1, 1, t);                      // (B, T-1)
  const at::Tensor mask = targets.ne(-100);
  const at::Tensor log_probs = logits.slice(1, 0, t - 1).to(at::kFloat).log_softmax(-1);  // (B, T-1, V)
  const at::Tensor picked = log_probs.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1);
  return picked * mask;
}

// Per-target values (B, T-1) (zero where no target) summed into their examples.
at::Tensor sum_per_example(const at::Tensor& values, const at::Tensor& example_ids, int64_t examples) {
  const at::Tensor owner = example_ids.slice(1, 1, example_ids.size(1)).clamp_min(0).reshape({-1});
  return at::zeros({examples}, values.options()).index_add(0, owner, values.reshape({-1}));
}

}  // namespace

at::Tensor sequence_logps(const at::Tensor& logits, const at::Tensor& labels) {
  return target_logps(logits, labels).sum(1);
}

at::Tensor example_logps(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& example_ids,
                         int64_t examples) {
  return sum_per_example(target_logps(logits, labels), example_ids.to(logits.device()), examples);
}

at::Tensor example_target_counts(const at::Tensor& labels, const at::Tensor& example_ids, int64_t examples) {
  const at::Tensor mask = labels.slice(1, 1, labels.size(1)).ne(-100).to(at::kFloat);
  return sum_per_example(mask, example_ids.to(labels.device()), examples);
}

DpoLoss dpo_loss(const at::Tensor& policy_chosen, const at::Tensor& policy_rejected, const at::Tensor& ref_chosen,
                 const at::Tensor& ref_rejected, const at::Tensor& chosen_tokens, const at::Tensor& rejected_tokens,
                 const DpoOptions& options) {
  const at::Tensor chosen_logratios = policy_chosen - ref_chosen;
  const at::Tensor rejected_logratios = policy_rejected - ref_rejected;
  const at::Tensor delta = chosen_logratios - rejected_logratios;
  const double beta = options.beta;
  at::Tensor per_pair;
  if (options.loss_type == "sigmoid") {
    per_pair = -at::log_sigmoid(beta * delta);
  } else if (options.loss_type == "hinge") {
    per_pair = at::relu(1.0 - beta * delta);
  } else if (options.loss_type == "ipo") {
    // Log-ratios averaged per completion token, so beta does not scale with length (TRL, with the IPO authors).
    const at::Tensor ipo_delta = chosen_logratios / chosen_tokens.clamp_min(1.0) -
                                 rejected_logratios / rejected_tokens.clamp_min(1.0);
    per_pair = (ipo_delta - 1.0 / (2.0 * beta)).pow(2);
  } else {  // robust: unbiased under a label_smoothing share of flipped preferences
    const double eps = options.label_smoothing;
    per_pair = (-(1.0 - eps) * at::log_sigmoid(beta * delta) + eps * at::log_sigmoid(-beta * delta)) / (1.0 - 2.0 * eps);
  }
  return {.loss = per_pair.mean(),
          .chosen_rewards = beta * chosen_logratios.detach(),
          .rejected_rewards = beta * rejected_logratios.detach()};
}

}  // namespace colossus::apps
