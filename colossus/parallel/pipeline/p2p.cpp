#include "colossus/parallel/pipeline/p2p.h"

#include "colossus/core/errors.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace colossus::parallel::pipeline {

namespace {

constexpr int64_t kMaxDims = 8;
// Meta message: [ndim, dtype, size_0 .. size_{ndim-1}, 0...], int64.
constexpr int64_t kMetaLength = 2 + kMaxDims;

int data_tag(int channel) { return 2 * channel; }
int meta_tag(int channel) { return 2 * channel + 1; }

c10::Device device_for(const cluster::ProcessGroup& group, c10::Device preferred) {
  return group.backend_name() == "nccl" ? preferred : c10::Device(c10::kCPU);
}

}  // namespace

PipelineP2P::PipelineP2P(cluster::ProcessGroupPtr pp_group) : group_(std::move(pp_group)) {
  if (!group_) throw ConfigError("pipeline p2p: the pp group is null");
}

void PipelineP2P::send(const at::Tensor& tensor, int dst, int channel) {
  at::Tensor t = tensor.contiguous();
  const auto key = std::make_pair(dst, channel);
  const std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  auto it = send_shapes_.find(key);
  if (it == send_shapes_.end()) {
    if (static_cast<int64_t>(sizes.size()) > kMaxDims) {
      throw ConfigError(
          fmt::format("pipeline p2p: a tensor of {} dims; at most {} travel between stages", sizes.size(), kMaxDims));
    }
    at::Tensor host = at::zeros({kMetaLength}, at::kLong);
    int64_t* values = host.data_ptr<int64_t>();
    values[0] = static_cast<int64_t>(sizes.size());
    values[1] = static_cast<int64_t>(t.scalar_type());
    for (size_t d = 0; d < sizes.size(); ++d) values[2 + d] = sizes[d];
    at::Tensor meta = host.to(device_for(*group_, t.device()));
    sends_.push_back(group_->send(meta, dst, meta_tag(channel)));
    send_shapes_[key] = Meta{sizes, t.scalar_type()};
  } else if (it->second.sizes != sizes || it->second.dtype != t.scalar_type()) {
    throw ConfigError(
        fmt::format("pipeline p2p: channel {} to pp rank {} carried shape [{}] "
                    "and now [{}]; the microbatch shape changed "
                    "without reset_shapes()",
                    channel, dst, fmt::join(it->second.sizes, ", "), fmt::join(sizes, ", ")));
  }
  sends_.push_back(group_->send(t, dst, data_tag(channel)));
}

PipelineP2P::Pending PipelineP2P::post_recv(int src, int channel, c10::Device device) {
  const auto key = std::make_pair(src, channel);
  auto it = recv_shapes_.find(key);
  if (it == recv_shapes_.end()) {
    at::Tensor meta =
        at::zeros({kMetaLength}, at::TensorOptions().dtype(at::kLong).device(device_for(*group_, device)));
    group_->recv(meta, src, meta_tag(channel)).wait();
    at::Tensor host = meta.cpu();
    const int64_t* v = host.data_ptr<int64_t>();
    if (v[0] < 0 || v[0] > kMaxDims)
      throw DistError(fmt::format("pipeline p2p: a corrupt shape message ({} dims)", v[0]));
    Meta m;
    m.dtype = static_cast<c10::ScalarType>(v[1]);
    m.sizes.assign(v + 2, v + 2 + v[0]);
    it = recv_shapes_.emplace(key, std::move(m)).first;
  }
  Pending pending;
  pending.tensor = at::empty(it->second.sizes, at::TensorOptions().dtype(it->second.dtype).device(device));
  pending.work = group_->recv(pending.tensor, src, data_tag(channel));
  return pending;
}

void PipelineP2P::flush() {
  for (auto& work : sends_) work.wait();
  sends_.clear();
}

void PipelineP2P::reset_shapes() {
  flush();
  send_shapes_.clear();
  recv_shapes_.clear();
}

}  // namespace colossus::parallel::pipeline
