// Expert parallelism: the experts of a SparseMoeBlock sharded over an ep
// process group (rank r holds experts [r*E/ep, (r+1)*E/ep), keeping their
// global names). Routing, the dispatch plan and the combine are the
// single-process code; only run_experts differs: rows are sent to the rank
// owning their expert by an all-to-all with uneven splits (counts exchanged
// first), computed there, and sent back by the reverse all-to-all.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/models/moe_layer.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace colossus::moe {

// Throws ConfigError unless ep_size >= 1 divides num_experts (both named).
void validate_ep(int64_t num_experts, int64_t ep_size);

// input: (sum(input_splits), ...) rows; rows [sum(input_splits[:r]),
// +input_splits[r]) go to group rank r -> (sum(output_splits), ...),
// output_splits[r] rows from rank r. Autograd: the gradient goes back by the
// all-to-all with the splits swapped.
at::Tensor all_to_all_rows(const at::Tensor& input, const std::vector<int64_t>& output_splits,
                           const std::vector<int64_t>& input_splits, cluster::ProcessGroup& group);

class ExpertParallelMoeBlock : public models::SparseMoeBlock {
 public:
  // Parameters uninitialised; copy them with load_from (or a checkpoint).
  ExpertParallelMoeBlock(const models::MixtralConfig& config, const at::TensorOptions& options,
                         cluster::ProcessGroupPtr ep_group);

  // Copies the gate and this rank's experts from a full (unsharded) block.
  void load_from(const models::SparseMoeBlock& full);
  // Takes the full block's gate (and shared expert, if any) and this rank's expert modules themselves
  // (the same parameter tensors, so an optimizer built on the full model
  // still steps them).
  void adopt_from(const models::SparseMoeBlock& full);

  // x_sorted: (M, H) rows grouped by global expert, counts (E) -> (M, H).
  at::Tensor run_experts(const at::Tensor& x_sorted, const std::vector<int64_t>& counts) override;

  cluster::ProcessGroup& ep_group() const { return *group_; }

 private:
  cluster::ProcessGroupPtr group_;
};

}  // namespace colossus::moe
