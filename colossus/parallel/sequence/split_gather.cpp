#include "colossus/parallel/sequence/split_gather.h"

#include "colossus/core/errors.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace colossus::parallel::sequence {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kTagGather = 81, kTagReduce = 82;

// The tp group outlives every graph built with it (the plugin owns the mesh).
void save_group(AutogradContext *ctx, cluster::ProcessGroup *group) {
  ctx->saved_data["group"] =
      static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
}
cluster::ProcessGroup &saved_group(AutogradContext *ctx) {
  return *reinterpret_cast<cluster::ProcessGroup *>(
      static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

// Tokens per rank; the sequence (dim 1) must split evenly.
int64_t local_length(const at::Tensor &x, cluster::ProcessGroup &group,
                     const char *what) {
  if (x.dim() < 2 || x.size(1) % group.size() != 0) {
    throw ConfigError(
        fmt::format("{}: the sequence of {} tokens (dim 1 of {}) does not "
                    "split over {} tensor-parallel ranks; pad it "
                    "to a multiple of {} (HybridParallelModel does)",
                    what, x.dim() < 2 ? 0 : x.size(1), c10::str(x.sizes()),
                    group.size(), group.size()));
  }
  return x.size(1) / group.size();
}

std::vector<int64_t> with_dim1(at::IntArrayRef sizes, int64_t length) {
  std::vector<int64_t> shape(sizes.begin(), sizes.end());
  shape[1] = length;
  return shape;
}

// (B, L, ...) -> (B, n*L, ...), rank r's rows at [r*L, (r+1)*L).
at::Tensor all_gather_seq(const at::Tensor &x, cluster::ProcessGroup &group) {
  const int64_t n = group.size();
  at::Tensor local = x.contiguous();
  std::vector<int64_t> stacked_shape{n};
  for (int64_t s : local.sizes())
    stacked_shape.push_back(s);
  at::Tensor stacked = at::empty(stacked_shape, local.options());
  group.all_gather_into(stacked.view({-1}), local.view({-1})).wait();
  return stacked.movedim(0, 1).reshape(
      with_dim1(local.sizes(), n * local.size(1)));
}

// (B, n*L, ...) -> (B, L, ...): the sum over ranks of rows [r*L, (r+1)*L).
at::Tensor reduce_scatter_seq(const at::Tensor &x,
                              cluster::ProcessGroup &group) {
  const int64_t n = group.size(),
                l = local_length(x, group, "reduce_scatter_sequence");
  std::vector<int64_t> split_shape = with_dim1(x.sizes(), l);
  split_shape.insert(split_shape.begin() + 1, n);
  at::Tensor chunks =
      x.reshape(split_shape).movedim(1, 0).contiguous(); // (n, B, L, ...)
  at::Tensor out = at::empty(with_dim1(x.sizes(), l), x.options());
  group.reduce_scatter(out.view({-1}), chunks.view({-1})).wait();
  return out;
}

int next_of(const cluster::ProcessGroup &g) {
  return (g.rank() + 1) % g.size();
}
int prev_of(const cluster::ProcessGroup &g) {
  return (g.rank() + g.size() - 1) % g.size();
}

// Sends `out` to the next rank and receives into `in` from the previous one.
// Even ranks post the send first, odd ranks the receive: with NCCL two ranks
// that both receive first from each other (tp = 2) would block each other's
// send behind their receive on one stream; MPI does not care.
void exchange(cluster::ProcessGroup &group, const at::Tensor &out,
              const at::Tensor &in, int tag, cluster::Work &send,
              cluster::Work &recv) {
  if (group.rank() % 2 == 0) {
    send = group.send(out, next_of(group), tag);
    recv = group.recv(in, prev_of(group), tag);
  } else {
    recv = group.recv(in, prev_of(group), tag);
    send = group.send(out, next_of(group), tag);
  }
}

// Ring all-gather: visit(src, chunk) sees every rank's chunk, its own first,
// while the next chunk is already on its way.
void ring_all_gather(
    const at::Tensor &mine, cluster::ProcessGroup &group,
    const std::function<void(int64_t, const at::Tensor &)> &visit) {
  const int64_t n = group.size(), r = group.rank();
  at::Tensor current = mine.contiguous();
  for (int64_t step = 0; step < n; ++step) {
    at::Tensor incoming;
    cluster::Work send, recv;
    if (step + 1 < n) {
      incoming = at::empty_like(current);
      exchange(group, current, incoming, kTagGather, send, recv);
    }
    visit((r - step + n) % n, current);
    if (step + 1 < n) {
      send.wait();
      recv.wait();
      current = incoming;
    }
  }
}

// Ring reduce-scatter: partial(c) is this rank's (fresh) contribution to
// chunk c; returns the sum over ranks of their partial(rank()). Step s
// computes chunk (r - s - 1), adds the running sum that arrived from the
// previous rank and sends it on, so after n steps each rank holds its own
// chunk's sum; the next step's matmul runs while a sum is in flight.
at::Tensor
ring_reduce_scatter(cluster::ProcessGroup &group,
                    const std::function<at::Tensor(int64_t)> &partial) {
  const int64_t n = group.size(), r = group.rank();
  std::vector<cluster::Work> sends;
  std::vector<at::Tensor>
      in_flight; // send buffers stay alive until their sends finish
  at::Tensor incoming;
  cluster::Work recv;
  for (int64_t step = 0;; ++step) {
    at::Tensor part = partial(((r - step - 1) % n + n) % n);
    if (step > 0) {
      recv.wait();
      part.add_(incoming);
    }
    if (step + 1 == n) {
      for (auto &send : sends)
        send.wait();
      return part;
    }
    part = part.contiguous();
    incoming = at::empty_like(part);
    sends.emplace_back();
    exchange(group, part, incoming, kTagReduce, sends.back(), recv);
    in_flight.push_back(part);
  }
}

// half/bfloat16 weight gradients are accumulated over chunks in float.
at::ScalarType accumulate_type(at::ScalarType t) {
  return (t == at::kHalf || t == at::kBFloat16) ? at::kFloat : t;
}

// rows: (..., L, f) -> (N, f) with N = every leading element.
at::Tensor flat_rows(const at::Tensor &x) {
  return x.reshape({-1, x.size(-1)});
}

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x,
                            cluster::ProcessGroup *group) {
    save_group(ctx, group);
    return all_gather_seq(x, *group);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    return {reduce_scatter_seq(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct ReduceScatterSequence
    : torch::autograd::Function<ReduceScatterSequence> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x,
                            cluster::ProcessGroup *group) {
    save_group(ctx, group);
    return reduce_scatter_seq(x, *group);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    return {all_gather_seq(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct RingGatherLinear : torch::autograd::Function<RingGatherLinear> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x,
                            const at::Tensor &weight,
                            cluster::ProcessGroup *group) {
    const int64_t n = group->size(), l = x.size(1);
    at::Tensor x_full = at::empty(with_dim1(x.sizes(), n * l), x.options());
    at::Tensor out;
    ring_all_gather(x, *group, [&](int64_t src, const at::Tensor &chunk) {
      at::Tensor y = at::linear(chunk, weight);
      if (!out.defined())
        out = at::empty(with_dim1(y.sizes(), n * l), y.options());
      out.narrow(1, src * l, l).copy_(y);
      x_full.narrow(1, src * l, l).copy_(chunk);
    });
    save_group(ctx, group);
    ctx->save_for_backward({x_full, weight});
    return out;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    cluster::ProcessGroup &group = saved_group(ctx);
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x_full = saved[0], &weight = saved[1];
    const at::Tensor dy = grads[0].contiguous();
    const int64_t l = x_full.size(1) / group.size();
    at::Tensor dw = at::zeros(
        weight.sizes(),
        weight.options().dtype(accumulate_type(weight.scalar_type())));
    at::Tensor dx = ring_reduce_scatter(group, [&](int64_t c) {
      at::Tensor dy_c = dy.narrow(1, c * l, l);
      dw.add_(at::matmul(flat_rows(dy_c).t(),
                         flat_rows(x_full.narrow(1, c * l, l))));
      return at::matmul(dy_c, weight); // (B, L, in)
    });
    return {dx, dw.to(weight.scalar_type()), at::Tensor()};
  }
};

struct RingLinearReduceScatter
    : torch::autograd::Function<RingLinearReduceScatter> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x,
                            const at::Tensor &weight,
                            cluster::ProcessGroup *group) {
    const int64_t l = x.size(1) / group->size();
    at::Tensor out = ring_reduce_scatter(*group, [&](int64_t c) {
      return at::linear(x.narrow(1, c * l, l), weight);
    });
    save_group(ctx, group);
    ctx->save_for_backward({x, weight});
    return out;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    cluster::ProcessGroup &group = saved_group(ctx);
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const int64_t l = x.size(1) / group.size();
    at::Tensor dx = at::empty(x.sizes(), x.options());
    at::Tensor dw = at::zeros(
        weight.sizes(),
        weight.options().dtype(accumulate_type(weight.scalar_type())));
    ring_all_gather(
        grads[0], group, [&](int64_t src, const at::Tensor &dy_src) {
          dx.narrow(1, src * l, l).copy_(at::matmul(dy_src, weight));
          dw.add_(at::matmul(flat_rows(dy_src).t(),
                             flat_rows(x.narrow(1, src * l, l))));
        });
    return {dx, dw.to(weight.scalar_type()), at::Tensor()};
  }
};

} // namespace

at::Tensor gather_sequence(const at::Tensor &x, cluster::ProcessGroup &group) {
  if (group.size() == 1)
    return x;
  return GatherSequence::apply(x, &group);
}

at::Tensor reduce_scatter_sequence(const at::Tensor &x,
                                   cluster::ProcessGroup &group) {
  if (group.size() == 1)
    return x;
  local_length(x, group, "reduce_scatter_sequence");
  return ReduceScatterSequence::apply(x, &group);
}

at::Tensor ring_gather_linear(const at::Tensor &x, const at::Tensor &weight,
                              const at::Tensor &bias,
                              cluster::ProcessGroup &group) {
  if (group.size() == 1)
    return at::linear(x, weight, bias);
  if (x.dim() < 2)
    throw ConfigError(fmt::format(
        "ring_gather_linear: x {} has no sequence dim", c10::str(x.sizes())));
  // Autograd functions take no undefined inputs: the bias is added outside.
  at::Tensor y = RingGatherLinear::apply(x, weight, &group);
  return bias.defined() ? y + bias : y;
}

at::Tensor ring_linear_reduce_scatter(const at::Tensor &x,
                                      const at::Tensor &weight,
                                      cluster::ProcessGroup &group) {
  if (group.size() == 1)
    return at::linear(x, weight);
  local_length(x, group, "ring_linear_reduce_scatter");
  return RingLinearReduceScatter::apply(x, weight, &group);
}

} // namespace colossus::parallel::sequence
