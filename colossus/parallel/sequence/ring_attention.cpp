#include "colossus/parallel/sequence/ring_attention.h"

#include "colossus/core/errors.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/full.h>
#include <ATen/ops/logaddexp.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/ArrayRef.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace colossus::parallel::sequence {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kTagKv = 71, kTagGradKv = 72, kTagOuterKv = 73, kTagOuterGradKv = 74;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The part of one (query shard, key block) pair that has any allowed pair:
// rows [q0, q1) x columns [k0, k1); `mask` (Lq, Lk) bool where some pair in
// the box is not allowed (causal or padding), undefined where all are.
struct BlockPlan {
  bool empty = true;
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;
  at::Tensor mask;
};

// q_pos/k_pos: global positions of the local queries and of the block's keys.
// With the zig-zag layout and causal attention this gives: own block -> the
// full box with a causal mask; a block from an earlier rank -> all queries x
// its first chunk; from a later rank -> the second query chunk x all keys; so
// every rank does the same work.
BlockPlan plan_block(const std::vector<int64_t> &q_pos, const std::vector<int64_t> &k_pos, bool causal, int64_t seq_len,
                     const at::TensorOptions &device) {
  BlockPlan plan;
  const int64_t nq = static_cast<int64_t>(q_pos.size()), nk = static_cast<int64_t>(k_pos.size());
  const int64_t max_q = *std::max_element(q_pos.begin(), q_pos.end());
  auto key_used = [&](int64_t j) { return k_pos[j] < seq_len && (!causal || k_pos[j] <= max_q); };
  int64_t k0 = -1, k1 = -1, min_k = std::numeric_limits<int64_t>::max(), max_k = -1;
  for (int64_t j = 0; j < nk; ++j) {
    if (!key_used(j)) continue;
    if (k0 < 0) k0 = j;
    k1 = j + 1;
  }
  if (k0 < 0) return plan;
  for (int64_t j = k0; j < k1; ++j) {
    if (!key_used(j)) continue;
    min_k = std::min(min_k, k_pos[j]);
  }
  int64_t q0 = -1, q1 = -1;
  for (int64_t i = 0; i < nq; ++i) {
    if (causal && q_pos[i] < min_k) continue;
    if (q0 < 0) q0 = i;
    q1 = i + 1;
  }
  if (q0 < 0) return plan;
  plan.empty = false;
  plan.q0 = q0, plan.q1 = q1, plan.k0 = k0, plan.k1 = k1;
  int64_t min_q_box = std::numeric_limits<int64_t>::max();
  for (int64_t i = q0; i < q1; ++i) min_q_box = std::min(min_q_box, q_pos[i]);
  for (int64_t j = k0; j < k1; ++j) max_k = std::max(max_k, k_pos[j]);
  const bool need_mask = max_k >= seq_len || (causal && min_q_box < max_k);
  if (need_mask) {
    auto idx = at::TensorOptions().dtype(at::kLong);
    at::Tensor qp = at::tensor(c10::ArrayRef<int64_t>(q_pos.data() + q0, q1 - q0), idx).to(device.device());
    at::Tensor kp = at::tensor(c10::ArrayRef<int64_t>(k_pos.data() + k0, k1 - k0), idx).to(device.device());
    at::Tensor allowed = (kp < seq_len).unsqueeze(0).expand({q1 - q0, k1 - k0});
    if (causal) allowed = allowed.logical_and(qp.unsqueeze(1) >= kp.unsqueeze(0));
    plan.mask = allowed;
  }
  return plan;
}

// (B, H_kv, L, D) -> (B, H_kv * groups, L, D), each kv head serving `groups`
// consecutive query heads.
at::Tensor expand_kv(const at::Tensor &x, int64_t groups) {
  if (groups == 1) return x;
  const auto b = x.size(0), h = x.size(1), l = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, groups, l, d}).reshape({b, h * groups, l, d});
}

