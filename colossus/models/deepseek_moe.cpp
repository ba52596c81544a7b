#include "colossus/models/deepseek_moe.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/sign.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>

#include <limits>

namespace colossus::models {

namespace {

// An MLP config of width `intermediate` (the experts and the shared MLP
// are LLaMA's SwiGLU MLP with HF's gate/up/down names).
LlamaConfig mlp_config(const DeepseekConfig& config, int64_t intermediate, bool bias) {
  LlamaConfig c = config;
  c.family = "llama";
  c.intermediate_size = intermediate;
  c.mlp_bias = bias;
  return c;
}

// (N, E) scores with the groups outside each token's topk_groups best zeroed
// (fill) by `group_score` ((N, G, E/G) -> (N, G)).
template <class GroupScore>
at::Tensor mask_groups(const at::Tensor& scores, int64_t groups, int64_t keep, double fill, GroupScore group_score) {
  const int64_t n = scores.size(0), e = scores.size(1);
  const at::Tensor grouped = scores.view({n, groups, e / groups});
  const at::Tensor chosen = std::get<1>(at::topk(group_score(grouped), keep, -1, true, false));  // (N, keep)
  const at::Tensor group_mask = at::zeros({n, groups}, scores.options().dtype(at::kBool)).scatter_(1, chosen, true);
  return scores.masked_fill(group_mask.unsqueeze(-1).expand({n, groups, e / groups}).reshape({n, e}).logical_not(), fill);
}

}  // namespace

DeepseekRouter::DeepseekRouter(const DeepseekConfig& config, const at::TensorOptions& options)
    : torch::nn::Module("DeepseekRouter"),
      method_(config.topk_method),
      top_k_(config.num_experts_per_tok),
      groups_(config.n_group.value_or(1)),
      topk_groups_(config.topk_group.value_or(1)),
      norm_topk_prob_(config.norm_topk_prob),
      scaling_(config.routed_scaling_factor) {
  weight = register_parameter("weight", at::empty({config.n_routed_experts, config.hidden_size}, options));
  if (config.is_v3()) {
    e_score_correction_bias =
        register_buffer("e_score_correction_bias", at::zeros({config.n_routed_experts}, options.dtype(at::kFloat)));
  }
}

moe::Routing DeepseekRouter::route(const at::Tensor& x) const {
  // Scores in fp32 whatever the model's dtype, as transformers.
  const at::Tensor logits = at::linear(x.to(at::kFloat), weight.to(at::kFloat));  // (N, E)
  at::Tensor weights, experts;
  if (method_ == "noaux_tc") {
    // Choose by score + bias (groups by the sum of their two best), weigh by score alone.
    const at::Tensor scores = logits.sigmoid();
    at::Tensor choice = scores + e_score_correction_bias.detach();
    choice = mask_groups(choice, groups_, topk_groups_, -std::numeric_limits<double>::infinity(),
                         [](const at::Tensor& g) { return std::get<0>(at::topk(g, 2, -1)).sum(-1); });
    experts = std::get<1>(at::topk(choice, top_k_, -1, true, false));
    weights = scores.gather(1, experts);
    if (norm_topk_prob_) weights = weights / (weights.sum(-1, true) + 1e-20);
  } else {
    at::Tensor scores = logits.softmax(-1);
    if (method_ == "group_limited_greedy") {
      scores = mask_groups(scores, groups_, topk_groups_, 0.0, [](const at::Tensor& g) { return std::get<0>(g.max(-1)); });
    }
    std::tie(weights, experts) = at::topk(scores, top_k_, -1, true, false);
  }
  return moe::Routing{.logits = logits, .weights = weights * scaling_, .experts = experts};
}

DeepseekMoe::DeepseekMoe(const DeepseekConfig& config, const at::TensorOptions& options)
    : LayerHost("DeepseekMoe"), num_experts_(config.n_routed_experts) {
  gate_ = register_module("gate", std::make_shared<DeepseekRouter>(config, options));
  experts_ = register_module("experts", std::make_shared<torch::nn::Module>("Experts"));
  // transformers' routed experts (3D tensors) have no bias; the shared MLP follows mlp_bias.
  const LlamaConfig expert = mlp_config(config, config.moe_intermediate_size, false);
  for (int64_t e = 0; e < num_experts_; ++e) {
    expert_list_.push_back(experts_->register_module(std::to_string(e), std::make_shared<LlamaMLP>(expert, options)));
  }
  shared_ = register_module("shared_experts",
                  std::make_shared<LlamaMLP>(
                      mlp_config(config, config.moe_intermediate_size * config.n_shared_experts, config.mlp_bias), options));
  expert_load_ = at::zeros({num_experts_}, options.dtype(at::kFloat));
}

at::Tensor DeepseekMoe::forward(const at::Tensor& hidden) {
  const at::Tensor x = hidden.reshape({-1, hidden.size(-1)});  // (N, H)
  const moe::Routing routing = gate_->route(x);
  last_router_logits_ = routing.logits;
  const moe::DispatchPlan plan = moe::plan_dispatch(routing, num_experts_);
  if (is_training()) {
    at::NoGradGuard no_grad;
    expert_load_ = expert_load_.to(x.device()) +
                   at::bincount(routing.experts.reshape(-1), {}, num_experts_).to(at::kFloat);
  }
  const at::Tensor rows = moe::permute(x, plan);  // (M, H) grouped by expert
  std::vector<at::Tensor> outputs;
  int64_t start = 0;
  // Every expert runs, on zero rows too, so each parameter always has a gradient.
  for (int64_t e = 0; e < num_experts_; ++e) {
    const int64_t count = plan.counts[static_cast<size_t>(e)];
    outputs.push_back(expert_list_[static_cast<size_t>(e)]->forward(rows.narrow(0, start, count)));
    start += count;
  }
  const at::Tensor routed = moe::combine(at::cat(outputs, 0), plan, x.size(0)).view(hidden.sizes());
  return routed + shared_->forward(hidden);
}

void DeepseekMoe::update_bias(double gamma, const at::Tensor& load) {
  at::Tensor& bias = gate_->e_score_correction_bias;
  TORCH_CHECK(bias.defined(), "update_bias: only DeepSeek-V3 routers (noaux_tc) have a score correction bias");
  at::NoGradGuard no_grad;
  const at::Tensor counts = (load.defined() ? load : expert_load_).to(bias.device(), at::kFloat);
  bias.add_(gamma * at::sign(counts.mean() - counts));
  expert_load_.zero_();
}

}  // namespace colossus::models
