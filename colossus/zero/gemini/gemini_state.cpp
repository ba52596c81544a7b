// The checkpoint state of GeminiOptimizer in the format shared with ZeRO-1/2
// and DDP (zero/optimizer_state.h): state_dict() all-gathers each state slot
// chunk by chunk and keeps every whole parameter, rank_state_dict() only the
// parameters this rank writes in a per-rank sharded save; load_state_dict()
// cuts this rank's parts out of whole tensors.
#include <ATen/ATen.h>

#include "colossus/zero/gemini/gemini_optimizer.h"
#include "colossus/zero/optimizer_state.h"

namespace colossus::zero::gemini {

ShardedStateLayout GeminiOptimizer::state_layout() const {
  return ShardedStateLayout{.name = name(),
                            .params = &ddp_.params(),
                            .layout = &ddp_.layout(),
                            .inner_order = &inner_order_,
                            .master_view = [this](size_t k) { return ddp_.master_view(k); },
                            .group = ddp_.dp_group().get(),
                            .device = ddp_.device()};
}

optim::OptimizerState GeminiOptimizer::state_for(const std::function<bool(size_t)>& keep) const {
  nvme_fetch_all();  // state_dict copies the live tensors
  optim::OptimizerState local = inner_->state_dict();
  nvme_evict_all();
  const bool low_precision = ddp_.options().precision != "fp32";
  optim::OptimizerState out;
  out.tensors = gather_state_tensors(state_layout(), local, low_precision, keep);
  out.json = low_precision ? mixed_precision_json(inner_->name(), local.json,
                                                  scaler_ ? std::optional(scaler_->state_dict()) : std::nullopt,
                                                  skipped_steps_)
                           : local.json;
  return out;
}

optim::OptimizerState GeminiOptimizer::state_dict() const {
  ddp_.finish_host_updates();  // the host worker's queued steps are part of it
  return state_for([](size_t) { return true; });
}

std::optional<optim::OptimizerState> GeminiOptimizer::rank_state_dict() const {
  ddp_.finish_host_updates();
  const int rank = ddp_.dp_group()->rank(), dp = ddp_.dp_group()->size();
  return state_for([&](size_t k) { return writer_rank(ddp_.layout(), k, dp) == rank; });
}

void GeminiOptimizer::load_state_dict(const optim::OptimizerState& state) {
  ddp_.finish_host_updates();
  if (ddp_.warming_up()) {
    // Loaded state lands where the chunks will live: place them now (the
    // warm-up placement).
    ddp_.end_warmup(16);
    rebind_masters();
  }
  RankState mine = split_state(state_layout(), state, scaler_.has_value(), ddp_.options().precision);
  nvme_fetch_all();  // the inner optimizer may write into its live tensors
  try {
    inner_->load_state_dict(mine.inner);  // validates before changing anything
  } catch (...) {
    nvme_evict_all();
    throw;
  }
  nvme_evict_all();
  if (scaler_ && mine.loss_scaler_json) scaler_->load_state_dict(*mine.loss_scaler_json);
  skipped_steps_ = mine.skipped_steps;
  at::NoGradGuard no_grad;
  for (const auto& [k, tensor] : mine.masters) {
    ddp_.master_view(k).copy_(owned_part(tensor.reshape({-1}), ddp_.layout().slots[k]));
  }
  if (!mine.masters.empty()) ddp_.shards_from_masters();
  const auto& inner_groups = inner_->param_groups();
  for (size_t g = 0; g < groups_.size() && g < inner_groups.size(); ++g) {
    groups_[g].lr = inner_groups[g].lr;
    groups_[g].weight_decay = inner_groups[g].weight_decay;
    groups_[g].options = inner_groups[g].options;
  }
}

}  // namespace colossus::zero::gemini