// (B, H_kv * groups, L, D) -> (B, H_kv, L, D): the gradient of expand_kv.
at::Tensor reduce_kv(const at::Tensor &x, int64_t groups) {
  if (groups == 1) return x;
  const auto b = x.size(0), h = x.size(1), l = x.size(2), d = x.size(3);
  return x.view({b, h / groups, groups, l, d}).sum(2);
}

// Scores of one block box, masked: (B, H, Lq, Lk).
at::Tensor block_scores(const at::Tensor &qb, const at::Tensor &kb, const BlockPlan &plan, double scale) {
  at::Tensor s = at::matmul(qb, kb.transpose(-2, -1)) * scale;
  if (plan.mask.defined()) s = s.masked_fill(plan.mask.logical_not(), kNegInf);
  return s;
}

// lse with -inf (rows with no allowed key) replaced by 0, so exp(s - lse) is 0
// there instead of NaN.
at::Tensor finite_lse(const at::Tensor &lse) { return lse.masked_fill(lse == kNegInf, 0.0); }

at::ScalarType compute_type(at::ScalarType t) { return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t; }

// The arithmetic shared by every block; `groups` query heads per kv head.
struct BlockMath {
  int64_t groups;
  double scale;

  // Merges one key block into the running (out, lse) of the local queries
  // (online softmax). q, out: (B, H, T, D) and lse (B, H, T) in the compute
  // type; kv: (2, B, H_kv, T_block, D).
  void forward(const at::Tensor &q, const at::Tensor &kv, const BlockPlan &plan, at::Tensor &out,
               at::Tensor &lse) const {
    if (plan.empty) return;
    const auto ct = q.scalar_type();
    const int64_t lq = plan.q1 - plan.q0, lk = plan.k1 - plan.k0;
    at::Tensor qb = q.narrow(2, plan.q0, lq);
    at::Tensor kb = expand_kv(kv[0].narrow(2, plan.k0, lk).to(ct), groups);
    at::Tensor vb = expand_kv(kv[1].narrow(2, plan.k0, lk).to(ct), groups);
    at::Tensor s = block_scores(qb, kb, plan, scale);
    at::Tensor blk_lse = at::logsumexp(s, -1);                                            // (B, H, Lq)
    at::Tensor blk_out = at::matmul(at::exp(s - finite_lse(blk_lse).unsqueeze(-1)), vb);  // (B, H, Lq, D)
    at::Tensor old_lse = lse.narrow(2, plan.q0, lq);
    at::Tensor new_lse = at::logaddexp(old_lse, blk_lse);
    at::Tensor base = finite_lse(new_lse);
    at::Tensor old_out = out.narrow(2, plan.q0, lq);
    at::Tensor merged =
        old_out * at::exp(old_lse - base).unsqueeze(-1) + blk_out * at::exp(blk_lse - base).unsqueeze(-1);
    old_out.copy_(merged);
    old_lse.copy_(new_lse);
  }

  // One block's share of the gradients: adds to dq, returns (dK, dV) of the
  // box's keys (B, H_kv, Lk, D), undefined for an empty plan. lse_safe:
  // finite_lse of the forward's lse; delta: rowsum(dO * O), (B, H, T).
  std::pair<at::Tensor, at::Tensor> backward(const at::Tensor &q, const at::Tensor &dout, const at::Tensor &kv,
                                             const BlockPlan &plan, const at::Tensor &lse_safe,
                                             const at::Tensor &delta, at::Tensor &dq) const {
    if (plan.empty) return {};
    const auto ct = q.scalar_type();
    const int64_t lq = plan.q1 - plan.q0, lk = plan.k1 - plan.k0;
    at::Tensor qb = q.narrow(2, plan.q0, lq), dob = dout.narrow(2, plan.q0, lq);
    at::Tensor kb = expand_kv(kv[0].narrow(2, plan.k0, lk).to(ct), groups);
    at::Tensor vb = expand_kv(kv[1].narrow(2, plan.k0, lk).to(ct), groups);
    at::Tensor p = at::exp(block_scores(qb, kb, plan, scale) - lse_safe.narrow(2, plan.q0, lq).unsqueeze(-1));
    at::Tensor dvb = reduce_kv(at::matmul(p.transpose(-2, -1), dob), groups);
    at::Tensor dp = at::matmul(dob, vb.transpose(-2, -1));
    at::Tensor ds = p * (dp - delta.narrow(2, plan.q0, lq).unsqueeze(-1)) * scale;
    dq.narrow(2, plan.q0, lq).add_(at::matmul(ds, kb));
    at::Tensor dkb = reduce_kv(at::matmul(ds.transpose(-2, -1), qb), groups);
    return {dkb, dvb};
  }
};

