// DeepSeekMoE as transformers' DeepseekV2Moe / DeepseekV3MoE with the
// checkpoint names it reads and writes: mlp.gate.weight (E, H) (and V3's
// mlp.gate.e_score_correction_bias (E), a buffer), mlp.experts.M.{gate,up,
// down}_proj.weight, mlp.shared_experts.{gate,up,down}_proj.weight. Routed
// experts run over the rows sorted by expert (moe_layer.h's plan_dispatch,
// permute, combine; one loop over experts, never over tokens); the shared
// MLP sees every token. V3's aux-loss-free balancing counts each expert's
// tokens in training and moves the bias by +-gamma in update_bias().
#pragma once
#include "colossus/models/config.h"
#include "colossus/models/layers.h"
#include "colossus/models/llama.h"
#include "colossus/models/moe_layer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace colossus::models {

// mlp.gate: the router's weight (E, H) and, for V3, the score correction bias.
class DeepseekRouter : public torch::nn::Module {
 public:
  DeepseekRouter(const DeepseekConfig& config, const at::TensorOptions& options);
  // x: (N, H) -> routing with logits (N, E) fp32 and weights (N, k) fp32
  // already multiplied by routed_scaling_factor.
  moe::Routing route(const at::Tensor& x) const;

  at::Tensor weight;                   // (E, H)
  at::Tensor e_score_correction_bias;  // (E) fp32 buffer; undefined for V2

 private:
  std::string method_;
  int64_t top_k_, groups_, topk_groups_;
  bool norm_topk_prob_;
  double scaling_;
};

class DeepseekMoe : public LayerHost {
 public:
  DeepseekMoe(const DeepseekConfig& config, const at::TensorOptions& options);
  // hidden: (B, T, H) -> (B, T, H): routed experts (weighted) + shared MLP.
  at::Tensor forward(const at::Tensor& hidden);

  DeepseekRouter& gate() const { return *gate_; }
  int64_t num_experts() const { return num_experts_; }
  // (N, E) fp32 router logits of the last forward.
  const at::Tensor& last_router_logits() const { return last_router_logits_; }
  // (E) fp32: tokens routed to each expert by training forwards since the last update_bias().
  const at::Tensor& expert_load() const { return expert_load_; }
  // V3 aux-loss-free balancing: bias += gamma * sign(mean load - load), so
  // under-loaded experts rise and over-loaded ones fall; resets the count.
  // `load` replaces the local count (e.g. summed over data-parallel ranks).
  void update_bias(double gamma, const at::Tensor& load = {});

 private:
  std::shared_ptr<DeepseekRouter> gate_;
  std::shared_ptr<torch::nn::Module> experts_;
  std::vector<std::shared_ptr<LlamaMLP>> expert_list_;
  std::shared_ptr<LlamaMLP> shared_;
  int64_t num_experts_;
  at::Tensor last_router_logits_, expert_load_;
};

}  // namespace colossus::models
