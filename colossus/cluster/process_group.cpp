#include "colossus/cluster/process_group.h"

#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"

#include <ATen/ops/full.h>

#include <fmt/format.h>

#include <mutex>

namespace colossus::cluster {

namespace {

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<c10::weak_intrusive_ptr<c10d::Backend>>& live_backends() {
  static std::vector<c10::weak_intrusive_ptr<c10d::Backend>> backends;
  return backends;
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return c10d::ReduceOp::SUM;
    case ReduceOp::Avg: return c10d::ReduceOp::AVG;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
    case ReduceOp::Product: return c10d::ReduceOp::PRODUCT;
  }
  throw DistError("unknown ReduceOp");
}

}  // namespace

void Work::wait() {
  if (impl_) impl_->wait();
}

bool Work::is_completed() { return !impl_ || impl_->isCompleted(); }

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Backend> backend, std::vector<int> global_ranks,
                           std::string name, SplitFn split_fn)
    : backend_(std::move(backend)),
      global_ranks_(std::move(global_ranks)),
      name_(std::move(name)),
      backend_name_(backend_->getBackendName()),
      split_fn_(std::move(split_fn)) {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    live_backends().emplace_back(backend_);
  }
  if (static_cast<int>(global_ranks_.size()) != backend_->getSize()) {
    throw DistError(fmt::format("group '{}' lists {} ranks but its backend has size {}", name_,
                                global_ranks_.size(), backend_->getSize()));
  }
}

int ProcessGroup::global_rank(int group_rank) const {
  check_peer(group_rank, "global_rank");
  return global_ranks_[group_rank];
}

void ProcessGroup::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size()) {
    throw DistError(fmt::format("{} on group '{}': rank {} is out of range, valid ranks are 0..{}",
                                what, name_, peer, size() - 1));
  }
}

ProcessGroupPtr ProcessGroup::split(int color, int key, const std::string& name) const {
  return split_fn_(*this, color, key, name);
}

Work ProcessGroup::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  return Work(backend_->allreduce(tensors, opts));
}

Work ProcessGroup::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  if (input.numel() != output.numel() * size()) {
    throw DistError(fmt::format(
        "reduce_scatter on group '{}': input has {} elements, expected size()*output = {}*{}",
        name_, input.numel(), size(), output.numel()));
  }
  at::Tensor out = output;
  at::Tensor in = input;
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = to_c10d(op);
  return Work(backend_->_reduce_scatter_base(out, in, opts));
}

Work ProcessGroup::all_gather_into(const at::Tensor& output_flat, const at::Tensor& input) {
  if (output_flat.numel() != input.numel() * size()) {
    throw DistError(fmt::format(
        "all_gather_into on group '{}': output has {} elements, expected size()*input = {}*{}",
        name_, output_flat.numel(), size(), input.numel()));
  }
  at::Tensor out = output_flat;
  at::Tensor in = input;
  return Work(backend_->_allgather_base(out, in));
}

Work ProcessGroup::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input) {
  if (static_cast<int>(outputs.size()) != size()) {
    throw DistError(fmt::format("all_gather on group '{}': got {} output tensors for {} ranks",
                                name_, outputs.size(), size()));
  }
  std::vector<std::vector<at::Tensor>> out{outputs};
  std::vector<at::Tensor> in{input};
  return Work(backend_->allgather(out, in));
}

Work ProcessGroup::broadcast(const at::Tensor& tensor, int src) {
  check_peer(src, "broadcast");
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = src;
  return Work(backend_->broadcast(tensors, opts));
}

Work ProcessGroup::all_to_all(const at::Tensor& output, const at::Tensor& input,
                              std::vector<int64_t> output_splits, std::vector<int64_t> input_splits) {
  for (auto* splits : {&output_splits, &input_splits}) {
    if (!splits->empty() && static_cast<int>(splits->size()) != size()) {
      throw DistError(fmt::format("all_to_all on group '{}': {} split sizes given for {} ranks",
                                  name_, splits->size(), size()));
    }
  }
  at::Tensor out = output;
  at::Tensor in = input;
  return Work(backend_->alltoall_base(out, in, output_splits, input_splits));
}

Work ProcessGroup::send(const at::Tensor& tensor, int dst, int tag) {
  check_peer(dst, "send");
  std::vector<at::Tensor> tensors{tensor};
  return Work(backend_->send(tensors, dst, tag));
}

Work ProcessGroup::recv(const at::Tensor& tensor, int src, int tag) {
  check_peer(src, "recv");
  std::vector<at::Tensor> tensors{tensor};
  return Work(backend_->recv(tensors, src, tag));
}

Work ProcessGroup::barrier() { return Work(backend_->barrier()); }

void shutdown_process_groups() {
  std::vector<c10::weak_intrusive_ptr<c10d::Backend>> backends;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    backends.swap(live_backends());
  }
  // Subgroups first (created later), the world last.
  for (auto it = backends.rbegin(); it != backends.rend(); ++it) {
    if (auto backend = it->lock()) backend->shutdown();
  }
}

c10::Device ProcessGroup::device() const {
  return backend_name_ == "nccl" ? current_cluster().device : c10::Device(c10::kCPU);
}

double ProcessGroup::all_reduce_scalar(double value, ReduceOp op) {
  if (size() == 1) return value;
  at::Tensor scalar = at::full({1}, value, at::TensorOptions(at::kDouble).device(device()));
  all_reduce(scalar, op).wait();
  return scalar.item<double>();
}

}  // namespace colossus::cluster
