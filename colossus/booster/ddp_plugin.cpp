#include "colossus/booster/ddp_plugin.h"

#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <map>

namespace colossus::booster {

void DDPPluginOptions::validate() const {
  if (!(bucket_cap_mb > 0)) {
    throw ConfigError(fmt::format("ddp.bucket_cap_mb = {} must be positive (default 25)", bucket_cap_mb));
  }
}

void broadcast_tensors(const std::vector<at::Tensor>& tensors, cluster::ProcessGroup& group, int src) {
  if (group.size() == 1) return;
  c10::NoGradGuard no_grad;
  // Packed per dtype and device, a bucket at most this big (or one tensor):
  // few collectives, and the staging copy never doubles a model's memory.
  constexpr int64_t kBucketBytes = int64_t{64} << 20;
  std::map<std::pair<int, std::string>, std::vector<at::Tensor>> by_kind;
  for (const auto& t : tensors) {
    // Lazy (meta) tensors hold no values: every rank materialises them alike.
    if (t.is_meta() || t.numel() == 0) continue;
    by_kind[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  }
  auto send = [&](const std::vector<at::Tensor>& members) {
    if (members.size() == 1 && members.front().is_contiguous()) {  // in place, no staging copy
      at::Tensor whole = members.front().detach().view({-1});
      group.broadcast(whole, src).wait();
      return;
    }
    std::vector<at::Tensor> flat;
    for (const auto& t : members) flat.push_back(t.detach().reshape({-1}));
    auto packed = at::cat(flat);
    group.broadcast(packed, src).wait();
    int64_t offset = 0;
    for (const auto& t : members) {
      t.detach().copy_(packed.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  };
  for (auto& [kind, members] : by_kind) {
    std::vector<at::Tensor> bucket;
    int64_t bytes = 0;
    for (const auto& t : members) {
      if (!bucket.empty() && bytes + static_cast<int64_t>(t.nbytes()) > kBucketBytes) {
        send(bucket);
        bucket.clear();
        bytes = 0;
      }
      bucket.push_back(t);
      bytes += static_cast<int64_t>(t.nbytes());
    }
    if (!bucket.empty()) send(bucket);
  }
}

DDPModel::DDPModel(std::shared_ptr<models::CausalLM> model, cluster::ProcessGroupPtr group,
                   const DDPPluginOptions& options)
    : model_(std::move(model)), group_(std::move(group)), broadcast_buffers_(options.broadcast_buffers) {
  std::vector<at::Tensor> params;
  GradReducer::NamedParams named;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    params.push_back(item.value());
    named.emplace_back(item.key(), item.value());
  }
  broadcast_tensors(params, *group_);
  sync_buffers();
  reducer_ = std::make_unique<GradReducer>(
      std::move(named), group_,
      GradReducerOptions{.bucket_cap_mb = options.bucket_cap_mb,
                         .gradient_as_bucket_view = options.gradient_as_bucket_view,
                         .find_unused_parameters = options.find_unused_parameters,
                         .fp8_communication = options.fp8_communication});
}

at::Tensor DDPModel::forward(const at::Tensor& input_ids, const models::TokenLayout& layout) {
  if (broadcast_buffers_) sync_buffers();
  return model_->forward(input_ids, layout);
}

at::Tensor DDPModel::forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                                 std::optional<int64_t> num_items, const models::TokenLayout& layout) {
  if (broadcast_buffers_) sync_buffers();
  return model_->forward_loss(input_ids, labels, num_items, layout);
}

void DDPModel::sync_buffers() {
  std::vector<at::Tensor> buffers;
  for (const auto& item : model_->named_buffers(/*recurse=*/true)) buffers.push_back(item.value());
  if (!buffers.empty()) broadcast_tensors(buffers, *group_);
}

DDPPlugin::DDPPlugin(DDPPluginOptions options, cluster::ProcessGroupPtr group)
    : options_(options), group_(group ? std::move(group) : cluster::current_cluster().world) {
  options_.validate();
}

std::shared_ptr<ModelWrapper> DDPPlugin::wrap_model(std::shared_ptr<models::CausalLM> model) {
  return std::make_shared<DDPModel>(std::move(model), group_, options_);
}

}  // namespace colossus::booster
