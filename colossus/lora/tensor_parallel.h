// LoRA under tensor parallelism. The sharder (parallel/plan) knows Linear and
// Conv1D leaves, not adapters, so a plugin that shards a model with LoRA
// layers takes them out first and puts them back over the parallel layers:
//
//   auto adapters = lora::detach_for_sharding(model);   // bases back in place
//   auto sharded = parallel::plan::shard_model(model, plan, tp_group);
//   lora::attach_sharded(model, std::move(adapters), sharded);
//
// Each adapter follows its base's split: over a column-parallel base lora_B
// keeps the rows of the base weight's output features this rank holds (the
// same ranges, fused q/k/v and replicated kv heads included) and lora_A stays
// whole; over a row-parallel base lora_A keeps the base's input columns and
// lora_B stays whole. The sliced adapters' ShardSpecs join sharded.specs, so
// checkpoints gather them to PEFT's full shapes and gradient norms count each
// element once.
#pragma once
#include "colossus/lora/lora_linear.h"
#include "colossus/models/causal_lm.h"
#include "colossus/parallel/plan/sharder.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace colossus::lora {

using DetachedAdapters = std::vector<std::pair<std::string, std::shared_ptr<LoraLinear>>>;

// Replaces every LoraLinear of `model` by its base layer; returns them by path.
DetachedAdapters detach_for_sharding(models::CausalLM& model);

// Puts each detached adapter back at its path over the layer the sharder left
// there (ColumnParallelLinear, RowParallelLinear, or the untouched base when
// the plan did not shard it), slicing lora_A / lora_B as above and adding
// their specs to `sharded`. ConfigError for sequence-sharded activations
// (split_gather / ring) and for an NF4 base that was sharded.
void attach_sharded(models::CausalLM& model, DetachedAdapters adapters, parallel::plan::ShardedModel& sharded);

}  // namespace colossus::lora
