// Internal to parallel/sequence: the block arithmetic ring attention is made
// of (which part of a key block a query shard sees, and the online-softmax
// merge of one block forward and backward), the ring geometry, and the shard
// helpers shared by the communicating ring (ring_attention.cpp) and its
// one-process simulation and reference (blockwise_attention.cpp).
#pragma once
#include "colossus/parallel/sequence/block_kernel.h"
#include "colossus/parallel/sequence/layout.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

namespace colossus::parallel::sequence::blocks {

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The part of one (query shard, key block) pair that has any allowed pair:
// rows [q0, q1) x columns [k0, k1); `mask` (Lq, Lk) bool where some pair in
// the box is not allowed (causal or padding), undefined where all are.
struct BlockPlan {
  bool empty = true;
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;
  at::Tensor mask;
  // The mask is exactly the causal lower triangle of a square box (the
  // queries are the keys' own positions: a rank's own block), which the
  // fused kernels apply themselves.
  bool causal_square = false;
};

// q_pos/k_pos: global positions of the local queries and of the block's keys.
// With the zig-zag layout and causal attention this gives: own block -> the
// full box with a causal mask; a block from an earlier rank -> all queries x
// its first chunk; from a later rank -> the second query chunk x all keys; so
// every rank does the same work. `documents` (B, T_total) int64 in sequence
// order (RingAttentionOptions::documents) or undefined: with it the mask is
// (B, 1, Lq, Lk), a query seeing only keys of its own document (and a
// negative id, padding, only itself), as TokenLayout::attention_mask.
BlockPlan plan_block(const std::vector<int64_t> &q_pos, const std::vector<int64_t> &k_pos, bool causal, int64_t seq_len,
                     const at::TensorOptions &device, const at::Tensor &documents = {});

// (B, H_kv, L, D) -> (B, H_kv * groups, L, D), each kv head serving `groups`
// consecutive query heads.
at::Tensor expand_kv(const at::Tensor &x, int64_t groups);
// (B, H_kv * groups, L, D) -> (B, H_kv, L, D): the gradient of expand_kv.
at::Tensor reduce_kv(const at::Tensor &x, int64_t groups);
// lse with -inf (rows with no allowed key) replaced by 0, so exp(s - lse) is 0
// there instead of NaN.
at::Tensor finite_lse(const at::Tensor &lse);
// float for half/bfloat16 inputs, else the input type.
at::ScalarType compute_type(at::ScalarType t);

// What one backward pass reads for every block of the local queries.
struct BackwardRows {
  at::Tensor q, dout;     // (B, H, T, D), the input type
  at::Tensor out;         // the forward's output in the input type (the fused kernels take rowsum(dO * O) from it)
  at::Tensor lse;         // (B, H, T), the compute type
  at::Tensor lse_safe;    // finite_lse(lse)
  at::Tensor delta;       // rowsum(dO * O) in the compute type (the matmul path)

  // out: the forward's (B, H, T, D) in the compute type.
  static BackwardRows make(const at::Tensor &q, const at::Tensor &dout, const at::Tensor &out, const at::Tensor &lse);
};

// The arithmetic shared by every block; `groups` query heads per kv head.
struct BlockMath {
  int64_t groups;
  double scale;
  BlockKernel kernel = BlockKernel::Fused;

  // Merges one key block into the running (out, lse) of the local queries
  // (online softmax). q: (B, H, T, D) in the input type; out (B, H, T, D) and
  // lse (B, H, T) in the compute type; kv: (2, B, H_kv, T_block, D).
  void forward(const at::Tensor &q, const at::Tensor &kv, const BlockPlan &plan, at::Tensor &out,
               at::Tensor &lse) const;
  // One block's share of the gradients: adds to dq (compute type), returns
  // (dK, dV) of the box's keys (B, H_kv, Lk, D), undefined for an empty plan.
  std::pair<at::Tensor, at::Tensor> backward(const BackwardRows &rows, const at::Tensor &kv, const BlockPlan &plan,
                                             at::Tensor &dq) const;
  // Whether this block runs on the fused attention kernel (else matmuls).
  bool fused(const at::Tensor &q, const BlockPlan &plan) const;
};

// The fused kernels (ring_fused_blocks.cpp): one SDPA kernel call per block
// that returns the log-sum-exp (CPU flash; on CUDA cuDNN's or flash's),
// and its backward given the whole row's final out and lse, so every block's
// gradient is already normalised by the global softmax. q, k, v are the
// block's box; `causal` for a causal_square box, else no mask.
// On CUDA cuDNN's kernel where cudnn_block_supported, flash elsewhere.
std::pair<at::Tensor, at::Tensor> fused_block_forward(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                                      bool causal, double scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_block_backward(const at::Tensor &dout, const at::Tensor &q,
                                                                    const at::Tensor &k, const at::Tensor &v,
                                                                    const at::Tensor &out, const at::Tensor &lse,
                                                                    bool causal, double scale);
// Whether the fused kernels take q of this device, dtype and head size.
bool fused_block_supported(const at::Tensor &q);
// Whether cuDNN's kernel takes the block (CUDA, half/bfloat16, k's heads
// dividing q's (GQA blocks expand k and v to q's heads and sum their
// gradients back in fp32), more than one key, head size a multiple of 8 up
// to 128, not in deterministic mode, cuDNN's SDPA not switched off).
bool cudnn_block_supported(const at::Tensor &q, const at::Tensor &k);

void add_block_grads(at::Tensor &dkv, const BlockPlan &plan, const std::pair<at::Tensor, at::Tensor> &grads);

// The ring geometry. With two-level rings the sp ranks form sp / inner inner
// rings of `inner` consecutive ranks; ranks with the same index in their inner
// ring form an outer ring. inner == sp is the plain single ring.
struct Geometry {
  int64_t sp, rank, local_len, seq_len, groups;
  double scale;
  bool causal;
  SequenceLayout layout;
  int64_t inner;
  at::Tensor documents = {};  // RingAttentionOptions::documents
  BlockKernel kernel = BlockKernel::Fused;

  int64_t outer() const { return sp / inner; }
  int64_t ring() const { return rank / inner; }   // which inner ring
  int64_t index() const { return rank % inner; }  // position in it
  int inner_next() const { return static_cast<int>(ring() * inner + (index() + 1) % inner); }
  int inner_prev() const { return static_cast<int>(ring() * inner + (index() + inner - 1) % inner); }
  int outer_next() const { return static_cast<int>(((ring() + 1) % outer()) * inner + index()); }
  int outer_prev() const { return static_cast<int>(((ring() + outer() - 1) % outer()) * inner + index()); }
  // The rank whose key block this rank holds at outer step o, inner step s:
  // outer blocks move one inner ring per outer step, and within one the
  // block moves one rank per inner step.
  int64_t source(int64_t o, int64_t s) const {
    return ((ring() - o + outer()) % outer()) * inner + (index() - s + inner) % inner;
  }
  BlockMath math() const { return {groups, scale, kernel}; }
};

// (B, H, L, D) shards in `layout` -> (B, H, sp * L, D) in sequence order.
at::Tensor merge_shards(const std::vector<at::Tensor> &shards, SequenceLayout layout);
// Shape checks shared by the ring and the single-process path; returns H / H_kv.
int64_t check_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const char *what);

}  // namespace colossus::parallel::sequence::blocks