void add_block_grads(at::Tensor &dkv, const BlockPlan &plan, const std::pair<at::Tensor, at::Tensor> &grads) {
  if (plan.empty) return;
  const int64_t lk = plan.k1 - plan.k0;
  dkv[0].narrow(2, plan.k0, lk).add_(grads.first);
  dkv[1].narrow(2, plan.k0, lk).add_(grads.second);
}

// The ring geometry. With two-level rings the sp ranks form sp / inner inner
// rings of `inner` consecutive ranks; ranks with the same index in their inner
// ring form an outer ring. inner == sp is the plain single ring.
struct Geometry {
  int64_t sp, rank, local_len, seq_len, groups;
  double scale;
  bool causal;
  SequenceLayout layout;
  int64_t inner;

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
  BlockMath math() const { return {groups, scale}; }
};

// A ring exchange in flight: our buffer goes to `to`, from's arrives in `in`.
// Even ranks post the send first, odd ranks the receive: with NCCL a pair
// of ranks that both receive first from each other (a ring of 2) would block
// each other's send behind their receive on one stream; MPI does not care.
struct Exchange {
  at::Tensor out, in;
  cluster::Work send, recv;
  void wait() {
    send.wait();
    recv.wait();
  }
};

Exchange start_exchange(const at::Tensor &out, cluster::ProcessGroup &group, int to, int from, int tag) {
  Exchange ex{out, at::empty_like(out), {}, {}};
  if (group.rank() % 2 == 0) {
    ex.send = group.send(ex.out, to, tag);
    ex.recv = group.recv(ex.in, from, tag);
  } else {
    ex.recv = group.recv(ex.in, from, tag);
    ex.send = group.send(ex.out, to, tag);
  }
  return ex;
}

// Forward: returns (out (B,H,T,D) in the compute type, lse (B,H,T)). Each
// outer block's transfer to the next inner ring overlaps the whole inner
// ring pass over it; each inner transfer overlaps one block's compute.
std::pair<at::Tensor, at::Tensor> ring_forward(const at::Tensor &q_in, const at::Tensor &k, const at::Tensor &v,
                                               cluster::ProcessGroup &group, const Geometry &g) {
  const auto ct = compute_type(q_in.scalar_type());
  at::Tensor q = q_in.to(ct);
  const auto b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  at::Tensor out = at::zeros({b, h, t, d}, q.options());
  at::Tensor lse = at::full({b, h, t}, kNegInf, q.options());
  const std::vector<int64_t> q_pos = local_positions(t, g.sp, g.rank, g.layout);
  at::Tensor outer_kv = at::stack({k, v}).contiguous();  // (2, B, H_kv, T, D)
  for (int64_t o = 0; o < g.outer(); ++o) {
    std::optional<Exchange> outer_ex;
    if (o + 1 < g.outer()) outer_ex = start_exchange(outer_kv, group, g.outer_next(), g.outer_prev(), kTagOuterKv);
    at::Tensor kv = outer_kv;
    for (int64_t s = 0; s < g.inner; ++s) {
      std::optional<Exchange> ex;
      if (s + 1 < g.inner) ex = start_exchange(kv, group, g.inner_next(), g.inner_prev(), kTagKv);
      BlockPlan plan =
          plan_block(q_pos, local_positions(t, g.sp, g.source(o, s), g.layout), g.causal, g.seq_len, q.options());
      g.math().forward(q, kv, plan, out, lse);
      if (ex) {
        ex->wait();
        kv = ex->in;
      }
    }
    if (outer_ex) {
      outer_ex->wait();
      outer_kv = outer_ex->in;
    }
  }
  return {out, lse};
}

