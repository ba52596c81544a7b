// The checkpoint state of LowLevelZeroOptimizer in the format shared with
// Gemini and DDP (zero/optimizer_state.h): state_dict() all-gathers each state
// slot bucket by bucket and keeps every whole parameter, rank_state_dict()
// only the parameters this rank writes in a per-rank sharded save;
// load_state_dict() cuts this rank's parts out of whole tensors.
#include <ATen/ATen.h>

#include "colossus/zero/low_level/low_level_zero_optimizer.h"
#include "colossus/zero/optimizer_state.h"

namespace colossus::zero {

ShardedStateLayout LowLevelZeroOptimizer::state_layout() const {
  return ShardedStateLayout{.name = name(),
                            .params = &params_,
                            .layout = &layout_,
                            .inner_order = &inner_order_,
                            .master_view = [this](size_t k) { return master_views_[k]; },
                            .group = dp_group_.get(),
                            .device = buckets_.empty() ? c10::Device(c10::kCPU) : buckets_.front().flat_params.device()};
}

optim::OptimizerState LowLevelZeroOptimizer::state_for(const std::function<bool(size_t)>& keep) const {
  const_cast<LowLevelZeroOptimizer*>(this)->wait_for_params();
  // The inner optimizer takes the outer groups' lr / weight decay only at
  // step(); a scheduler step since then must be in the saved state too, or a
  // resume that loads it after its own scheduler steps the previous lr.
  auto& inner_groups = inner_->param_groups();
  for (size_t g = 0; g < groups_.size() && g < inner_groups.size(); ++g) {
    inner_groups[g].lr = groups_[g].lr;
    inner_groups[g].weight_decay = groups_[g].weight_decay;
    inner_groups[g].options = groups_[g].options;
  }
  optim::OptimizerState local = inner_->state_dict();
  const bool low_precision = options_.precision != "fp32";
  optim::OptimizerState out;
  // Each shard group's buckets are gathered over its own ranks (MoE: the
  // experts over moe_dp); the slots are global, so only the buckets differ.
  for (size_t g = 0; g < shard_groups_.size(); ++g) {
    Layout part{.buckets = {layout_.buckets.begin() + static_cast<std::ptrdiff_t>(group_begin_[g]),
                            layout_.buckets.begin() + static_cast<std::ptrdiff_t>(group_begin_[g + 1])},
                .slots = layout_.slots};
    ShardedStateLayout sharded = state_layout();
    sharded.layout = &part;
    sharded.group = shard_groups_[g].dp_group.get();
    for (auto& named : gather_state_tensors(sharded, local, low_precision, keep)) {
      out.tensors.push_back(std::move(named));
    }
  }
  out.json = low_precision ? mixed_precision_json(inner_->name(), local.json,
                                                  scaler_ ? std::optional(scaler_->state_dict()) : std::nullopt,
                                                  skipped_steps_)
                           : local.json;
  return out;
}

optim::OptimizerState LowLevelZeroOptimizer::state_dict() const {
  return state_for([](size_t) { return true; });
}

std::optional<optim::OptimizerState> LowLevelZeroOptimizer::rank_state_dict() const {
  return state_for([&](size_t k) {
    const auto& slot = layout_.slots[k];
    const auto& group = *shard_groups_[slot.managed ? buckets_[slot.bucket].group : 0].dp_group;
    return writer_rank(layout_, k, group.size()) == group.rank();
  });
}

void LowLevelZeroOptimizer::load_state_dict(const optim::OptimizerState& state) {
  wait_for_params();
  RankState mine = split_state(state_layout(), state, scaler_.has_value(), options_.precision);
  inner_->load_state_dict(mine.inner);  // validates before changing anything
  if (scaler_ && mine.loss_scaler_json) scaler_->load_state_dict(*mine.loss_scaler_json);
  skipped_steps_ = mine.skipped_steps;
  at::NoGradGuard no_grad;
  for (const auto& [k, tensor] : mine.masters) master_views_[k].copy_(owned_part(tensor.reshape({-1}), layout_.slots[k]));
  const auto& inner_groups = inner_->param_groups();
  for (size_t g = 0; g < groups_.size() && g < inner_groups.size(); ++g) {
    groups_[g].lr = inner_groups[g].lr;
    groups_[g].weight_decay = inner_groups[g].weight_decay;
    groups_[g].options = inner_groups[g].options;
  }
}

}  // namespace colossus::zero
