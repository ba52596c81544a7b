// The whole-model view of a HybridParallelModel's tensors for checkpoints:
// a parameter gathered from its pipeline stage and its tp slices (vocab
// padding trimmed), and back; the optimizer state merged over pp and gathered
// over tp into the layout-free form (global parameter indices, whole
// tensors), and back to this rank's part. HybridParallelPlugin's checkpoint
// IO and MoeHybridParallelPlugin's (with tp/pp) both build on it, so a file
// written with one tp x pp layout loads into any other.
#pragma once
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/optim/optimizer.h"

#include <ATen/core/Tensor.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

namespace colossus::booster {

// "state.12.exp_avg" / "master.12" -> 12; -1 when the name has no index.
int64_t optimizer_param_index(const std::string& name);

// The optimizer state JSON without the step counts of `indices` (at the top
// level and in a mixed-precision wrapper's "inner" state).
std::string without_steps_of(const std::string& json_text, const std::set<int64_t>& indices);

class HybridParallelState {
 public:
  // tp: the tensor-parallel group (a group of one without tp); pp: the
  // pipeline group, used only when `model` has a pipeline.
  HybridParallelState(HybridParallelModel& model, cluster::ProcessGroupPtr tp, cluster::ProcessGroupPtr pp);

  // Collective over pp (when `name` has a stage) and tp (when it is sharded):
  // the whole parameter, from the stage holding it, padding trimmed.
  at::Tensor full_parameter(const std::string& name, const at::Tensor& local);
  // This rank's slice of a whole `full` (padding added back); `full` itself
  // for a tp-replicated parameter. Throws CheckpointError on a wrong shape.
  at::Tensor slice_parameter(const std::string& name, const at::Tensor& full) const;
  // Whether this rank's stage holds `name` (always without a pipeline).
  bool holds(const std::string& name) const;

  // (parameter name, local shape) of each optimizer parameter, flat order;
  // another stage's parameter carries the shape its owner holds.
  using ParamNames = std::vector<std::pair<std::string, std::vector<int64_t>>>;
  ParamNames param_names(const optim::Optimizer& optimizer) const;
  // Collective over pp and tp: every stage's state (JSON merged, each tensor
  // from the stage holding its parameter), state shaped like a sharded
  // parameter gathered whole. Every rank of the pp x tp group ends with it.
  optim::OptimizerState full_optimizer_state(const ParamNames& names, optim::OptimizerState local);
  // The inverse for loading: other stages' entries (and step counts) dropped,
  // sharded parameters' state sliced to this rank.
  optim::OptimizerState local_optimizer_state(const ParamNames& names, optim::OptimizerState full) const;

 private:
  HybridParallelModel& model_;
  cluster::ProcessGroupPtr tp_, pp_;

  at::Tensor from_stage(const std::string& name, const at::Tensor& local);
  int owner_of(const ParamNames& names, const std::string& state_name) const;
  optim::OptimizerState merge_over_pp(const ParamNames& names, optim::OptimizerState local);
};

}  // namespace colossus::booster