// Backward: returns dq, dk, dv (compute type). A dK/dV accumulator travels
// with its block around the inner ring (inner hops, back to the rank that
// held it at the start of the outer step), then around the outer ring with
// the outer block, one extra hop bringing it home.
variable_list ring_backward(const at::Tensor &q_in, const at::Tensor &k, const at::Tensor &v, const at::Tensor &out,
                            const at::Tensor &lse, const at::Tensor &dout_in, cluster::ProcessGroup &group,
                            const Geometry &g) {
  const auto ct = compute_type(q_in.scalar_type());
  at::Tensor q = q_in.to(ct), dout = dout_in.to(ct);
  const int64_t t = q.size(2);
  at::Tensor delta = (dout * out.to(ct)).sum(-1);  // (B, H, T): rowsum(dO * O)
  at::Tensor lse_safe = finite_lse(lse);
  at::Tensor dq = at::zeros_like(q);
  const std::vector<int64_t> q_pos = local_positions(t, g.sp, g.rank, g.layout);
  at::Tensor outer_kv = at::stack({k, v}).contiguous();
  std::optional<Exchange> outer_grad_ex;  // an outer block's accumulator on its way to the next inner ring
  at::Tensor dkv;
  for (int64_t o = 0; o < g.outer(); ++o) {
    std::optional<Exchange> outer_ex;
    if (o + 1 < g.outer()) outer_ex = start_exchange(outer_kv, group, g.outer_next(), g.outer_prev(), kTagOuterKv);
    at::Tensor kv = outer_kv;
    dkv = at::zeros(kv.sizes(), kv.options().dtype(ct));  // accumulator of the block held now
    std::optional<Exchange> grad_ex;                      // the accumulator travelling to us for the next block
    for (int64_t s = 0; s < g.inner; ++s) {
      std::optional<Exchange> ex;
      if (s + 1 < g.inner) ex = start_exchange(kv, group, g.inner_next(), g.inner_prev(), kTagKv);
      BlockPlan plan =
          plan_block(q_pos, local_positions(t, g.sp, g.source(o, s), g.layout), g.causal, g.seq_len, q.options());
      auto grads = g.math().backward(q, dout, kv, plan, lse_safe, delta, dq);
      if (grad_ex) {
        grad_ex->wait();
        dkv = grad_ex->in;
        grad_ex.reset();
      }
      add_block_grads(dkv, plan, grads);
      // After the last inner step the accumulator goes to the rank that held
      // the block when this outer step began.
      if (g.inner > 1) grad_ex = start_exchange(dkv, group, g.inner_next(), g.inner_prev(), kTagGradKv);
      if (ex) {
        ex->wait();
        kv = ex->in;
      }
    }
    if (grad_ex) {
      grad_ex->wait();
      dkv = grad_ex->in;
    }
    if (g.outer() > 1) {
      // Add what earlier inner rings accumulated for this outer block, pass it on.
      if (outer_grad_ex) {
        outer_grad_ex->wait();
        dkv.add_(outer_grad_ex->in);
      }
      outer_grad_ex = start_exchange(dkv, group, g.outer_next(), g.outer_prev(), kTagOuterGradKv);
    }
    if (outer_ex) {
      outer_ex->wait();
      outer_kv = outer_ex->in;
    }
  }
  if (outer_grad_ex) {
    outer_grad_ex->wait();
    dkv = outer_grad_ex->in;
  }
  return {dq, dkv[0], dkv[1]};
}

