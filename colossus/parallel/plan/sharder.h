// The sharder: applies a ShardingPlan to a full model in place. Each matched
// leaf is replaced by its parallel layer, whose parameters are the original
// tensor objects narrowed (set_data) to this rank's slice, so an optimizer
// built on the full model still holds them. It returns what it did: a
// ShardSpec per sharded parameter (for checkpoint IO and gradient norms) and
// the vocab layout (padding, this rank's range).
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/models/causal_lm.h"
#include "colossus/parallel/plan/plan.h"
#include "colossus/parallel/plan/shard_spec.h"
#include "colossus/parallel/sequence/split_gather.h"
#include "colossus/parallel/tensor/cross_entropy.h"

#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace colossus::parallel::plan {

struct ShardOptions {
  // The vocab is padded to a multiple of this times tp (Megatron's
  // make-vocab-size-divisible-by): padded logits are masked out of the loss and
  // padded rows trimmed on save.
  int64_t make_vocab_size_divisible_by = 64;
  // split_gather / ring sequence parallelism: the parallel layers take and
  // return (B, T/tp, C) sequence shards between them (layers.h). Needs the
  // embedding and head vocab-parallel; gather_output and replicated row
  // inputs are refused (they would leave a full sequence between regions).
  sequence::SequenceSharding sequence = sequence::SequenceSharding::None;
};

struct ShardedModel {
  cluster::ProcessGroupPtr tp_group;
  std::map<std::string, ShardSpec> specs;  // by parameter name; others are replicated over tp
  bool vocab_parallel_logits = false;      // the head yields this rank's vocab slice
  bool tied_head = false;                  // the head is the vocab-parallel embedding's shard
  tensor::VocabShard vocab;                // valid with vocab_parallel_logits
  int64_t padded_vocab = 0;
  // Not None: activations between the layers are sequence shards, and every
  // parameter replicated over tp (not in `specs`) gets a gradient from its
  // rank's tokens only, to be summed over tp.
  sequence::SequenceSharding sequence = sequence::SequenceSharding::None;
  // Parameters of the plan's head_local modules (with tp > 1): whole on every
  // rank, each rank's gradient a part to be summed over tp.
  std::set<std::string> head_local;

  // How many tp ranks hold each element of the parameter (tp for replicated ones).
  int64_t replicas(const std::string& name) const;
  // Whether this rank's gradient of the parameter is only its part of the
  // whole, to be summed over tp: head-local parameters, and every replicated
  // parameter when activations are sequence shards.
  bool grad_partial_over_tp(const std::string& name) const;
};

// Throws ConfigError unless tp splits the model: tp divides the attention
// heads and the FFN width, kv heads divide by tp or tp by kv heads.
void validate_tp(const models::ModelConfig& config, int64_t tp);

// Collective-free: slices with tp_group's rank and size. model holds full
// weights (identical on every rank) and has not been sharded yet; a lazy
// model's meta parameters become meta slices, which the caller materialises
// with slice_for_rank (HybridParallelPlugin does, from its param source).
ShardedModel shard_model(models::CausalLM& model, const ShardingPlan& plan, cluster::ProcessGroupPtr tp_group,
                         const ShardOptions& options = {});

}  // namespace colossus::parallel::plan
