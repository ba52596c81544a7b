// How a sequence is split over the ranks of a sequence-parallel group, and
// back. Zig-zag (ring attention, causal): the sequence, padded to a multiple
// of 2*sp, is cut into 2*sp chunks; rank r holds chunks r and 2*sp-1-r, so
// every rank does the same causal work. Contiguous (Ulysses): rank r holds the
// r-th of sp equal slices of the sequence padded to a multiple of sp.
#pragma once
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace colossus::parallel::sequence {

enum class SequenceLayout { ZigZag, Contiguous };

// Smallest length >= seq_len that the layout splits evenly over sp ranks:
// a multiple of 2*sp for ZigZag, of sp for Contiguous.
int64_t padded_length(int64_t seq_len, int64_t sp, SequenceLayout layout);

// Global positions (0-based, in the padded sequence) of the local_len tokens
// that `rank` holds, in local order.
std::vector<int64_t> local_positions(int64_t local_len, int64_t sp, int64_t rank, SequenceLayout layout);

// Full (unsharded) tensor -> this rank's shard. x: (..., T, ...) with the
// sequence along `dim`; pads the sequence with zeros to padded_length(T) and
// returns (..., padded_length(T) / sp, ...). Differentiable (plain slicing).
at::Tensor shard_sequence(const at::Tensor &x, int64_t dim, int64_t sp, int64_t rank, SequenceLayout layout);

// Inverse of shard_sequence over `group`: all-gathers the shards, restores the
// sequence order and trims the padding back to seq_len. Not differentiable
// (a test and checkpoint helper). local: (..., T_local, ...) -> (..., seq_len,
// ...).
at::Tensor unshard_sequence(const at::Tensor &local, int64_t dim, int64_t seq_len, cluster::ProcessGroup &group,
                            SequenceLayout layout);

// Zig-zag shorthands.
inline at::Tensor zigzag_shard(const at::Tensor &x, int64_t dim, int64_t sp, int64_t rank) {
  return shard_sequence(x, dim, sp, rank, SequenceLayout::ZigZag);
}
inline at::Tensor zigzag_unshard(const at::Tensor &local, int64_t dim, int64_t seq_len, cluster::ProcessGroup &group) {
  return unshard_sequence(local, dim, seq_len, group, SequenceLayout::ZigZag);
}

}  // namespace colossus::parallel::sequence
