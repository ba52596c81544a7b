#include "colossus/models/moe_layer.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

namespace colossus::models::moe {

Routing route(const at::Tensor& router_logits, int64_t top_k) {
  at::Tensor probs = at::softmax(router_logits.to(at::kFloat), -1);
  auto [top_weights, top_experts] = at::topk(probs, top_k, -1);
  top_weights = top_weights / top_weights.sum(-1, /*keepdim=*/true);
  return Routing{.logits = router_logits, .weights = top_weights, .experts = top_experts};
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k) {
  TORCH_CHECK(!router_logits.empty(), "load_balancing_loss: no router logits");
  at::Tensor logits = at::cat(router_logits, 0);  // (L*N, E): HF sums counts and rows over layers
  at::Tensor probs = at::softmax(logits.to(at::kFloat), -1);
  at::Tensor selected = std::get<1>(at::topk(probs, top_k, -1));
  at::Tensor counts = at::zeros({num_experts}, probs.options())
                          .scatter_add_(0, selected.reshape(-1), at::ones({selected.numel()}, probs.options()));
  const double rows = static_cast<double>(logits.size(0));
  at::Tensor tokens_per_expert = counts / rows;
  at::Tensor prob_per_expert = probs.sum(0) / rows;
  return (tokens_per_expert * prob_per_expert).sum() * static_cast<double>(num_experts);
}

at::Tensor router_z_loss(const std::vector<at::Tensor>& router_logits) {
  TORCH_CHECK(!router_logits.empty(), "router_z_loss: no router logits");
  return at::logsumexp(at::cat(router_logits, 0).to(at::kFloat), -1).pow(2).mean();
}

int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t num_experts) {
  return static_cast<int64_t>(
      std::ceil(capacity_factor * static_cast<double>(tokens * top_k) / static_cast<double>(num_experts)));
}

DispatchPlan plan_dispatch(const Routing& routing, int64_t num_experts, std::optional<int64_t> capacity) {
  const int64_t k = routing.experts.size(1);
  at::Tensor flat_experts = routing.experts.reshape(-1);  // (N*k), assignment a = token * k + slot
  at::Tensor order = std::get<1>(at::sort(flat_experts, /*stable=*/true, 0, false));
  at::Tensor counts_t = at::bincount(flat_experts, {}, num_experts).cpu();
  std::vector<int64_t> counts(counts_t.data_ptr<int64_t>(), counts_t.data_ptr<int64_t>() + num_experts);
  DispatchPlan plan;
  if (capacity) {
    // Position of each sorted row inside its expert's segment; keep the first
    // `capacity`.
    std::vector<int64_t> starts(num_experts, 0);
    for (int64_t e = 1; e < num_experts; ++e) starts[e] = starts[e - 1] + counts[e - 1];
    at::Tensor sorted_experts = flat_experts.index_select(0, order);
    at::Tensor start_of = at::tensor(starts, order.options()).index_select(0, sorted_experts);
    at::Tensor position = at::arange(order.size(0), order.options()) - start_of;
    order = order.masked_select(position < *capacity);
    for (auto& c : counts) {
      const int64_t kept = std::min(c, *capacity);
      plan.dropped += c - kept;
      c = kept;
    }
  }
  plan.token_index = at::div(order, k, "floor");
  plan.weight = routing.weights.reshape(-1).index_select(0, order);
  plan.counts = std::move(counts);
  return plan;
}

at::Tensor combine(const at::Tensor& expert_out, const DispatchPlan& plan, int64_t tokens) {
  at::Tensor weighted = (expert_out.to(at::kFloat) * plan.weight.unsqueeze(1)).to(expert_out.scalar_type());
  return at::zeros({tokens, expert_out.size(1)}, expert_out.options()).index_add(0, plan.token_index, weighted);
}

}  // namespace colossus::models::moe

