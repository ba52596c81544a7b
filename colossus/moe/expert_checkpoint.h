// Checkpoints of an expert-parallel Mixtral in Hugging Face's layout: the
// experts of every ep rank are gathered into one full state (each expert
// broadcast over the ep group from the rank that holds it) and written as
// save_pretrained writes a single-process model, so the directory loads with
// any ep (load_pretrained, then shard_experts) and into transformers.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/models/mixtral.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace colossus::moe {

// Collective over ep_group: every parameter of the full (unsharded) model by
// HF name; dense ones are this rank's own (replicated) tensors.
std::map<std::string, at::Tensor> gather_full_state(models::MixtralForCausalLM& model, cluster::ProcessGroup& ep_group);

// Collective over ep_group; the rank with write = true (one per job, e.g.
// world rank 0) builds the full model on CPU and save_pretrained's it to dir.
void save_expert_parallel_pretrained(models::MixtralForCausalLM& model, cluster::ProcessGroup& ep_group,
                                     const std::string& dir, bool write);

}  // namespace colossus::moe
