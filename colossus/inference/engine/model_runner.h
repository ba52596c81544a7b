// One forward of the model over a step's batch: the scheduled tokens of all
// sequences packed into one (1, N) row with their own positions, attention
// routed through the paged KV cache (their K/V written, then each query
// attends to its sequence's cache), and logits only where a token is drawn.
#pragma once
#include "colossus/inference/attention/paged_attention.h"
#include "colossus/inference/engine/kv_cache.h"
#include "colossus/inference/engine/scheduler.h"
#include "colossus/models/causal_lm.h"
#include "colossus/parallel/plan/sharder.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace colossus::inference {

class ModelRunner {
 public:
  // sharded: the model's tensor-parallel layout when it was sharded (its
  // head then yields a vocab slice, gathered here into full logits).
  ModelRunner(models::CausalLM& model, KVCache& cache, const parallel::plan::ShardedModel* sharded = nullptr);

  // Runs the batch; returns logits (rows, V) in the model's dtype: for each
  // sequence with sample set, in batch order, 1 + num_drafts rows (its last
  // positions). Does not advance num_computed.
  at::Tensor run(const std::vector<ScheduledSequence>& batch);

  // Logits (rows, V) at rows of the last run's packed tokens (speculative
  // decoding verifies every drafted position, not just the last).
  at::Tensor logits_at(const std::vector<int64_t>& rows);

 private:
  models::CausalLM& model_;
  KVCache& cache_;
  const parallel::plan::ShardedModel* sharded_;
  at::Tensor last_hidden_;  // (N, C)
};

}  // namespace colossus::inference
