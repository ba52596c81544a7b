#include "colossus/parallel/sequence/ring_attention.h"

#include "colossus/core/errors.h"

#include <ATen/ops/arange.h>
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

constexpr int kTagKv = 71, kTagGradKv = 72;
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

struct Geometry {
  int64_t sp, rank, local_len, seq_len, groups;
  double scale;
  bool causal;
  SequenceLayout layout;
  int next() const { return static_cast<int>((rank + 1) % sp); }
  int prev() const { return static_cast<int>((rank + sp - 1) % sp); }
  int64_t source(int64_t step) const { return (rank - step + sp) % sp; }
};

// A ring exchange in flight: our buffer goes to next, prev's arrives in `in`.
struct Exchange {
  at::Tensor out, in;
  cluster::Work send, recv;
  void wait() {
    send.wait();
    recv.wait();
  }
};

Exchange start_exchange(const at::Tensor &out, cluster::ProcessGroup &group, const Geometry &g, int tag) {
  Exchange ex{out, at::empty_like(out), {}, {}};
  ex.recv = group.recv(ex.in, g.prev(), tag);
  ex.send = group.send(ex.out, g.next(), tag);
  return ex;
}

// Forward: returns (out (B,H,T,D) in the compute type, lse (B,H,T)).
std::pair<at::Tensor, at::Tensor> ring_forward(const at::Tensor &q_in, const at::Tensor &k, const at::Tensor &v,
                                               cluster::ProcessGroup &group, const Geometry &g) {
  const auto ct = compute_type(q_in.scalar_type());
  at::Tensor q = q_in.to(ct);
  const auto b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  at::Tensor out = at::zeros({b, h, t, d}, q.options());
  at::Tensor lse = at::full({b, h, t}, kNegInf, q.options());
  const std::vector<int64_t> q_pos = local_positions(t, g.sp, g.rank, g.layout);
  at::Tensor kv = at::stack({k, v}).contiguous();  // (2, B, H_kv, T, D)
  for (int64_t step = 0; step < g.sp; ++step) {
    std::optional<Exchange> ex;
    if (step + 1 < g.sp) ex = start_exchange(kv, group, g, kTagKv);
    BlockPlan plan =
        plan_block(q_pos, local_positions(t, g.sp, g.source(step), g.layout), g.causal, g.seq_len, q.options());
    if (!plan.empty) {
      const int64_t lq = plan.q1 - plan.q0, lk = plan.k1 - plan.k0;
      at::Tensor qb = q.narrow(2, plan.q0, lq);
      at::Tensor kb = expand_kv(kv[0].narrow(2, plan.k0, lk).to(ct), g.groups);
      at::Tensor vb = expand_kv(kv[1].narrow(2, plan.k0, lk).to(ct), g.groups);
      at::Tensor s = block_scores(qb, kb, plan, g.scale);
      at::Tensor blk_lse = at::logsumexp(s, -1);                                            // (B, H, Lq)
      at::Tensor blk_out = at::matmul(at::exp(s - finite_lse(blk_lse).unsqueeze(-1)), vb);  // (B, H, Lq, D)
      // Online-softmax merge of this block into the running (out, lse).
      at::Tensor old_lse = lse.narrow(2, plan.q0, lq);
      at::Tensor new_lse = at::logaddexp(old_lse, blk_lse);
      at::Tensor base = finite_lse(new_lse);
      at::Tensor old_out = out.narrow(2, plan.q0, lq);
      at::Tensor merged =
          old_out * at::exp(old_lse - base).unsqueeze(-1) + blk_out * at::exp(blk_lse - base).unsqueeze(-1);
      old_out.copy_(merged);
      old_lse.copy_(new_lse);
    }
    if (ex) {
      ex->wait();
      kv = ex->in;
    }
  }
  return {out, lse};
}

