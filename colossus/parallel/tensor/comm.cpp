#include "colossus/parallel/tensor/comm.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>

namespace colossus::parallel::tensor {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group outlives every graph built with it (the plugin owns the mesh), so
// autograd contexts keep a plain pointer to it, stored as an integer IValue.
void save_group(AutogradContext* ctx, cluster::ProcessGroup* group) {
  ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(group));
}
cluster::ProcessGroup& saved_group(AutogradContext* ctx) {
  return *reinterpret_cast<cluster::ProcessGroup*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

at::Tensor all_reduce_copy(const at::Tensor& x, cluster::ProcessGroup& group) {
  at::Tensor out = x.contiguous().clone();
  if (group.size() > 1) group.all_reduce(out).wait();
  return out;
}

// x: (..., n) -> (..., n * size), rank r's block at [r*n, (r+1)*n).
at::Tensor gather_last(const at::Tensor& x, cluster::ProcessGroup& group) {
  if (group.size() == 1) return x;
  at::Tensor local = x.contiguous();
  std::vector<int64_t> stacked_shape{group.size()};
  for (int64_t s : local.sizes()) stacked_shape.push_back(s);
  at::Tensor stacked = at::empty(stacked_shape, local.options());
  group.all_gather_into(stacked.view({-1}), local.view({-1})).wait();
  std::vector<int64_t> out_shape(local.sizes().begin(), local.sizes().end());
  out_shape.back() *= group.size();
  return stacked.movedim(0, -2).reshape(out_shape);
}

at::Tensor slice_last(const at::Tensor& x, cluster::ProcessGroup& group) {
  const int64_t width = x.size(-1);
  TORCH_CHECK(width % group.size() == 0, "scatter_last_dim: last dim ", width, " does not divide over ", group.size(),
              " ranks");
  const int64_t local = width / group.size();
  return x.narrow(-1, group.rank() * local, local).contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, cluster::ProcessGroup* group) {
    save_group(ctx, group);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduce_copy(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, cluster::ProcessGroup* group) {
    return all_reduce_copy(x, *group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct GatherLastDim : torch::autograd::Function<GatherLastDim> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, cluster::ProcessGroup* group) {
    save_group(ctx, group);
    return gather_last(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {slice_last(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct ScatterLastDim : torch::autograd::Function<ScatterLastDim> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, cluster::ProcessGroup* group) {
    save_group(ctx, group);
    return slice_last(x, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gather_last(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct SumReplicaGrads : torch::autograd::Function<SumReplicaGrads> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, int64_t slot, int64_t slots,
                            cluster::ProcessGroup* group) {
    save_group(ctx, group);
    ctx->saved_data["slot"] = slot;
    ctx->saved_data["slots"] = slots;
    return weight.view_as(weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    cluster::ProcessGroup& group = saved_group(ctx);
    const int64_t slot = ctx->saved_data["slot"].toInt(), slots = ctx->saved_data["slots"].toInt();
    const at::Tensor& grad = grads[0];
    // Each rank writes its gradient into its replica set's slot of a buffer
    // holding every slot; one all-reduce then sums each set's members.
    std::vector<int64_t> shape{slots};
    for (int64_t s : grad.sizes()) shape.push_back(s);
    at::Tensor all = at::zeros(shape, grad.options());
    all[slot].copy_(grad);
    if (group.size() > 1) group.all_reduce(all).wait();
    return {all[slot].clone(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_region(const at::Tensor& x, cluster::ProcessGroup& group) {
  if (group.size() == 1) return x;
  return CopyToRegion::apply(x, &group);
}

at::Tensor reduce_from_region(const at::Tensor& x, cluster::ProcessGroup& group) {
  if (group.size() == 1) return x;
  return ReduceFromRegion::apply(x, &group);
}

at::Tensor gather_last_dim(const at::Tensor& x, cluster::ProcessGroup& group) {
  if (group.size() == 1) return x;
  return GatherLastDim::apply(x, &group);
}

at::Tensor scatter_last_dim(const at::Tensor& x, cluster::ProcessGroup& group) {
  if (group.size() == 1) return x;
  return ScatterLastDim::apply(x, &group);
}

at::Tensor sum_replica_grads(const at::Tensor& weight, int64_t slot, int64_t slots, cluster::ProcessGroup& group) {
  if (group.size() == 1) return weight;
  return SumReplicaGrads::apply(weight, slot, slots, &group);
}

}  // namespace colossus::parallel::tensor
