// One forward of the model over a step's batch: the scheduled tokens of all
// sequences packed into one (1, N) row with their own positions, attention
// routed through the paged KV cache (their K/V written, then each query
// attends to its sequence's cache), and logits only where a token is drawn.
// Decode-only steps on CUDA can replay a CUDA graph captured per batch-size
// bucket (inputs copied into the graph's fixed buffers, padding rows write
// nothing), which removes the per-kernel launch cost that dominates small
// batches.
#pragma once
#include "colossus/inference/attention/paged_attention.h"
#include "colossus/inference/engine/kv_cache.h"
#include "colossus/inference/engine/scheduler.h"
#include "colossus/models/causal_lm.h"
#include "colossus/parallel/plan/sharder.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace colossus::inference {

class ModelRunner {
 public:
  // sharded: the model's tensor-parallel layout when it was sharded (its
  // head then yields a vocab slice, gathered here into full logits).
  ModelRunner(models::CausalLM& model, KVCache& cache, const parallel::plan::ShardedModel* sharded = nullptr);
  ~ModelRunner();

  // Decode steps of up to max_batch_size sequences whose contexts stay within
  // max_context_len replay CUDA graphs. Returns why it cannot (CPU, a
  // sharded model, no CUDA kernels for this head size or dtype), or "".
  std::string enable_graphs(int64_t max_batch_size, int64_t max_context_len);
  int64_t graph_replays() const { return graph_replays_; }

  // Runs the batch; returns logits (rows, V) in the model's dtype: for each
  // sequence with sample set, in batch order, 1 + num_drafts rows (its last
  // positions). Does not advance num_computed.
  at::Tensor run(const std::vector<ScheduledSequence>& batch);

  // Logits (rows, V) at rows of the last run's packed tokens.
  at::Tensor logits_at(const std::vector<int64_t>& rows);

 private:
  struct DecodeGraph;
  // hidden (N, C) after the blocks for input_ids (1, N) at `positions`.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& positions, const AttentionMetadata& meta,
                     int64_t position_limit);
  at::Tensor logits_at_index(const at::Tensor& index);  // index: (R) int64 on the model's device
  bool graph_eligible(const std::vector<ScheduledSequence>& batch) const;
  at::Tensor run_graph(const std::vector<ScheduledSequence>& batch);
  DecodeGraph& graph_for(int64_t batch_size);

  models::CausalLM& model_;
  KVCache& cache_;
  const parallel::plan::ShardedModel* sharded_;
  at::Tensor last_hidden_;  // (N, C)

  bool graphs_ = false;
  int64_t graph_max_batch_ = 0;
  int64_t graph_max_context_ = 0;
  std::map<int64_t, std::unique_ptr<DecodeGraph>> graphs_by_size_;
  int64_t graph_replays_ = 0;
};

}  // namespace colossus::inference
