// Checkpoints of an expert-parallel Mixtral in Hugging Face's layout: the
// experts of every ep rank are gathered into one full state (each expert
// broadcast over the ep group from the rank that holds it) and written as
// save_pretrained writes a single-process model, so the directory loads with
// any ep (load_pretrained, then shard_experts) and into transformers.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/models/mixtral.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>

namespace colossus::moe {

// A parameter this rank holds (by name) -> the whole parameter. With tp / pp
// it gathers the slices and fetches other stages' tensors (collective over
// the pp and tp groups, whose ranks share one ep rank); empty: the identity.
using WholeParameter = std::function<at::Tensor(const std::string& name, const at::Tensor& local)>;

// Collective over ep_group: every parameter of the full (unsharded) model by
// HF name; dense ones are this rank's own (replicated) tensors, through `whole`.
std::map<std::string, at::Tensor> gather_full_state(models::MixtralForCausalLM& model, cluster::ProcessGroup& ep_group,
                                                    const WholeParameter& whole = {});

// Collective over ep_group; the rank with write = true (one per job, e.g.
// world rank 0) builds the full model on CPU and save_pretrained's it to dir.
void save_expert_parallel_pretrained(models::MixtralForCausalLM& model, cluster::ProcessGroup& ep_group,
                                     const std::string& dir, bool write, const WholeParameter& whole = {});

}  // namespace colossus::moe