// Backward: returns dq, dk, dv (compute type).
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
  at::Tensor kv = at::stack({k, v}).contiguous();
  at::Tensor dkv = at::zeros(kv.sizes(), kv.options().dtype(ct));  // accumulator of the block held now
  std::optional<Exchange> grad_ex;  // the accumulator travelling to us for the next block
  for (int64_t step = 0; step < g.sp; ++step) {
    std::optional<Exchange> ex;
    if (step + 1 < g.sp) ex = start_exchange(kv, group, g, kTagKv);
    BlockPlan plan =
        plan_block(q_pos, local_positions(t, g.sp, g.source(step), g.layout), g.causal, g.seq_len, q.options());
    at::Tensor dkb, dvb;
    if (!plan.empty) {
      const int64_t lq = plan.q1 - plan.q0, lk = plan.k1 - plan.k0;
      at::Tensor qb = q.narrow(2, plan.q0, lq), dob = dout.narrow(2, plan.q0, lq);
      at::Tensor kb = expand_kv(kv[0].narrow(2, plan.k0, lk).to(ct), g.groups);
      at::Tensor vb = expand_kv(kv[1].narrow(2, plan.k0, lk).to(ct), g.groups);
      at::Tensor p = at::exp(block_scores(qb, kb, plan, g.scale) - lse_safe.narrow(2, plan.q0, lq).unsqueeze(-1));
      dvb = reduce_kv(at::matmul(p.transpose(-2, -1), dob), g.groups);
      at::Tensor dp = at::matmul(dob, vb.transpose(-2, -1));
      at::Tensor ds = p * (dp - delta.narrow(2, plan.q0, lq).unsqueeze(-1)) * g.scale;
      dq.narrow(2, plan.q0, lq).add_(at::matmul(ds, kb));
      dkb = reduce_kv(at::matmul(ds.transpose(-2, -1), qb), g.groups);
    }
    if (grad_ex) {
      grad_ex->wait();
      dkv = grad_ex->in;
      grad_ex.reset();
    }
    if (!plan.empty) {
      const int64_t lk = plan.k1 - plan.k0;
      dkv[0].narrow(2, plan.k0, lk).add_(dkb);
      dkv[1].narrow(2, plan.k0, lk).add_(dvb);
    }
    // After the last step the accumulator goes to its owner, the next rank.
    if (g.sp > 1) grad_ex = start_exchange(dkv, group, g, kTagGradKv);
    if (ex) {
      ex->wait();
      kv = ex->in;
    }
  }
  if (grad_ex) {
    grad_ex->wait();
    dkv = grad_ex->in;
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
               ctx->saved_data["zigzag"].toBool() ? SequenceLayout::ZigZag : SequenceLayout::Contiguous};
    variable_list d = ring_backward(saved[0], saved[1], saved[2], saved[3], saved[4], grads[0], group, g);
    return {d[0].to(saved[0].scalar_type()), d[1].to(saved[1].scalar_type()), d[2].to(saved[2].scalar_type()),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void RingAttentionOptions::validate(int64_t sp) const {
  if (inner_ring_size != 0 && inner_ring_size != sp)
    throw ConfigError(
        fmt::format("ring attention: inner_ring_size={} (two-level rings) is "
                    "not implemented yet; use 0 (one ring over all {} "
                    "sp ranks)",
                    inner_ring_size, sp));
  if (scale < 0)
    throw ConfigError(fmt::format("ring attention: scale {} must be > 0 (or 0 for 1/sqrt(head_dim))", scale));
}

at::Tensor ring_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, cluster::ProcessGroup &group,
                          const RingAttentionOptions &options) {
  const int64_t sp = group.size();
  options.validate(sp);
  if (q.dim() != 4 || k.dim() != 4 || !k.sizes().equals(v.sizes()) || q.size(0) != k.size(0) ||
      q.size(2) != k.size(2) || q.size(3) != k.size(3))
    throw ConfigError(
        fmt::format("ring attention: q {} and k/v {}/{} must be "
                    "(B, H, T_local, D) and (B, H_kv, "
                    "T_local, D) with equal B, T_local, D",
                    c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes())));
  if (q.size(1) % k.size(1) != 0)
    throw ConfigError(
        fmt::format("ring attention: {} query heads are not a multiple of {} kv heads", q.size(1), k.size(1)));
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
             q.size(1) / k.size(1),
             options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3))),
             options.causal,
             options.layout};
  return RingAttentionFn::apply(q, k, v, &group, g);
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
