#include "colossus/parallel/sequence/ring_blocks.h"

#include "colossus/core/errors.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/logaddexp.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/tensor.h>
#include <c10/util/ArrayRef.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace colossus::parallel::sequence::blocks {

BlockPlan plan_block(const std::vector<int64_t> &q_pos, const std::vector<int64_t> &k_pos, bool causal, int64_t seq_len,
                     const at::TensorOptions &device, const at::Tensor &documents) {
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
  const bool need_mask = max_k >= seq_len || (causal && min_q_box < max_k) || documents.defined();
  if (need_mask) {
    plan.causal_square = causal && !documents.defined() && max_k < seq_len && q1 - q0 == k1 - k0 &&
                         std::equal(q_pos.begin() + q0, q_pos.begin() + q1, k_pos.begin() + k0) &&
                         std::adjacent_find(q_pos.begin() + q0, q_pos.begin() + q1, std::greater_equal<>()) ==
                             q_pos.begin() + q1;
    auto idx = at::TensorOptions().dtype(at::kLong);
    at::Tensor qp = at::tensor(c10::ArrayRef<int64_t>(q_pos.data() + q0, q1 - q0), idx).to(device.device());
    at::Tensor kp = at::tensor(c10::ArrayRef<int64_t>(k_pos.data() + k0, k1 - k0), idx).to(device.device());
    at::Tensor allowed = (kp < seq_len).unsqueeze(0).expand({q1 - q0, k1 - k0});
    if (causal) allowed = allowed.logical_and(qp.unsqueeze(1) >= kp.unsqueeze(0));
    plan.mask = allowed;
    if (documents.defined()) {
      const at::Tensor doc_q = documents.index_select(1, qp), doc_k = documents.index_select(1, kp);  // (B, L)
      const at::Tensor same = doc_q.unsqueeze(2).eq(doc_k.unsqueeze(1)).logical_and(doc_k.ge(0).unsqueeze(1));
      const at::Tensor itself = qp.unsqueeze(1).eq(kp.unsqueeze(0)).unsqueeze(0);
      plan.mask = allowed.unsqueeze(0).logical_and(same.logical_or(itself)).unsqueeze(1);  // (B, 1, Lq, Lk)
    }
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

namespace {

// Scores of one block box, masked: (B, H, Lq, Lk).
at::Tensor block_scores(const at::Tensor &qb, const at::Tensor &kb, const BlockPlan &plan, double scale) {
  at::Tensor s = at::matmul(qb, kb.transpose(-2, -1)) * scale;
  if (plan.mask.defined()) s = s.masked_fill(plan.mask.logical_not(), kNegInf);
  return s;
}

}  // namespace

// lse with -inf (rows with no allowed key) replaced by 0, so exp(s - lse) is 0
// there instead of NaN.
at::Tensor finite_lse(const at::Tensor &lse) { return lse.masked_fill(lse == kNegInf, 0.0); }

at::ScalarType compute_type(at::ScalarType t) { return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t; }

namespace {

// Merges one block's (out, lse) over the box's query rows into the running
// (out, lse): the online-softmax step.
void merge_block(at::Tensor &out, at::Tensor &lse, int64_t q0, const at::Tensor &blk_out, const at::Tensor &blk_lse) {
  const int64_t lq = blk_out.size(2);
  at::Tensor old_lse = lse.narrow(2, q0, lq);
  at::Tensor new_lse = at::logaddexp(old_lse, blk_lse);
  at::Tensor base = finite_lse(new_lse);
  // In place, two passes over the output rows: rescale, then add the block's
  // share (blk_out in its own dtype, widened as it is read). The expression
  // form took five passes and two temporaries the size of the output, which
  // at 32K tokens cost as much as a third of the block kernels' time.
  at::Tensor old_out = out.narrow(2, q0, lq);
  old_out.mul_(at::exp(old_lse - base).unsqueeze(-1));
  old_out.addcmul_(blk_out, at::exp(blk_lse - base).unsqueeze(-1));
  old_lse.copy_(new_lse);
}

}  // namespace

bool BlockMath::fused(const at::Tensor &q, const BlockPlan &plan) const {
  return kernel == BlockKernel::Fused && (!plan.mask.defined() || plan.causal_square) && fused_block_supported(q);
}

void BlockMath::forward(const at::Tensor &q, const at::Tensor &kv, const BlockPlan &plan, at::Tensor &out,
                        at::Tensor &lse) const {
  if (plan.empty) return;
  const int64_t lq = plan.q1 - plan.q0, lk = plan.k1 - plan.k0;
  if (fused(q, plan)) {
    auto [blk_out, blk_lse] = fused_block_forward(q.narrow(2, plan.q0, lq), kv[0].narrow(2, plan.k0, lk),
                                                  kv[1].narrow(2, plan.k0, lk), plan.causal_square, scale);
    merge_block(out, lse, plan.q0, blk_out, blk_lse.to(lse.scalar_type()));
    return;
  }
  const auto ct = out.scalar_type();
  at::Tensor qb = q.narrow(2, plan.q0, lq).to(ct);
  at::Tensor kb = expand_kv(kv[0].narrow(2, plan.k0, lk).to(ct), groups);
  at::Tensor vb = expand_kv(kv[1].narrow(2, plan.k0, lk).to(ct), groups);
  at::Tensor s = block_scores(qb, kb, plan, scale);
  at::Tensor blk_lse = at::logsumexp(s, -1);                                            // (B, H, Lq)
  at::Tensor blk_out = at::matmul(at::exp(s - finite_lse(blk_lse).unsqueeze(-1)), vb);  // (B, H, Lq, D)
  merge_block(out, lse, plan.q0, blk_out, blk_lse);
}

BackwardRows BackwardRows::make(const at::Tensor &q, const at::Tensor &dout, const at::Tensor &out,
                                const at::Tensor &lse) {
  BackwardRows rows;
  rows.q = q;
  rows.dout = dout.to(q.scalar_type());
  rows.out = out.to(q.scalar_type());
  rows.lse = lse;
  rows.lse_safe = finite_lse(lse);
  rows.delta = (rows.dout.to(out.scalar_type()) * out).sum(-1);
  return rows;
}

std::pair<at::Tensor, at::Tensor> BlockMath::backward(const BackwardRows &rows, const at::Tensor &kv,
                                                      const BlockPlan &plan, at::Tensor &dq) const {
  if (plan.empty) return {};
  const int64_t lq = plan.q1 - plan.q0, lk = plan.k1 - plan.k0;
  if (fused(rows.q, plan)) {
    auto [dqb, dkb, dvb] = fused_block_backward(
        rows.dout.narrow(2, plan.q0, lq), rows.q.narrow(2, plan.q0, lq), kv[0].narrow(2, plan.k0, lk),
        kv[1].narrow(2, plan.k0, lk), rows.out.narrow(2, plan.q0, lq), rows.lse.narrow(2, plan.q0, lq),
        plan.causal_square, scale);
    dq.narrow(2, plan.q0, lq).add_(dqb);
    return {dkb, dvb};
  }
  const auto ct = dq.scalar_type();
  at::Tensor qb = rows.q.narrow(2, plan.q0, lq).to(ct), dob = rows.dout.narrow(2, plan.q0, lq).to(ct);
  at::Tensor kb = expand_kv(kv[0].narrow(2, plan.k0, lk).to(ct), groups);
  at::Tensor vb = expand_kv(kv[1].narrow(2, plan.k0, lk).to(ct), groups);
  at::Tensor p = at::exp(block_scores(qb, kb, plan, scale) - rows.lse_safe.narrow(2, plan.q0, lq).unsqueeze(-1));
  at::Tensor dvb = reduce_kv(at::matmul(p.transpose(-2, -1), dob), groups);
  at::Tensor dp = at::matmul(dob, vb.transpose(-2, -1));
  at::Tensor ds = p * (dp - rows.delta.narrow(2, plan.q0, lq).unsqueeze(-1)) * scale;
  dq.narrow(2, plan.q0, lq).add_(at::matmul(ds, kb));
  at::Tensor dkb = reduce_kv(at::matmul(ds.transpose(-2, -1), qb), groups);
  return {dkb, dvb};
}

void add_block_grads(at::Tensor &dkv, const BlockPlan &plan, const std::pair<at::Tensor, at::Tensor> &grads) {
  if (plan.empty) return;
  const int64_t lk = plan.k1 - plan.k0;
  dkv[0].narrow(2, plan.k0, lk).add_(grads.first);
  dkv[1].narrow(2, plan.k0, lk).add_(grads.second);
}

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

}  // namespace colossus::parallel::sequence::blocks
