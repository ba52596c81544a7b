#include "colossus/parallel/plan/shard_spec.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

namespace colossus::parallel::plan {

ShardSpec ShardSpec::even(int64_t dim, int64_t size, int64_t tp, int64_t parts) {
  ShardSpec spec{.dim = dim, .full_size = size, .true_size = size};
  TORCH_CHECK(size % (parts * tp) == 0, "ShardSpec::even: ", size, " does not split into ", parts, " parts over ", tp,
              " ranks");
  const int64_t part = size / parts, local = part / tp;
  for (int64_t r = 0; r < tp; ++r) {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int64_t p = 0; p < parts; ++p) ranges.emplace_back(p * part + r * local, local);
    spec.ranges.push_back(std::move(ranges));
  }
  return spec;
}

at::Tensor slice_for_rank(const at::Tensor& full, const ShardSpec& spec, int rank) {
  TORCH_CHECK(full.size(spec.dim) == spec.true_size, "slice_for_rank: expected ", spec.true_size, " along dim ",
              spec.dim, ", got ", full.sizes());
  at::Tensor source = full;
  if (spec.full_size > spec.true_size) {
    std::vector<int64_t> pad_shape(full.sizes().begin(), full.sizes().end());
    pad_shape[spec.dim] = spec.full_size - spec.true_size;
    source = at::cat({full, at::zeros(pad_shape, full.options())}, spec.dim);
  }
  std::vector<at::Tensor> pieces;
  for (const auto& [start, length] : spec.ranges.at(rank)) pieces.push_back(source.narrow(spec.dim, start, length));
  return at::cat(pieces, spec.dim).contiguous();
}

at::Tensor gather_full(const at::Tensor& local, const ShardSpec& spec, cluster::ProcessGroup& tp_group) {
  const int64_t tp = tp_group.size();
  TORCH_CHECK(static_cast<int64_t>(spec.ranges.size()) == tp, "gather_full: spec for ", spec.ranges.size(),
              " ranks, group of ", tp);
  at::Tensor mine = local.detach().contiguous();
  std::vector<int64_t> stacked_shape{tp};
  for (int64_t s : mine.sizes()) stacked_shape.push_back(s);
  at::Tensor stacked = at::empty(stacked_shape, mine.options());
  if (tp > 1) {
    tp_group.all_gather_into(stacked.view({-1}), mine.view({-1})).wait();
  } else {
    stacked[0].copy_(mine);
  }
  std::vector<int64_t> full_shape(mine.sizes().begin(), mine.sizes().end());
  full_shape[spec.dim] = spec.full_size;
  at::Tensor full = at::zeros(full_shape, mine.options());
  for (int64_t r = 0; r < tp; ++r) {
    int64_t offset = 0;
    // Replicas write the same values to the same place.
    for (const auto& [start, length] : spec.ranges[r]) {
      full.narrow(spec.dim, start, length).copy_(stacked[r].narrow(spec.dim, offset, length));
      offset += length;
    }
  }
  return full.narrow(spec.dim, 0, spec.true_size).contiguous();
}

}  // namespace colossus::parallel::plan