cluster::ProcessGroup &group_of(AutogradContext *ctx) {
  return *reinterpret_cast<cluster::ProcessGroup *>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

struct RingAttentionFn : torch::autograd::Function<RingAttentionFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                            cluster::ProcessGroup *group, Geometry g) {
    auto [out, lse] = ring_forward(q, k, v, *group, g);
    at::Tensor result = out.to(q.scalar_type());
    ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
    ctx->saved_data["seq_len"] = g.seq_len;
    ctx->saved_data["groups"] = g.groups;
    ctx->saved_data["scale"] = g.scale;
    ctx->saved_data["causal"] = g.causal;
    ctx->saved_data["zigzag"] = g.layout == SequenceLayout::ZigZag;
    ctx->saved_data["inner"] = g.inner;
    ctx->save_for_backward({q, k, v, out, lse});
    return result;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    cluster::ProcessGroup &group = group_of(ctx);
    auto saved = ctx->get_saved_variables();
    Geometry g{group.size(),
               group.rank(),
               saved[0].size(2),
               ctx->saved_data["seq_len"].toInt(),
               ctx->saved_data["groups"].toInt(),
               ctx->saved_data["scale"].toDouble(),
               ctx->saved_data["causal"].toBool(),
               ctx->saved_data["zigzag"].toBool() ? SequenceLayout::ZigZag : SequenceLayout::Contiguous,
               ctx->saved_data["inner"].toInt()};
    variable_list d = ring_backward(saved[0], saved[1], saved[2], saved[3], saved[4], grads[0], group, g);
    return {d[0].to(saved[0].scalar_type()), d[1].to(saved[1].scalar_type()), d[2].to(saved[2].scalar_type()),
            at::Tensor(), at::Tensor()};
  }
};

// (B, H, L, D) shards in `layout` -> (B, H, sp * L, D) in sequence order.
at::Tensor merge_shards(const std::vector<at::Tensor> &shards, SequenceLayout layout) {
  if (layout == SequenceLayout::Contiguous) return at::cat(shards, 2);
  const int64_t sp = static_cast<int64_t>(shards.size()), chunk = shards[0].size(2) / 2;
  std::vector<at::Tensor> ordered(2 * sp);
  for (int64_t r = 0; r < sp; ++r) {
    ordered[r] = shards[r].narrow(2, 0, chunk);
    ordered[2 * sp - 1 - r] = shards[r].narrow(2, chunk, chunk);
  }
  return at::cat(ordered, 2);
}

