// Megatron-style sequence parallelism (Colossal-AI's modes split_gather and
// ring): between tensor-parallel regions the activations (B, T, C) are sharded
// along the sequence over the tp group, so norms, dropout and residual adds
// run on T/tp tokens. These autograd functions move activations into and out
// of the regions: all-gather along the sequence before a column-parallel
// matmul, reduce-scatter after a row-parallel one. `Ring` does the same
// movement as tp chunks passed around the ring, each chunk's matmul
// overlapping the next chunk's transfer.
#pragma once
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

namespace colossus::parallel::sequence {

// How a tensor-parallel layer exchanges activations along the sequence.
enum class SequenceSharding {
  None,        // activations replicated over tp (plain tensor parallelism)
  SplitGather, // one all-gather / reduce-scatter per layer
  Ring, // the same, chunked around the ring and overlapped with the matmul
};

// Forward: all-gather along dim 1 in rank order. Backward: reduce-scatter
// (sum) along dim 1. x: (B, L, ...) -> (B, L * group.size(), ...).
at::Tensor gather_sequence(const at::Tensor &x, cluster::ProcessGroup &group);

// Forward: reduce-scatter (sum) along dim 1; rank r keeps rows [r*L, (r+1)*L).
// Backward: all-gather. x: (B, L * group.size(), ...) -> (B, L, ...); the
// sequence must divide by group.size() (ConfigError otherwise).
at::Tensor reduce_scatter_sequence(const at::Tensor &x,
                                   cluster::ProcessGroup &group);

// linear(gather_sequence(x), weight, bias) computed around the ring: step s
// multiplies the chunk of rank (r - s) while the next chunk is in flight;
// backward reduce-scatters dx the same way (a partial sum per chunk travels
// the ring) and accumulates dW chunk by chunk.
// x: (B, L, in) this rank's shard, weight: (out, in) (nn.Linear layout; pass
// W.t() for Conv1D), bias: (out) or undefined -> (B, L * group.size(), out).
at::Tensor ring_gather_linear(const at::Tensor &x, const at::Tensor &weight,
                              const at::Tensor &bias,
                              cluster::ProcessGroup &group);

// reduce_scatter_sequence(linear(x, weight)) computed around the ring: step s
// multiplies the chunk destined for rank (r - s - 1), adds the partial sum
// that arrived from the previous rank and passes it on; backward all-gathers
// dy chunk by chunk into dx and dW.
// x: (B, L * group.size(), in), weight: (out, in) -> (B, L, out).
at::Tensor ring_linear_reduce_scatter(const at::Tensor &x,
                                      const at::Tensor &weight,
                                      cluster::ProcessGroup &group);

} // namespace colossus::parallel::sequence
