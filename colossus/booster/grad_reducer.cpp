#include "colossus/booster/grad_reducer.h"

#include "colossus/cluster/fp8_collectives.h"

#include "colossus/core/errors.h"
#include "colossus/models/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace colossus::booster {

namespace {

class ReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(GradReducer* reducer, size_t index) : reducer_(reducer), index_(index) {}
  void operator()(const torch::autograd::Variable&) override { reducer_->on_grad_ready(index_); }

 private:
  GradReducer* reducer_;
  size_t index_;
};

}  // namespace

GradReducer::GradReducer(NamedParams params, cluster::ProcessGroupPtr group, GradReducerOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  if (options_.bucket_cap_mb <= 0) {
    throw ConfigError(fmt::format("bucket_cap_mb={} must be positive (torch's default is 25)", options_.bucket_cap_mb));
  }
  const auto cap_bytes = static_cast<int64_t>(options_.bucket_cap_mb * 1024 * 1024);
  bucket_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  // Reverse order: the last layers' gradients arrive first in backward.
  for (size_t k = params_.size(); k-- > 0;) {
    const auto& p = params_[k].second;
    if (!p.requires_grad()) continue;
    bool fits = false;
    if (!buckets_.empty()) {
      auto& last = buckets_.back();
      const auto& first = params_[last.params.front()].second;
      int64_t bytes = (last.offsets.back() + params_[last.params.back()].second.numel() + p.numel()) * p.element_size();
      fits = first.scalar_type() == p.scalar_type() && first.device() == p.device() && bytes <= cap_bytes;
    }
    if (!fits) buckets_.emplace_back();
    auto& bucket = buckets_.back();
    int64_t offset = bucket.params.empty() ? 0 : bucket.offsets.back() + params_[bucket.params.back()].second.numel();
    bucket.params.push_back(k);
    bucket.offsets.push_back(offset);
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (auto& bucket : buckets_) {
    const auto& last = params_[bucket.params.back()].second;
    bucket.buffer = at::zeros({bucket.offsets.back() + last.numel()}, last.options().requires_grad(false));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& p = params_[k].second;
    if (!p.requires_grad()) continue;
    if (options_.gradient_as_bucket_view) {
      if (p.grad().defined()) slot(k).copy_(p.grad().reshape({-1}));
      p.mutable_grad() = slot(k).view(p.sizes());
    }
    torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<ReadyHook>(this, k));
  }
}

GradReducer::~GradReducer() {
  for (auto& [name, p] : params_) {
    if (p.requires_grad()) torch::autograd::impl::post_acc_grad_hooks(p).reset();
  }
}

std::vector<std::vector<std::string>> GradReducer::bucket_layout() const {
  std::vector<std::vector<std::string>> layout;
  for (const auto& bucket : buckets_) {
    layout.emplace_back();
    for (size_t k : bucket.params) layout.back().push_back(params_[k].first);
  }
  return layout;
}

at::Tensor GradReducer::slot(size_t param_index) const {
  const auto& bucket = buckets_[bucket_of_[param_index]];
  size_t position = 0;
  while (bucket.params[position] != param_index) ++position;
  return bucket.buffer.narrow(0, bucket.offsets[position], params_[param_index].second.numel());
}

void GradReducer::start_backward() {
  in_backward_ = true;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.params.size();
    bucket.launched = false;
  }
  next_to_launch_ = 0;
  launched_during_backward_ = 0;
  models::queue_outer_backward_callback([this] { finish_backward(); });
}

void GradReducer::on_grad_ready(size_t param_index) {
  if (!sync_enabled_) return;
  if (!in_backward_) start_backward();
  if (ready_[param_index]) {
    throw DistError(fmt::format("parameter '{}' received its gradient twice in one backward; DDP needs each "
                                "parameter used once per forward (or accumulate with no_sync)",
                                params_[param_index].first));
  }
  ready_[param_index] = true;
  auto& p = params_[param_index].second;
  auto dst = slot(param_index);
  const auto& grad = p.grad();
  if (grad.data_ptr() != dst.data_ptr()) {
    dst.copy_(grad.reshape({-1}));
    if (options_.gradient_as_bucket_view) p.mutable_grad() = dst.view(p.sizes());
  }
  auto& bucket = buckets_[bucket_of_[param_index]];
  if (--bucket.pending == 0) {
    launch_in_order();
    launched_during_backward_ = static_cast<int>(next_to_launch_);
  }
}

void GradReducer::launch_in_order() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    auto& bucket = buckets_[next_to_launch_];
    const auto op = options_.sum_scale > 0 ? cluster::ReduceOp::Sum : cluster::ReduceOp::Avg;
    if (options_.fp8_communication) {
      cluster::all_reduce_fp8(*group_, bucket.buffer, op);
    } else {
      bucket.work = group_->all_reduce(bucket.buffer, op);
    }
    bucket.launched = true;
    ++next_to_launch_;
  }
}

void GradReducer::finish_backward() {
  if (!in_backward_) return;
  in_backward_ = false;
  std::vector<std::string> missing;
  std::vector<size_t> unused;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (params_[k].second.requires_grad() && !ready_[k]) {
      missing.push_back(params_[k].first);
      unused.push_back(k);
    }
  }
  at::Tensor used_anywhere;
  if (!missing.empty()) {
    if (!options_.find_unused_parameters) {
      throw DistError(fmt::format("these parameters got no gradient in this backward: {}; pass "
                                  "find_unused_parameters = true to the DDP plugin if the model skips them on purpose",
                                  fmt::join(missing, ", ")));
    }
  }
  if (options_.find_unused_parameters) {
    // Which parameters got a gradient on any rank: the others keep no grad, as in torch.
    used_anywhere = at::zeros({static_cast<int64_t>(params_.size())}, at::kInt);
    auto* used = used_anywhere.data_ptr<int32_t>();
    for (size_t k = 0; k < params_.size(); ++k) used[k] = ready_[k] ? 1 : 0;
    auto device_mask = used_anywhere.to(buckets_.empty() ? at::Device(at::kCPU) : buckets_[0].buffer.device());
    group_->all_reduce(device_mask, cluster::ReduceOp::Max).wait();
    used_anywhere = device_mask.cpu();
    for (size_t k : unused) {
      slot(k).zero_();
      --buckets_[bucket_of_[k]].pending;
    }
  }
  launch_in_order();
  for (auto& bucket : buckets_) {
    bucket.work.wait();
    if (options_.sum_scale > 0 && options_.sum_scale != 1.0) bucket.buffer.mul_(options_.sum_scale);
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    auto& p = params_[k].second;
    if (!p.requires_grad()) continue;
    if (used_anywhere.defined() && used_anywhere.data_ptr<int32_t>()[k] == 0) continue;
    auto reduced = slot(k).view(p.sizes());
    if (options_.gradient_as_bucket_view) {
      p.mutable_grad() = reduced;
    } else if (p.grad().defined()) {
      p.mutable_grad().copy_(reduced);
    } else {
      p.mutable_grad() = reduced.clone();
    }
  }
}

}  // namespace colossus::booster