// One process plays all sp ranks of a single ring: rank r's queries meet key
// block (r - s) at step s, exactly the blocks and arithmetic ring_attention
// runs, without communication. Inputs in sequence order.
struct BlockwiseFn : torch::autograd::Function<BlockwiseFn> {
  static std::vector<at::Tensor> shards(const at::Tensor &x, const Geometry &g, at::ScalarType ct) {
    std::vector<at::Tensor> out;
    for (int64_t r = 0; r < g.sp; ++r) out.push_back(shard_sequence(x, 2, g.sp, r, g.layout).to(ct).contiguous());
    return out;
  }
  static std::vector<at::Tensor> kv_shards(const at::Tensor &k, const at::Tensor &v, const Geometry &g) {
    std::vector<at::Tensor> out;
    for (int64_t r = 0; r < g.sp; ++r) {
      out.push_back(at::stack({shard_sequence(k, 2, g.sp, r, g.layout), shard_sequence(v, 2, g.sp, r, g.layout)}));
    }
    return out;
  }
  static BlockPlan plan(const Geometry &g, int64_t r, int64_t src, const at::TensorOptions &options) {
    return plan_block(local_positions(g.local_len, g.sp, r, g.layout), local_positions(g.local_len, g.sp, src, g.layout),
                      g.causal, g.seq_len, options);
  }

  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                            Geometry g) {
    const auto ct = compute_type(q.scalar_type());
    std::vector<at::Tensor> qs = shards(q, g, ct), kvs = kv_shards(k, v, g), outs, lses;
    for (int64_t r = 0; r < g.sp; ++r) {
      const auto b = q.size(0), h = q.size(1), d = q.size(3);
      at::Tensor out = at::zeros({b, h, g.local_len, d}, qs[r].options());
      at::Tensor lse = at::full({b, h, g.local_len}, kNegInf, qs[r].options());
      for (int64_t s = 0; s < g.sp; ++s) {
        const int64_t src = (r - s + g.sp) % g.sp;
        g.math().forward(qs[r], kvs[src], plan(g, r, src, qs[r].options()), out, lse);
      }
      outs.push_back(out);
      lses.push_back(lse.unsqueeze(-1));
    }
    at::Tensor out = merge_shards(outs, g.layout), lse = merge_shards(lses, g.layout).squeeze(-1);
    ctx->saved_data["seq_len"] = g.seq_len;
    ctx->saved_data["sp"] = g.sp;
    ctx->saved_data["groups"] = g.groups;
    ctx->saved_data["scale"] = g.scale;
    ctx->saved_data["causal"] = g.causal;
    ctx->saved_data["zigzag"] = g.layout == SequenceLayout::ZigZag;
    ctx->save_for_backward({q, k, v, out, lse});
    return out.to(q.scalar_type());
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const int64_t sp = ctx->saved_data["sp"].toInt();
    Geometry g{sp,
               0,
               q.size(2) / sp,
               ctx->saved_data["seq_len"].toInt(),
               ctx->saved_data["groups"].toInt(),
               ctx->saved_data["scale"].toDouble(),
               ctx->saved_data["causal"].toBool(),
               ctx->saved_data["zigzag"].toBool() ? SequenceLayout::ZigZag : SequenceLayout::Contiguous,
               sp};
    const auto ct = compute_type(q.scalar_type());
    std::vector<at::Tensor> qs = shards(q, g, ct), kvs = kv_shards(k, v, g), douts = shards(grads[0], g, ct);
    std::vector<at::Tensor> outs = shards(saved[3], g, ct), lses = shards(saved[4].unsqueeze(-1), g, ct);
    std::vector<at::Tensor> dqs, dkvs;
    for (int64_t r = 0; r < sp; ++r) dkvs.push_back(at::zeros(kvs[r].sizes(), kvs[r].options().dtype(ct)));
    for (int64_t r = 0; r < sp; ++r) {
      at::Tensor delta = (douts[r] * outs[r]).sum(-1);
      at::Tensor lse_safe = finite_lse(lses[r].squeeze(-1));
      at::Tensor dq = at::zeros_like(qs[r]);
      for (int64_t s = 0; s < sp; ++s) {
        const int64_t src = (r - s + sp) % sp;
        BlockPlan p = plan(g, r, src, qs[r].options());
        add_block_grads(dkvs[src], p, g.math().backward(qs[r], douts[r], kvs[src], p, lse_safe, delta, dq));
      }
      dqs.push_back(dq);
    }
    std::vector<at::Tensor> dks, dvs;
    for (const auto &dkv : dkvs) {
      dks.push_back(dkv[0]);
      dvs.push_back(dkv[1]);
    }
    return {merge_shards(dqs, g.layout).to(q.scalar_type()), merge_shards(dks, g.layout).to(k.scalar_type()),
            merge_shards(dvs, g.layout).to(v.scalar_type()), at::Tensor()};
  }
};

// Shape checks shared by the ring and the single-process path; returns H / H_kv.
int64_t check_qkv(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const char *what) {
  if (q.dim() != 4 || k.dim() != 4 || !k.sizes().equals(v.sizes()) || q.size(0) != k.size(0) ||
      q.size(2) != k.size(2) || q.size(3) != k.size(3))
    throw ConfigError(fmt::format("{}: q {} and k/v {}/{} must be (B, H, T, D) and (B, H_kv, T, D) with equal B, T, D",
                                  what, c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes())));
  if (q.size(1) % k.size(1) != 0)
    throw ConfigError(
        fmt::format("{}: {} query heads are not a multiple of {} kv heads", what, q.size(1), k.size(1)));
  return q.size(1) / k.size(1);
}

}  // namespace