namespace colossus::models {

MixtralExpert::MixtralExpert(int64_t hidden_size, int64_t intermediate_size, const at::TensorOptions& options)
    : LayerHost("MixtralBlockSparseTop2MLP") {
  add_layer("w1", std::make_shared<Linear>(hidden_size, intermediate_size, false, options));
  add_layer("w2", std::make_shared<Linear>(intermediate_size, hidden_size, false, options));
  add_layer("w3", std::make_shared<Linear>(hidden_size, intermediate_size, false, options));
}

at::Tensor MixtralExpert::forward(const at::Tensor& x) {
  return layer("w2").forward(at::silu(layer("w1").forward(x)) * layer("w3").forward(x));
}

SparseMoeBlock::SparseMoeBlock(const MixtralConfig& config, const at::TensorOptions& options, int64_t first_expert,
                               int64_t local_experts)
    : LayerHost("MixtralSparseMoeBlock"),
      num_experts_(config.num_local_experts),
      top_k_(config.num_experts_per_tok),
      first_expert_(first_expert),
      local_experts_(local_experts < 0 ? config.num_local_experts : local_experts),
      jitter_noise_(config.router_jitter_noise),
      capacity_factor_(config.capacity_factor) {
  config.validate();
  TORCH_CHECK(first_expert_ >= 0 && first_expert_ + local_experts_ <= num_experts_, "expert range [", first_expert_,
              ", ", first_expert_ + local_experts_, ") is outside the ", num_experts_, " experts");
  add_layer("gate", std::make_shared<Linear>(config.hidden_size, config.num_local_experts, false, options));
  experts_ = register_module("experts", std::make_shared<torch::nn::Module>("ExpertList"));
  for (int64_t e = first_expert_; e < first_expert_ + local_experts_; ++e) {
    experts_->register_module(std::to_string(e),
                              std::make_shared<MixtralExpert>(config.hidden_size, config.intermediate_size, options));
  }
}

MixtralExpert& SparseMoeBlock::expert(int64_t global_index) const {
  TORCH_CHECK(global_index >= first_expert_ && global_index < first_expert_ + local_experts_, "expert ", global_index,
              " is not held here");
  auto* typed = dynamic_cast<MixtralExpert*>(experts_->named_children()[std::to_string(global_index)].get());
  TORCH_CHECK(typed != nullptr, "experts.", global_index, " has an unexpected type");
  return *typed;
}

at::Tensor SparseMoeBlock::run_experts(const at::Tensor& x_sorted, const std::vector<int64_t>& counts) {
  TORCH_CHECK(local_experts_ == num_experts_, "SparseMoeBlock holds experts [", first_expert_, ", ",
              first_expert_ + local_experts_, ") only; an expert-parallel block must override run_experts");
  std::vector<at::Tensor> outputs;
  int64_t offset = 0;
  // Every expert runs, even on zero rows, so its parameters always get a (zero)
  // gradient and data-parallel reducers see the same ready set on every rank.
  for (int64_t e = 0; e < num_experts_; ++e) {
    outputs.push_back(expert(e).forward(x_sorted.narrow(0, offset, counts[e])));
    offset += counts[e];
  }
  return at::cat(outputs, 0);
}

at::Tensor SparseMoeBlock::forward(const at::Tensor& hidden) {
  const int64_t batch = hidden.size(0), seq = hidden.size(1), width = hidden.size(2);
  at::Tensor x = hidden.reshape({batch * seq, width});  // (N, H)
  if (is_training() && jitter_noise_ > 0) {
    x = x * at::empty_like(x).uniform_(1.0 - jitter_noise_, 1.0 + jitter_noise_);
  }
  at::Tensor logits = layer("gate").forward(x);  // (N, E)
  moe::Routing routing = moe::route(logits, top_k_);
  std::optional<int64_t> capacity;
  if (capacity_factor_) capacity = moe::expert_capacity(*capacity_factor_, x.size(0), top_k_, num_experts_);
  moe::DispatchPlan plan = moe::plan_dispatch(routing, num_experts_, capacity);
  at::Tensor y = run_experts(x.index_select(0, plan.token_index), plan.counts);  // (M, H)
  last_router_logits_ = logits;
  last_dropped_ = plan.dropped;
  return moe::combine(y, plan, x.size(0)).view({batch, seq, width});
}

}  // namespace colossus::models
