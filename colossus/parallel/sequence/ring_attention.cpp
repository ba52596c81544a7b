#include "colossus/parallel/sequence/ring_attention.h"

#include "colossus/core/errors.h"
#include "colossus/parallel/sequence/ring_blocks.h"

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

using namespace blocks;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kTagKv = 71, kTagGradKv = 72, kTagOuterKv = 73, kTagOuterGradKv = 74;

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
  const at::Tensor &q = q_in;
  const auto ct = compute_type(q.scalar_type());
  const auto b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  at::Tensor out = at::zeros({b, h, t, d}, q.options().dtype(ct));
  at::Tensor lse = at::full({b, h, t}, kNegInf, q.options().dtype(ct));
  const std::vector<int64_t> q_pos = local_positions(t, g.sp, g.rank, g.layout);
  at::Tensor outer_kv = at::stack({k, v}).contiguous();  // (2, B, H_kv, T, D)
  for (int64_t o = 0; o < g.outer(); ++o) {
    std::optional<Exchange> outer_ex;
    if (o + 1 < g.outer()) outer_ex = start_exchange(outer_kv, group, g.outer_next(), g.outer_prev(), kTagOuterKv);
    at::Tensor kv = outer_kv;
    for (int64_t s = 0; s < g.inner; ++s) {
      std::optional<Exchange> ex;
      if (s + 1 < g.inner) ex = start_exchange(kv, group, g.inner_next(), g.inner_prev(), kTagKv);
      BlockPlan plan = plan_block(q_pos, local_positions(t, g.sp, g.source(o, s), g.layout), g.causal, g.seq_len,
                                  q.options(), g.documents);
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
  const at::Tensor &q = q_in;
  const auto ct = compute_type(q.scalar_type());
  const int64_t t = q.size(2);
  const BackwardRows rows = BackwardRows::make(q, dout_in, out, lse);
  at::Tensor dq = at::zeros_like(q, q.options().dtype(ct));
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
      BlockPlan plan = plan_block(q_pos, local_positions(t, g.sp, g.source(o, s), g.layout), g.causal, g.seq_len,
                                  q.options(), g.documents);
      auto grads = g.math().backward(rows, kv, plan, dq);
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
    ctx->saved_data["documents"] = g.documents;
    ctx->saved_data["kernel"] = static_cast<int64_t>(g.kernel);
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
               ctx->saved_data["inner"].toInt(),
               ctx->saved_data["documents"].toTensor(),
               static_cast<BlockKernel>(ctx->saved_data["kernel"].toInt())};
    variable_list d = ring_backward(saved[0], saved[1], saved[2], saved[3], saved[4], grads[0], group, g);
    return {d[0].to(saved[0].scalar_type()), d[1].to(saved[1].scalar_type()), d[2].to(saved[2].scalar_type()),
            at::Tensor(), at::Tensor()};
  }
};

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
             options.inner_ring_size == 0 ? sp : options.inner_ring_size,
             options.documents,
             options.block_kernel};
  if (options.documents.defined() &&
      (options.documents.dim() != 2 || options.documents.size(0) != q.size(0) || options.documents.size(1) != total))
    throw ConfigError(fmt::format("ring attention: documents {} must be (B, T_local * sp) = ({}, {})",
                                  c10::str(options.documents.sizes()), q.size(0), total));
  return RingAttentionFn::apply(q, k, v, &group, g);
}

}  // namespace colossus::parallel::sequence
