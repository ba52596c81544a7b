// Ring attention over a sequence-parallel group: each rank holds a shard of
// q, k, v along the sequence; key/value blocks travel around the ring (the
// next block's transfer overlaps the current block's compute) and each block's
// attention is merged into the running output with its log-sum-exp. The
// backward is a ring too: dK/dV accumulators travel with the blocks and end at
// their owners.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/parallel/sequence/block_kernel.h"
#include "colossus/parallel/sequence/layout.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace colossus::parallel::sequence {

struct RingAttentionOptions {
  bool causal = true;
  // Softmax scale; 0 means 1/sqrt(head_dim).
  double scale = 0.0;
  // True global sequence length; tokens at global positions >= seq_len are
  // padding and are never attended to. -1 means no padding (T_local * sp).
  int64_t seq_len = -1;
  // How the shards were cut (layout.h). Causal attention is load-balanced
  // only with ZigZag; Contiguous is correct but the last rank does most work.
  SequenceLayout layout = SequenceLayout::ZigZag;
  // Two-level rings: inner rings of this many consecutive sp ranks (a node)
  // pass key/value blocks among themselves while each inner ring's blocks
  // move on to the next inner ring over an outer ring (one transfer per
  // inner pass, overlapped with it). Must divide sp; 0 (or sp) means one
  // ring over the whole group.
  int64_t inner_ring_size = 0;
  // Padded or packed rows: (B, T_local * sp) int64 document ids on q's
  // device, in sequence order (the padded tail included). A query attends
  // keys of its own document only; a negative id (padding) only itself.
  // Undefined: one document per row.
  at::Tensor documents;
  BlockKernel block_kernel = BlockKernel::Fused;

  // Throws ConfigError naming the bad value.
  void validate(int64_t sp) const;
};

// q: (B, H, T_local, D), k, v: (B, H_kv, T_local, D) with H % H_kv == 0 (GQA),
// this rank's shard in options.layout -> (B, H, T_local, D), the attention
// output for this rank's queries. Differentiable in q, k, v; every rank of
// `group` must call it with the same options and shapes. half/bfloat16 inputs
// are computed and accumulated in float.
at::Tensor ring_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, cluster::ProcessGroup &group,
                          const RingAttentionOptions &options = {});

// Ring attention's blockwise path on one process, for benchmarks and tests:
// the sequence is cut into sp shards (options.layout; inner_ring_size is
// ignored) and each shard's queries attend key block by key block in ring
// order with the online-softmax merge, the same blocks and arithmetic
// ring_attention runs per step, without communication.
// q: (B, H, T, D), k, v: (B, H_kv, T, D) in sequence order, T a multiple of
// 2*sp (zig-zag) or sp -> (B, H, T, D). Differentiable in q, k, v.
at::Tensor blockwise_ring_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t sp,
                                    const RingAttentionOptions &options = {});

// Plain single-process attention used as the reference and by sp == 1 paths:
// q: (B, H, T, D), k, v: (B, H_kv, T, D) -> (B, H, T, D); keys at positions >=
// seq_len (if seq_len >= 0) are masked. Differentiable (ordinary autograd).
at::Tensor reference_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool causal,
                               double scale = 0.0, int64_t seq_len = -1);

}  // namespace colossus::parallel::sequence
