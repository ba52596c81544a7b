// The tensor-parallel collectives autograd must see, each a named autograd
// function with its backward beside it (Megatron's mappings): copy-to-region,
// reduce-from-region, gather/scatter along the last dim. A layer built from
// these has a correct backward by construction.
#pragma once
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

namespace colossus::parallel::tensor {

// Forward: identity. Backward: all-reduce (sum) of the gradient over `group`.
// Where a replicated activation enters a column-parallel layer.
// x: any shape -> same shape.
at::Tensor copy_to_region(const at::Tensor& x, cluster::ProcessGroup& group);

// Forward: all-reduce (sum) over `group`. Backward: identity.
// Where a row-parallel layer's partial sums leave. x: any shape -> same shape.
at::Tensor reduce_from_region(const at::Tensor& x, cluster::ProcessGroup& group);

// Forward: all-gather along the last dim, rank order. Backward: this rank's slice.
// x: (..., n) -> (..., n * group.size()).
at::Tensor gather_last_dim(const at::Tensor& x, cluster::ProcessGroup& group);

// Forward: this rank's slice of the last dim. Backward: all-gather.
// x: (..., n * group.size()) -> (..., n).
at::Tensor scatter_last_dim(const at::Tensor& x, cluster::ProcessGroup& group);

// Forward: identity. Backward: the gradient summed over the ranks that hold
// the same replica. Used for key/value weights when there are fewer kv heads
// than tp ranks: each kv head lives on several ranks, each of which sees only
// the part of its gradient that its own query heads produced.
// weight: (rows, ...) -> same; `slot` in [0, slots) names the replica set.
at::Tensor sum_replica_grads(const at::Tensor& weight, int64_t slot, int64_t slots, cluster::ProcessGroup& group);

}  // namespace colossus::parallel::tensor
