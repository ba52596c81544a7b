#include "colossus/parallel/sequence/ulysses.h"

#include "colossus/core/errors.h"
#include "colossus/parallel/sequence/ring_attention.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <optional>

namespace colossus::parallel::sequence {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x: (B, H, Tl, D) -> (B, H/sp, sp*Tl, D). Rank j's send row j is our heads
// slice j; the row received from rank j is its sequence slice of our heads.
at::Tensor seq_to_head_impl(const at::Tensor &x, cluster::ProcessGroup &group) {
  const int64_t sp = group.size(), b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  if (sp == 1) return x.clone();
  at::Tensor in = x.reshape({b, sp, h / sp, t, d}).permute({1, 0, 2, 3, 4}).contiguous();
  at::Tensor out = at::empty_like(in);
  group.all_to_all(out, in).wait();  // (sp, B, H/sp, Tl, D), row j = sequence slice j
  return out.permute({1, 2, 0, 3, 4}).reshape({b, h / sp, sp * t, d});
}

// x: (B, Hl, T, D) -> (B, Hl*sp, T/sp, D).
at::Tensor head_to_seq_impl(const at::Tensor &x, cluster::ProcessGroup &group) {
  const int64_t sp = group.size(), b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  if (sp == 1) return x.clone();
  at::Tensor in = x.reshape({b, h, sp, t / sp, d}).permute({2, 0, 1, 3, 4}).contiguous();
  at::Tensor out = at::empty_like(in);
  group.all_to_all(out, in).wait();  // (sp, B, Hl, T/sp, D), row j = head slice j
  return out.permute({1, 0, 2, 3, 4}).reshape({b, sp * h, t / sp, d});
}

cluster::ProcessGroup &group_of(AutogradContext *ctx) {
  return *reinterpret_cast<cluster::ProcessGroup *>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}
void save_group(AutogradContext *ctx, cluster::ProcessGroup *group) {
  ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
}

struct SequenceToHead : torch::autograd::Function<SequenceToHead> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, cluster::ProcessGroup *group) {
    save_group(ctx, group);
    return seq_to_head_impl(x, *group);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    return {head_to_seq_impl(grads[0], group_of(ctx)), at::Tensor()};
  }
};

struct HeadToSequence : torch::autograd::Function<HeadToSequence> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, cluster::ProcessGroup *group) {
    save_group(ctx, group);
    return head_to_seq_impl(x, *group);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    return {seq_to_head_impl(grads[0], group_of(ctx)), at::Tensor()};
  }
};

// (B, H_kv, T, D) -> (B, H_kv * groups, T, D): each kv head repeated for the
// `groups` query heads that read it (autograd sums the copies' gradients).
at::Tensor repeat_kv_heads(const at::Tensor &x, int64_t groups) {
  if (groups == 1) return x;
  return x.unsqueeze(2)
      .expand({x.size(0), x.size(1), groups, x.size(2), x.size(3)})
      .reshape({x.size(0), x.size(1) * groups, x.size(2), x.size(3)});
}

}  // namespace

at::Tensor sequence_to_head(const at::Tensor &x, cluster::ProcessGroup &group) {
  if (x.dim() != 4 || x.size(1) % group.size() != 0)
    throw ConfigError(
        fmt::format("sequence_to_head: x {} must be (B, H, "
                    "T_local, D) with H divisible by sp={}",
                    c10::str(x.sizes()), group.size()));
  return SequenceToHead::apply(x, &group);
}

at::Tensor head_to_sequence(const at::Tensor &x, cluster::ProcessGroup &group) {
  if (x.dim() != 4 || x.size(2) % group.size() != 0)
    throw ConfigError(
        fmt::format("head_to_sequence: x {} must be (B, H_local, "
                    "T, D) with T divisible by sp={}",
                    c10::str(x.sizes()), group.size()));
  return HeadToSequence::apply(x, &group);
}

at::Tensor ulysses_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                             cluster::ProcessGroup &group, const UlyssesOptions &options) {
  const int64_t sp = group.size();
  if (q.dim() != 4 || k.dim() != 4 || !k.sizes().equals(v.sizes()) || q.size(0) != k.size(0) ||
      q.size(2) != k.size(2) || q.size(3) != k.size(3) || q.size(1) % k.size(1) != 0)
    throw ConfigError(
        fmt::format("ulysses attention: q {} and k/v {}/{} must be (B, H, T_local, D) and "
                    "(B, H_kv, "
                    "T_local, D) with equal B, T_local, D and H a multiple of H_kv",
                    c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes())));
  if (q.size(1) % sp != 0)
    throw ConfigError(
        fmt::format("ulysses (all_to_all) attention: {} query heads are not "
                    "divisible by sp={}; use an sp size that divides the "
                    "head count, or sequence_parallelism_mode \"ring_attn\"",
                    q.size(1), sp));
  // Fewer kv heads than sp (GQA): give every query head its own copy of its
  // kv head, so the heads split evenly.
  at::Tensor k_split = k, v_split = v;
  if (k.size(1) % sp != 0) {
    k_split = repeat_kv_heads(k, q.size(1) / k.size(1));
    v_split = repeat_kv_heads(v, q.size(1) / k.size(1));
  }
  const int64_t total = q.size(2) * sp;
  if (options.seq_len > total)
    throw ConfigError(fmt::format("ulysses attention: seq_len {} does not fit sp={} shards of {} tokens",
                                  options.seq_len, sp, q.size(2)));
  at::Tensor qh = sequence_to_head(q, group), kh = sequence_to_head(k_split, group),
             vh = sequence_to_head(v_split, group);
  // Padding is at the end: causal attention never lets a real query see it,
  // so only non-causal attention with padding needs a key mask.
  const bool padded = options.seq_len >= 0 && options.seq_len < total;
  const bool masked = options.mask.defined();
  if (masked && (options.mask.dim() != 4 || options.mask.size(2) != total || options.mask.size(3) != total)) {
    throw ConfigError(fmt::format("ulysses attention: the mask {} must be (B, 1, {}, {}) over the padded sequence",
                                  c10::str(options.mask.sizes()), total, total));
  }
  at::Tensor out;
  if (padded && !options.causal && !masked) {
    out = reference_attention(qh, kh, vh, false, options.scale, options.seq_len);
  } else {
    const int64_t groups = qh.size(1) / kh.size(1);
    std::optional<double> scale;
    if (options.scale > 0) scale = options.scale;
    // A mask (padded / packed rows) holds causality itself.
    out = at::scaled_dot_product_attention(qh, repeat_kv_heads(kh, groups), repeat_kv_heads(vh, groups),
                                           masked ? std::optional<at::Tensor>(options.mask.to(qh.device()))
                                                  : std::nullopt,
                                           0.0, options.causal && !masked, scale);
  }
  return head_to_sequence(out, group);
}

}  // namespace colossus::parallel::sequence
