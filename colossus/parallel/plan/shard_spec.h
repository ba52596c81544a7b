// How one full parameter maps to each tensor-parallel rank's local tensor:
// which ranges along one dim a rank holds (several for fused [q|k|v], the same
// range on several ranks for replicated kv heads), and how much vocab padding
// sits past the true size. The sharder slices with it; checkpoint IO gathers
// with it (and trims the padding, so checkpoints keep the true vocab).
#pragma once
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace colossus::parallel::plan {

struct ShardSpec {
  int64_t dim = 0;        // the split dim of the full tensor
  int64_t full_size = 0;  // along dim, with padding
  int64_t true_size = 0;  // along dim, as checkpoints hold it (<= full_size)
  // Per tp rank: the (start, length) ranges along dim it holds, concatenated
  // in this order in its local tensor. Every rank holds the same total length.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges;
  // How many tp ranks hold each element (1 if split, > 1 for replicated kv
  // heads): gradient norms count each element once.
  int64_t replicas = 1;

  // `parts` equal parts of `size` elements each split evenly over `tp`.
  static ShardSpec even(int64_t dim, int64_t size, int64_t tp, int64_t parts = 1);
};

// full: the tensor as a checkpoint holds it (true_size along dim) -> this
// rank's local tensor (padding added as zeros first), contiguous, a copy.
at::Tensor slice_for_rank(const at::Tensor& full, const ShardSpec& spec, int rank);

// Collective over the tp group: every rank's local tensor -> the full tensor
// (true_size along dim) on every rank.
at::Tensor gather_full(const at::Tensor& local, const ShardSpec& spec, cluster::ProcessGroup& tp_group);

}  // namespace colossus::parallel::plan
