// Puts expert parallelism into a whole Mixtral model: every decoder layer's
// SparseMoeBlock becomes an ExpertParallelMoeBlock holding this rank's share
// of the experts (the same parameter tensors; other ranks' experts are freed), so named_parameters() lists this rank's
// experts under their global HF names. Gradient synchronisation is the
// caller's (a plugin's): dense parameters over dp, expert parameters over
// moe_dp (the ranks that hold the same experts).
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/models/mixtral.h"

#include <string>

namespace colossus::moe {

// Throws ConfigError when ep does not divide the model's num_local_experts.
void shard_experts(models::MixtralForCausalLM& model, cluster::ProcessGroupPtr ep_group);

// True for a parameter of an expert
// ("...block_sparse_moe.experts.M.w1.weight").
bool is_expert_parameter(const std::string& name);

}  // namespace colossus::moe
