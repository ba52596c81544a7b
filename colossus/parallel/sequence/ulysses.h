// DeepSpeed-Ulysses attention over a sequence-parallel group: q, k, v arrive
// sharded along the sequence; one all-to-all turns them into full-sequence
// tensors of a slice of the heads, attention runs locally, and a second
// all-to-all turns the output back into a sequence shard. Both all-to-alls are
// named autograd functions, each the other's backward.
#pragma once
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace colossus::parallel::sequence {

// Forward: sequence shard -> head shard. x: (B, H, T_local, D), rank r holding
// the r-th contiguous slice of the sequence -> (B, H / sp, T_local * sp, D),
// heads [r*H/sp, (r+1)*H/sp). Backward: head_to_sequence.
at::Tensor sequence_to_head(const at::Tensor &x, cluster::ProcessGroup &group);

// Forward: head shard -> sequence shard, the inverse of sequence_to_head.
// x: (B, H_local, T, D) -> (B, H_local * sp, T / sp, D).
at::Tensor head_to_sequence(const at::Tensor &x, cluster::ProcessGroup &group);

struct UlyssesOptions {
  bool causal = true;
  double scale = 0.0;    // 0: 1/sqrt(head_dim)
  int64_t seq_len = -1;  // true global length; later positions are padding (keys
                         // masked). -1: no padding.
  // (B, 1, T_pad, T_pad) bool over the whole padded sequence, true where a
  // query may see a key (padded or packed rows: documents, causality and
  // padding included); replaces `causal`. Undefined: none.
  at::Tensor mask;
};

// q: (B, H, T_local, D), k, v: (B, H_kv, T_local, D), contiguous sequence
// shards (SequenceLayout::Contiguous) -> (B, H, T_local, D). H must divide by
// sp (ConfigError otherwise); H % H_kv == 0 (GQA); when H_kv does not divide
// by sp, kv heads are replicated to H before the all-to-all.
at::Tensor ulysses_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                             cluster::ProcessGroup &group, const UlyssesOptions &options = {});

}  // namespace colossus::parallel::sequence
