// Ring attention without a ring: the one-process simulation of its blocks
// (blockwise_ring_attention, for tests and benchmarks) and the plain
// single-process reference attention.
#include "colossus/core/errors.h"
#include "colossus/parallel/sequence/ring_attention.h"
#include "colossus/parallel/sequence/ring_blocks.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <vector>

namespace colossus::parallel::sequence {

namespace {

using namespace blocks;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
                      g.causal, g.seq_len, options, g.documents);
  }

  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                            Geometry g) {
    const auto ct = compute_type(q.scalar_type());
    std::vector<at::Tensor> qs = shards(q, g, q.scalar_type()), kvs = kv_shards(k, v, g), outs, lses;
    for (int64_t r = 0; r < g.sp; ++r) {
      const auto b = q.size(0), h = q.size(1), d = q.size(3);
      at::Tensor out = at::zeros({b, h, g.local_len, d}, qs[r].options().dtype(ct));
      at::Tensor lse = at::full({b, h, g.local_len}, kNegInf, qs[r].options().dtype(ct));
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
    ctx->saved_data["documents"] = g.documents;
    ctx->saved_data["kernel"] = static_cast<int64_t>(g.kernel);
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
               sp,
               ctx->saved_data["documents"].toTensor(),
               static_cast<BlockKernel>(ctx->saved_data["kernel"].toInt())};
    const auto ct = compute_type(q.scalar_type());
    const auto it = q.scalar_type();
    std::vector<at::Tensor> qs = shards(q, g, it), kvs = kv_shards(k, v, g), douts = shards(grads[0], g, it);
    std::vector<at::Tensor> outs = shards(saved[3], g, ct), lses = shards(saved[4].unsqueeze(-1), g, ct);
    std::vector<at::Tensor> dqs, dkvs;
    for (int64_t r = 0; r < sp; ++r) dkvs.push_back(at::zeros(kvs[r].sizes(), kvs[r].options().dtype(ct)));
    for (int64_t r = 0; r < sp; ++r) {
      const BackwardRows rows = BackwardRows::make(qs[r], douts[r], outs[r], lses[r].squeeze(-1));
      at::Tensor dq = at::zeros_like(qs[r], qs[r].options().dtype(ct));
      for (int64_t s = 0; s < sp; ++s) {
        const int64_t src = (r - s + sp) % sp;
        BlockPlan p = plan(g, r, src, qs[r].options());
        add_block_grads(dkvs[src], p, g.math().backward(rows, kvs[src], p, dq));
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

}  // namespace

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
             sp,
             options.documents,
             options.block_kernel};
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
