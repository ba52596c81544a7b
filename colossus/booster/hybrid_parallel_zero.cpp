// ZeRO inside HybridParallelPlugin (zero_stage 1, or 2 without a pipeline),
// composed with tp, pp and sp as Colossal-AI's HybridParallelZeroOptimizer:
// one LowLevelZeroOptimizer over the dp group holds this rank's (tp-sliced,
// pp-stage) parameters; it shards the optimizer state and fp32 masters over
// dp and all-gathers the updated parameters over dp after each step.
// Gradients: without a pipeline its hooks reduce-scatter them while backward
// runs (the model's dp reducers are dropped); with one, the schedule hands
// them over once per step. The sp axis (ring_attn / all_to_all) replicates
// the shard, gradients averaged over it too; split_gather / ring's
// tp-replicated gradients (each tp rank saw its tokens only) are summed over
// tp by a second shard group. The global norm and the fp16 overflow flag are
// reduced over dp and then pp x tp, each parameter weighted by 1/replicas, so
// the norm is that of the full model's gradient.
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/core/errors.h"
#include "colossus/zero/low_level/low_level_zero_optimizer.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace colossus::booster {

std::unique_ptr<optim::Optimizer> HybridParallelPlugin::wrap_zero_optimizer(
    HybridParallelModel& model, std::unique_ptr<optim::Optimizer> optimizer) {
  // Before the zero optimizer sets its gradient hooks: a reducer's destructor
  // clears whatever hook its parameters hold.
  model.release_grad_reducers();
  // Group 1 (when any parameter is in it): gradients that are partial sums
  // over tp (head-local norms), averaged over dp, then over tp and times tp:
  // summed over tp.
  const bool tp_sharded = tp_group()->size() > 1;
  zero::NamedParams params;
  std::vector<size_t> group_of;
  std::vector<int64_t> replicas;
  {
    at::NoGradGuard no_grad;
    size_t index = 0;
    for (auto& item : model.unwrap().named_parameters(/*recurse=*/true)) {
      at::Tensor& p = item.value();
      // bf16/fp16: back to the exact fp32 values, which the zero optimizer
      // takes as masters before casting the parameters again (as the
      // non-ZeRO path starts its masters at the originals).
      if (!fp32_originals_.empty() && fp32_originals_.at(index).defined() && at::isFloatingType(p.scalar_type())) {
        p.set_data(fp32_originals_.at(index));
      }
      ++index;
      group_of.push_back(tp_sharded && model.sharded().grad_partial_over_tp(item.key()) ? 1 : 0);
      replicas.push_back(norm_replicas(model, item.key()));
      params.emplace_back(item.key(), p);
    }
  }
  std::vector<zero::ShardGroup> groups{
      {.dp_group = dp_group(), .extra_dp_group = options_.sp_axis_size() > 1 ? mesh_->group("sp") : nullptr}};
  if (std::find(group_of.begin(), group_of.end(), size_t{1}) != group_of.end()) {
    groups.push_back({.dp_group = dp_group(),
                      .extra_dp_group = tp_group(),
                      .grad_scale = static_cast<double>(tp_group()->size())});
  }
  fp32_originals_.clear();
  auto zero_optimizer = std::make_unique<zero::LowLevelZeroOptimizer>(
      std::move(optimizer), std::move(params), std::move(groups), std::move(group_of),
      zero::LowLevelZeroOptions{.stage = options_.zero_stage,
                                .precision = options_.precision,
                                .loss_scaler = options_.loss_scaler,
                                .max_norm = options_.max_norm,
                                .norm_type = options_.norm_type,
                                .model_parallel_group = norm_group(),
                                .norm_replicas = std::move(replicas)});
  if (model.pipeline() != nullptr) {
    zero_optimizer->set_grad_sync(false);  // reduced once per schedule
    model.pipeline()->set_zero_optimizer(zero_optimizer.get());
  }
  return zero_optimizer;
}

}  // namespace colossus::booster