void RingAttentionOptions::validate(int64_t sp) const {
  if (inner_ring_size < 0 || (inner_ring_size != 0 && sp % inner_ring_size != 0))
    throw ConfigError(
        fmt::format("ring attention: inner_ring_size={} does not divide the {} sp ranks into inner rings; use a "
                    "divisor of {} (ranks per node), or 0 for one ring",
                    inner_ring_size, sp, sp));
  if (scale < 0)
    throw ConfigError(fmt::format("ring attention: scale {} must be > 0 (or 0 for 1/sqrt(head_dim))", scale));
}

at::Tensor ring_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, cluster::ProcessGroup &group,
                          const RingAttentionOptions &options) {
  const int64_t sp = group.size();
  options.validate(sp);
  const int64_t groups = check_qkv(q, k, v, "ring attention");
  const int64_t local_len = q.size(2), total = local_len * sp;
  if (options.layout == SequenceLayout::ZigZag && local_len % 2 != 0)
    throw ConfigError(
        fmt::format("ring attention: zig-zag shards hold two equal chunks, but the local "
                    "length is {} (global {} over sp={}); pad "
                    "the sequence to a multiple of 2*sp={} (shard_sequence does)",
                    local_len, total, sp, 2 * sp));
  const int64_t seq_len = options.seq_len < 0 ? total : options.seq_len;
  if (seq_len < 1 || seq_len > total)
    throw ConfigError(
        fmt::format("ring attention: seq_len {} does not fit "
                    "sp={} shards of {} tokens (max {})",
                    options.seq_len, sp, local_len, total));
  Geometry g{sp,
             group.rank(),
             local_len,
             seq_len,
             groups,
             options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))),
             options.causal,
             options.layout,
             options.inner_ring_size == 0 ? sp : options.inner_ring_size};
  return RingAttentionFn::apply(q, k, v, &group, g);
}

at::Tensor blockwise_ring_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, int64_t sp,
                                    const RingAttentionOptions &options) {
  if (sp < 1) throw ConfigError(fmt::format("blockwise ring attention: sp = {} must be >= 1", sp));
  options.validate(sp);
  const int64_t groups = check_qkv(q, k, v, "blockwise ring attention");
  const int64_t total = q.size(2), pieces = options.layout == SequenceLayout::ZigZag ? 2 * sp : sp;
  if (total % pieces != 0)
    throw ConfigError(fmt::format("blockwise ring attention: T = {} does not split into {} equal chunks (sp = {}); "
                                  "pad it to a multiple of {}",
                                  total, pieces, sp, pieces));
  const int64_t seq_len = options.seq_len < 0 ? total : options.seq_len;
  if (seq_len < 1 || seq_len > total)
    throw ConfigError(fmt::format("blockwise ring attention: seq_len {} is outside 1..{}", options.seq_len, total));
  Geometry g{sp,
             0,
             total / sp,
             seq_len,
             groups,
             options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))),
             options.causal,
             options.layout,
             sp};
  return BlockwiseFn::apply(q, k, v, g);
}

at::Tensor reference_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, bool causal, double scale,
                               int64_t seq_len) {
  const int64_t t = q.size(2), groups = q.size(1) / k.size(1);
  if (scale <= 0) scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor s = at::matmul(q, expand_kv(k, groups).transpose(-2, -1)) * scale;
  auto idx = at::TensorOptions().dtype(at::kLong).device(q.device());
  at::Tensor pos = at::arange(t, idx);
  at::Tensor allowed = (pos < (seq_len < 0 ? t : seq_len)).unsqueeze(0).expand({t, t});
  if (causal) allowed = allowed.logical_and(pos.unsqueeze(1) >= pos.unsqueeze(0));
  s = s.masked_fill(allowed.logical_not(), kNegInf);
  return at::matmul(at::softmax(s, -1), expand_kv(v, groups));
}

}  // namespace colossus::parallel::sequence
