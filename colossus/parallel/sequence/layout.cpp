#include "colossus/parallel/sequence/layout.h"

#include "colossus/core/errors.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <fmt/format.h>

namespace colossus::parallel::sequence {

namespace {

void check_sp(int64_t sp, int64_t rank) {
  if (sp < 1 || rank < 0 || rank >= sp)
    throw ConfigError(fmt::format("sequence layout: rank {} is not in a group of size {}", rank, sp));
}

int64_t pieces(int64_t sp, SequenceLayout layout) { return layout == SequenceLayout::ZigZag ? 2 * sp : sp; }

}  // namespace

int64_t padded_length(int64_t seq_len, int64_t sp, SequenceLayout layout) {
  if (seq_len < 1) throw ConfigError(fmt::format("sequence layout: sequence length {} must be positive", seq_len));
  const int64_t n = pieces(sp, layout);
  return (seq_len + n - 1) / n * n;
}

std::vector<int64_t> local_positions(int64_t local_len, int64_t sp, int64_t rank, SequenceLayout layout) {
  check_sp(sp, rank);
  std::vector<int64_t> pos(local_len);
  if (layout == SequenceLayout::Contiguous) {
    for (int64_t i = 0; i < local_len; ++i) pos[i] = rank * local_len + i;
    return pos;
  }
  if (local_len % 2 != 0)
    throw ConfigError(fmt::format("zig-zag layout: local length {} is not two equal chunks (sp={})", local_len, sp));
  const int64_t chunk = local_len / 2;
  for (int64_t i = 0; i < chunk; ++i) {
    pos[i] = rank * chunk + i;
    pos[chunk + i] = (2 * sp - 1 - rank) * chunk + i;
  }
  return pos;
}

at::Tensor shard_sequence(const at::Tensor &x, int64_t dim, int64_t sp, int64_t rank, SequenceLayout layout) {
  check_sp(sp, rank);
  dim = dim < 0 ? dim + x.dim() : dim;
  const int64_t seq_len = x.size(dim), padded = padded_length(seq_len, sp, layout);
  at::Tensor full = x;
  if (padded != seq_len) {
    // constant_pad_nd's pad list starts at the last dim: (left, right) pairs.
    std::vector<int64_t> pad(2 * (x.dim() - dim), 0);
    pad[pad.size() - 1] = padded - seq_len;
    full = at::constant_pad_nd(x, pad, 0);
  }
  if (layout == SequenceLayout::Contiguous) return full.narrow(dim, rank * (padded / sp), padded / sp);
  const int64_t chunk = padded / (2 * sp);
  return at::cat({full.narrow(dim, rank * chunk, chunk), full.narrow(dim, (2 * sp - 1 - rank) * chunk, chunk)}, dim);
}

at::Tensor unshard_sequence(const at::Tensor &local, int64_t dim, int64_t seq_len, cluster::ProcessGroup &group,
                            SequenceLayout layout) {
  const int64_t sp = group.size();
  dim = dim < 0 ? dim + local.dim() : dim;
  const int64_t local_len = local.size(dim);
  if (local_len * sp < seq_len)
    throw ConfigError(
        fmt::format("unshard_sequence: {} ranks x {} local tokens cannot hold {} tokens", sp, local_len, seq_len));
  at::Tensor mine = local.contiguous();
  std::vector<at::Tensor> shards;
  if (sp == 1) {
    shards.push_back(mine);
  } else {
    std::vector<int64_t> stacked_shape{sp};
    for (int64_t s : mine.sizes()) stacked_shape.push_back(s);
    at::Tensor stacked = at::empty(stacked_shape, mine.options());
    group.all_gather_into(stacked.view({-1}), mine.view({-1})).wait();
    for (int64_t r = 0; r < sp; ++r) shards.push_back(stacked[r]);
  }
  std::vector<at::Tensor> ordered;
  if (layout == SequenceLayout::Contiguous) {
    ordered = shards;
  } else {
    const int64_t chunk = local_len / 2;
    ordered.resize(2 * sp);
    for (int64_t r = 0; r < sp; ++r) {
      ordered[r] = shards[r].narrow(dim, 0, chunk);
      ordered[2 * sp - 1 - r] = shards[r].narrow(dim, chunk, chunk);
    }
  }
  return at::cat(ordered, dim).narrow(dim, 0, seq_len);
}

}  // namespace colossus::parallel::sequence
