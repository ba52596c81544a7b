// LowLevelZeroOptimizer: flattening and sharding at construction, the
// reduce-scatter driven by gradient hooks, and the step (unscale, overflow
// check, clipping over the shards, inner step, all-gather). The unsharded
// state_dict lives in low_level_zero_state.cpp.
#include "colossus/zero/low_level/low_level_zero_optimizer.h"

#include "colossus/cluster/fp8_collectives.h"

#include "colossus/amp/clip_grad.h"
#include "colossus/amp/unscale.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/core/precision.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/optim/hybrid_adam.h"
#include "colossus/optim/lamb.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace colossus::zero {

namespace {

class ReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(LowLevelZeroOptimizer* owner, size_t index) : owner_(owner), index_(index) {}
  void operator()(const torch::autograd::Variable&) override { owner_->on_grad_ready(index_); }

 private:
  LowLevelZeroOptimizer* owner_;
  size_t index_;
};

const optim::Optimizer& require(const std::unique_ptr<optim::Optimizer>& inner) {
  if (!inner)
    throw ConfigError("LowLevelZeroOptimizer: the inner optimizer is null; pass e.g. std::make_unique<AdamW>(...)");
  return *inner;
}

// One layout over all shard groups: each group's parameters packed by
// plan_layout over its own ranks, the groups' buckets one after another.
Layout plan_grouped_layout(const NamedParams& params, const std::vector<size_t>& group_of,
                           const std::vector<ShardGroup>& groups, int64_t bucket_numel,
                           std::vector<size_t>& bucket_group) {
  Layout layout;
  layout.slots.resize(params.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    NamedParams part_params;
    std::vector<size_t> global;  // part index -> parameter index
    for (size_t k = 0; k < params.size(); ++k) {
      if (group_of[k] != g) continue;
      part_params.push_back(params[k]);
      global.push_back(k);
    }
    Layout part = plan_layout(part_params, bucket_numel, groups[g].dp_group->size(), groups[g].dp_group->rank());
    const size_t base = layout.buckets.size();
    for (auto& bucket : part.buckets) {
      for (size_t& i : bucket.params) i = global[i];
      layout.buckets.push_back(std::move(bucket));
      bucket_group.push_back(g);
    }
    for (size_t i = 0; i < global.size(); ++i) {
      if (!part.slots[i].managed) continue;
      layout.slots[global[i]] = part.slots[i];
      layout.slots[global[i]].bucket += base;
    }
  }
  return layout;
}

}  // namespace

LowLevelZeroOptimizer::LowLevelZeroOptimizer(std::unique_ptr<optim::Optimizer> inner, NamedParams params,
                                             cluster::ProcessGroupPtr dp_group, cluster::ProcessGroupPtr extra_dp_group,
                                             LowLevelZeroOptions options)
    : LowLevelZeroOptimizer(std::move(inner), std::move(params),
                            std::vector<ShardGroup>{{.dp_group = std::move(dp_group),
                                                     .extra_dp_group = std::move(extra_dp_group)}},
                            /*group_of=*/{}, std::move(options)) {}

LowLevelZeroOptimizer::LowLevelZeroOptimizer(std::unique_ptr<optim::Optimizer> inner, NamedParams params,
                                             std::vector<ShardGroup> groups, std::vector<size_t> group_of,
                                             LowLevelZeroOptions options)
    : Optimizer(require(inner).param_groups()),
      inner_(std::move(inner)),
      params_(std::move(params)),
      shard_groups_(std::move(groups)),
      options_(std::move(options)),
      last_grad_norm_(std::numeric_limits<double>::quiet_NaN()) {
  if (shard_groups_.empty()) throw ConfigError("LowLevelZeroOptimizer: no shard group given; pass the dp group");
  for (const auto& group : shard_groups_) {
    if (!group.dp_group) throw ConfigError("LowLevelZeroOptimizer: a dp group is null");
  }
  dp_group_ = shard_groups_.front().dp_group;
  if (group_of.empty()) group_of.assign(params_.size(), 0);
  if (group_of.size() != params_.size()) {
    throw ConfigError(fmt::format("LowLevelZeroOptimizer: group_of has {} entries for {} parameters", group_of.size(),
                                  params_.size()));
  }
  for (size_t g : group_of) {
    if (g >= shard_groups_.size()) {
      throw ConfigError(fmt::format("LowLevelZeroOptimizer: group_of names group {} of {}", g, shard_groups_.size()));
    }
  }
  if (options_.stage != 1 && options_.stage != 2) {
    throw ConfigError(fmt::format("LowLevelZeroOptimizer: stage={} is not ZeRO-1/2; use 1 or 2", options_.stage));
  }
  if (!options_.norm_replicas.empty() && options_.norm_replicas.size() != params_.size()) {
    throw ConfigError(fmt::format("LowLevelZeroOptimizer: norm_replicas has {} entries for {} parameters",
                                  options_.norm_replicas.size(), params_.size()));
  }
  if (options_.bucket_numel <= 0) {
    throw ConfigError(fmt::format("LowLevelZeroOptimizer: bucket_numel={} must be positive", options_.bucket_numel));
  }
  if (!inner_->state_dict().tensors.empty()) {
    throw ConfigError(
        fmt::format("LowLevelZeroOptimizer: {} has already stepped; wrap it before its first step", inner_->name()));
  }
  const auto dtype = scalar_type_of(parse_precision(options_.precision, "LowLevelZeroOptimizer: precision"));
  master_dtype_ = options_.master_weights ? at::kFloat : dtype;
  comm_dtype_ = options_.communication_dtype.value_or(dtype);
  if (options_.precision == "fp16") {
    options_.loss_scaler.validate();
    scaler_.emplace(options_.loss_scaler);
  }
  // Which model parameter each of the inner optimizer's tensors is.
  std::unordered_map<const c10::TensorImpl*, size_t> index_of;
  for (size_t k = 0; k < params_.size(); ++k) index_of[params_[k].second.unsafeGetTensorImpl()] = k;
  std::vector<bool> in_optimizer(params_.size(), false);
  for (const auto& group : inner_->param_groups()) {
    for (const auto& p : group.params) {
      auto it = index_of.find(p.unsafeGetTensorImpl());
      if (it == index_of.end() || !p.requires_grad()) {
        throw ConfigError(
            fmt::format("LowLevelZeroOptimizer: {} holds a tensor that is not a trainable parameter "
                        "of the model; build it on model->parameters()",
                        inner_->name()));
      }
      inner_order_.push_back(it->second);
      in_optimizer[it->second] = true;
    }
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (params_[k].second.requires_grad() && !in_optimizer[k]) {
      throw ConfigError(
          fmt::format("LowLevelZeroOptimizer: parameter '{}' requires grad but {} does not hold it; "
                      "give the optimizer every trainable parameter (or set requires_grad false)",
                      params_[k].first, inner_->name()));
    }
  }

  inner_index_.assign(params_.size(), -1);
  for (size_t i = 0; i < inner_order_.size(); ++i) inner_index_[inner_order_[i]] = static_cast<int64_t>(i);
  host_mixed_step_ = options_.cpu_offload && dtype == at::kBFloat16 && master_dtype_ == at::kFloat &&
                     comm_dtype_ == at::kBFloat16 && !scaler_ &&
                     dynamic_cast<optim::HybridAdam*>(inner_.get()) != nullptr &&
                     std::all_of(shard_groups_.begin(), shard_groups_.end(),
                                 [](const ShardGroup& g) { return g.grad_scale == 1.0; });

  at::NoGradGuard no_grad;
  std::vector<size_t> bucket_group;
  layout_ = plan_grouped_layout(params_, group_of, shard_groups_, options_.bucket_numel, bucket_group);
  group_begin_.assign(shard_groups_.size() + 1, 0);
  for (size_t g : bucket_group) ++group_begin_[g + 1];
  for (size_t g = 0; g < shard_groups_.size(); ++g) group_begin_[g + 1] += group_begin_[g];
  next_to_launch_.assign(group_begin_.begin(), group_begin_.end() - 1);
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const auto& bucket_layout = layout_.buckets[b];
    Bucket bucket{.layout = bucket_layout, .group = bucket_group[b]};
    const int rank = shard_groups_[bucket.group].dp_group->rank();
    const at::Tensor& first = params_[bucket_layout.params.front()].second;
    const bool lazy = first.is_meta();
    const auto device = lazy ? options_.lazy_device : first.device();
    const auto master_device = options_.cpu_offload ? c10::Device(c10::kCPU) : device;
    // Flatten in the original dtype first (fp32 for a lazy source, whatever it
    // holds): masters start at the exact values.
    at::Tensor flat = at::zeros({bucket_layout.numel},
                                at::TensorOptions().dtype(lazy ? at::kFloat : first.scalar_type()).device(device));
    for (size_t k : bucket_layout.params) {
      const auto& slot = layout_.slots[k];
      flat.narrow(0, slot.offset, slot.numel).copy_(whole_values(k).reshape({-1}));
    }
    bucket.flat_params = flat.to(dtype);
    at::Tensor own_chunk =
        bucket.flat_params.narrow(0, int64_t{rank} * bucket_layout.shard_numel, bucket_layout.shard_numel);
    // Where the parameters already have the master's dtype and device (fp32, or
    // no master weights), the master is the rank's own chunk of them: no copy.
    // Not with fp8_communication: the parameters then take the e4m3-rounded
    // gather, and the master must keep the exact values the next step starts
    // from.
    bucket.master = master_dtype_ == dtype && master_device == device && !options_.fp8_communication
                        ? own_chunk
                        : flat.narrow(0, int64_t{rank} * bucket_layout.shard_numel, bucket_layout.shard_numel)
                              .to(master_device, master_dtype_, /*non_blocking=*/false, /*copy=*/true);
    if (!host_mixed_step_) bucket.master_grad = at::zeros_like(bucket.master);
    bucket.layout.dtype = dtype;
    for (size_t k : bucket_layout.params) {
      const auto& slot = layout_.slots[k];
      at::Tensor& p = params_[k].second;
      at::Tensor view = bucket.flat_params.narrow(0, slot.offset, slot.numel).view(p.sizes());
      if (p.is_meta()) {
        models::rebind_parameter(p, view);  // set_data refuses meta -> real
      } else {
        p.set_data(view);
      }
    }
    buckets_.push_back(std::move(bucket));
  }
  if (host_mixed_step_) {
    int64_t total = 0;
    for (const auto& bucket : buckets_) total += bucket.layout.shard_numel;
    const bool pin = !buckets_.empty() && buckets_.front().flat_params.is_cuda();
    host_io_all_ = at::empty({total}, at::TensorOptions().dtype(at::kBFloat16).pinned_memory(pin));
    int64_t offset = 0;
    for (auto& bucket : buckets_) {
      bucket.host_io = host_io_all_.narrow(0, offset, bucket.layout.shard_numel);
      offset += bucket.layout.shard_numel;
    }
  }
  master_views_.resize(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& slot = layout_.slots[k];
    if (!slot.managed) continue;
    auto& bucket = buckets_[slot.bucket];
    master_views_[k] = bucket.master.narrow(0, slot.own_offset, slot.own_numel);
    if (bucket.master_grad.defined()) {
      master_views_[k].mutable_grad() = bucket.master_grad.narrow(0, slot.own_offset, slot.own_numel);
    }
  }
  // Non-trainable floating parameters follow the precision too.
  for (size_t k = 0; k < params_.size(); ++k) {
    at::Tensor& p = params_[k].second;
    if (!p.is_meta()) continue;
    at::Tensor values = whole_values(k);
    const auto target = at::isFloatingType(values.scalar_type()) ? dtype : values.scalar_type();
    models::rebind_parameter(p, values.to(options_.lazy_device, target, /*non_blocking=*/false, /*copy=*/true));
  }
  for (auto& [name, p] : params_) {
    if (!p.requires_grad() && at::isFloatingType(p.scalar_type()) && p.scalar_type() != dtype) {
      p.set_data(p.detach().to(dtype));
    }
  }
  size_t flat_index = 0;
  for (auto& group : inner_->param_groups()) {
    for (auto& p : group.params) p = master_views_[inner_order_[flat_index++]];
  }
  if (auto* lamb = dynamic_cast<optim::Lamb*>(inner_.get())) {
    if (master_dtype_ != at::kFloat) {
      throw ConfigError("LowLevelZeroOptimizer: Lamb under ZeRO needs fp32 masters; set master_weights = true");
    }
    if (shard_groups_.size() > 1) {
      throw ConfigError(
          "LowLevelZeroOptimizer: Lamb's per-parameter norms are reduced over one dp group, but the "
          "parameters are sharded over several (MoE experts); use AdamW");
    }
    // A parameter's norm is the sum of its parts' squares over the dp ranks.
    lamb->set_partition_reducer([group = dp_group_](std::vector<double>& sums) {
      if (group->size() == 1 || sums.empty()) return;
      at::Tensor t = at::from_blob(sums.data(), {static_cast<int64_t>(sums.size())}, at::kDouble)
                         .to(group->device(), /*non_blocking=*/false, /*copy=*/true);
      group->all_reduce(t, cluster::ReduceOp::Sum).wait();
      at::Tensor host = t.cpu();
      std::copy_n(host.data_ptr<double>(), sums.size(), sums.data());
    });
  }
  ready_.assign(params_.size(), false);
  for (size_t k = 0; k < params_.size(); ++k) {
    if (layout_.slots[k].managed) {
      torch::autograd::impl::set_post_acc_grad_hooks(params_[k].second, std::make_unique<ReadyHook>(this, k));
    }
  }
}

bool LowLevelZeroOptimizer::aliases_params(const Bucket& bucket) {
  return bucket.master.storage().is_alias_of(bucket.flat_params.storage());
}

LowLevelZeroOptimizer::~LowLevelZeroOptimizer() {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (layout_.slots[k].managed) torch::autograd::impl::post_acc_grad_hooks(params_[k].second).reset();
  }
  try {
    wait_for_params();
  } catch (...) {  // a destructor must not throw; the job is ending anyway
  }
}

at::Tensor LowLevelZeroOptimizer::whole_values(size_t k) const {
  const auto& [name, p] = params_[k];
  if (!p.is_meta()) return p.detach();
  if (!options_.param_source) {
    throw ConfigError(fmt::format("LowLevelZeroOptimizer: parameter '{}' is on the meta device (lazy init) but no "
                                  "param_source says where its values come from",
                                  name));
  }
  at::Tensor values = options_.param_source(name, p);
  if (values.sizes() != p.sizes()) {
    throw ConfigError(fmt::format("LowLevelZeroOptimizer: param_source gave '{}' shape {}, the model has {}", name,
                                  values.sizes(), p.sizes()));
  }
  return values;
}

at::Tensor LowLevelZeroOptimizer::scale_loss(const at::Tensor& loss) const {
  return scaler_ ? loss * scaler_->scale() : loss;
}

void LowLevelZeroOptimizer::start_backward() {
  in_backward_ = true;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.layout.params.size();
    bucket.launched = false;
  }
  next_to_launch_.assign(group_begin_.begin(), group_begin_.end() - 1);
  launched_during_backward_ = 0;
  models::queue_outer_backward_callback([this] { finish_backward(); });
}

void LowLevelZeroOptimizer::on_grad_ready(size_t param_index) {
  if (!sync_enabled_) return;  // accumulation: the grads stay in param.grad
  if (!in_backward_) start_backward();
  if (ready_[param_index]) {
    throw DistError(
        fmt::format("parameter '{}' received its gradient twice in one backward; ZeRO needs each "
                    "parameter used once per forward (or accumulate with no_sync)",
                    params_[param_index].first));
  }
  ready_[param_index] = true;
  const auto& slot = layout_.slots[param_index];
  auto& bucket = buckets_[slot.bucket];
  at::Tensor& p = params_[param_index].second;
  if (!bucket.staging.defined()) {
    bucket.staging = at::zeros({bucket.layout.numel}, bucket.flat_params.options().dtype(comm_dtype_));
  }
  bucket.staging.narrow(0, slot.offset, slot.numel).copy_(p.grad().reshape({-1}));
  // Stage 2 keeps no full gradient: the bucket (and then the shard) holds it.
  if (options_.stage == 2) p.mutable_grad().reset();
  if (--bucket.pending == 0 && options_.overlap_communication) {
    launch_in_order(false);
    launched_during_backward_ = 0;
    for (size_t g = 0; g < shard_groups_.size(); ++g) {
      launched_during_backward_ += static_cast<int>(next_to_launch_[g] - group_begin_[g]);
    }
  }
}

void LowLevelZeroOptimizer::reduce_accumulated_grads() {
  at::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    bucket.pending = 0;
    bucket.launched = false;
    bucket.staging = at::zeros({bucket.layout.numel}, bucket.flat_params.options().dtype(comm_dtype_));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& slot = layout_.slots[k];
    at::Tensor& p = params_[k].second;
    if (!slot.managed || !p.grad().defined()) continue;  // no gradient: counts as zero
    buckets_[slot.bucket].staging.narrow(0, slot.offset, slot.numel).copy_(p.grad().reshape({-1}));
    if (options_.stage == 2) p.mutable_grad().reset();
  }
  next_to_launch_.assign(group_begin_.begin(), group_begin_.end() - 1);
  launched_during_backward_ = 0;
  in_backward_ = true;
  finish_backward();
}

void LowLevelZeroOptimizer::launch(Bucket& bucket) {
  if (!bucket.staging.defined()) {
    bucket.staging = at::zeros({bucket.layout.numel}, bucket.flat_params.options().dtype(comm_dtype_));
  }
  const bool direct = bucket.master_grad.defined() && comm_dtype_ == master_dtype_ &&
                      bucket.master_grad.device() == bucket.staging.device();
  bucket.reduced = direct ? bucket.master_grad : at::empty({bucket.layout.shard_numel}, bucket.staging.options());
  auto& group = *shard_groups_[bucket.group].dp_group;
  if (options_.fp8_communication) {
    cluster::reduce_scatter_fp8(group, bucket.reduced, bucket.staging, cluster::ReduceOp::Avg);
  } else {
    bucket.reduce_work = group.reduce_scatter(bucket.reduced, bucket.staging, cluster::ReduceOp::Avg);
  }
  bucket.launched = true;
}

void LowLevelZeroOptimizer::launch_in_order(bool all) {
  for (size_t g = 0; g < shard_groups_.size(); ++g) {
    size_t& next = next_to_launch_[g];
    while (next < group_begin_[g + 1] && (all || buckets_[next].pending == 0)) launch(buckets_[next++]);
  }
}

void LowLevelZeroOptimizer::finish_backward() {
  if (!in_backward_) return;
  in_backward_ = false;
  launch_in_order(true);  // parameters without a grad this time count as zero
  at::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    bucket.reduce_work.wait();
    const ShardGroup& group = shard_groups_[bucket.group];
    if (group.extra_dp_group && group.extra_dp_group->size() > 1) {
      group.extra_dp_group->all_reduce(bucket.reduced, cluster::ReduceOp::Avg).wait();
    }
    if (host_mixed_step_) {
      // Down to the host while the rest of backward runs; `reduced` stays on
      // the device for the step's overflow check and norm.
      bucket.host_io.copy_(bucket.reduced, /*non_blocking=*/true);
      bucket.staging.reset();
      continue;
    }
    if (!bucket.reduced.is_same(bucket.master_grad)) bucket.master_grad.copy_(bucket.reduced);
    if (group.grad_scale != 1.0) bucket.master_grad.mul_(group.grad_scale);
    bucket.reduced.reset();
    bucket.staging.reset();
  }
}

void LowLevelZeroOptimizer::gather_params() {
  for (auto& bucket : buckets_) publish_chunk(bucket, bucket.master, options_.fp8_communication);
  if (!options_.overlap_allgather) wait_for_params();
}

void LowLevelZeroOptimizer::gather_exact_params() {
  wait_for_params();
  at::NoGradGuard no_grad;
  for (auto& bucket : buckets_) publish_chunk(bucket, bucket.master, /*in_fp8=*/false);
  wait_for_params();
}

void LowLevelZeroOptimizer::publish_chunk(Bucket& bucket, const at::Tensor& source, bool in_fp8) {
  const auto& group = shard_groups_[bucket.group].dp_group;
  const int rank = group->rank();
  const int64_t shard = bucket.layout.shard_numel;
  at::Tensor own = bucket.flat_params.narrow(0, int64_t{rank} * shard, shard);
  if (in_fp8) {
    // Every rank, this one included, takes the dequantized chunks (one scale
    // a bucket and rank), so the replicas stay identical; the exact values
    // live on in the master, which the next step updates. The working copy is
    // e4m3 of the master each step, so the rounding does not accumulate.
    at::Tensor send = source.to(bucket.flat_params.device(), bucket.layout.dtype, /*non_blocking=*/false,
                                /*copy=*/true);
    cluster::all_gather_fp8(*group, bucket.flat_params, send);
    return;
  }
  if (host_mixed_step_ && group->size() == 1) {
    own.copy_(source, /*non_blocking=*/true);  // pinned: overlaps the next bucket's update
    return;
  }
  // A separate send buffer: MPI forbids an input inside the output.
  at::Tensor send = source.to(bucket.flat_params.device(), bucket.layout.dtype, /*non_blocking=*/host_mixed_step_,
                              /*copy=*/true);
  if (!aliases_params(bucket)) own.copy_(send);
  bucket.reduced = send;  // kept alive until the gather is waited for
  bucket.gather_work = group->all_gather_into(bucket.flat_params, send);
  gather_pending_ = true;
}

void LowLevelZeroOptimizer::wait_for_params() {
  if (!gather_pending_) return;
  gather_pending_ = false;
  for (auto& bucket : buckets_) {
    bucket.gather_work.wait();
    bucket.reduced.reset();
  }
}

void LowLevelZeroOptimizer::step() {
  wait_for_params();
  at::NoGradGuard no_grad;
  auto& inner_groups = inner_->param_groups();
  for (size_t g = 0; g < groups_.size() && g < inner_groups.size(); ++g) {
    inner_groups[g].lr = groups_[g].lr;
    inner_groups[g].weight_decay = groups_[g].weight_decay;
    inner_groups[g].options = groups_[g].options;
  }
  if (host_mixed_step_) {
    step_host_mixed();
    return;
  }
  std::vector<at::Tensor> grads;
  for (const auto& bucket : buckets_) grads.push_back(bucket.master_grad);
  bool overflow = false;
  if (options_.precision != "fp32") {
    overflow = overflow_anywhere(amp::unscale_and_check_finite(grads, 1.0 / loss_scale()));
  }
  last_step_skipped_ = overflow;
  if (overflow) {
    ++skipped_steps_;
    if (scaler_) scaler_->update(true);
    return;
  }
  if (options_.max_norm > 0.0) last_grad_norm_ = clip_master_grads(grads);
  inner_->step();
  if (scaler_) scaler_->update(false);
  gather_params();
}

void LowLevelZeroOptimizer::step_host_mixed() {
  // bf16 takes no loss scale; a non-finite gradient anywhere skips the step.
  at::Tensor all_finite;
  for (const auto& bucket : buckets_) {
    if (!bucket.reduced.defined()) {
      throw DistError("LowLevelZeroOptimizer: step() without a backward since the last step (cpu_offload keeps no "
                      "gradient between steps)");
    }
    at::Tensor finite = at::isfinite(bucket.reduced).all();
    all_finite = all_finite.defined() ? all_finite.logical_and(finite) : finite;
  }
  // This read waits for the device's stream, and with it for the gradients'
  // copies to host_io queued on it in finish_backward.
  const bool overflow = overflow_anywhere(all_finite.defined() && !all_finite.item<bool>());
  last_step_skipped_ = overflow;
  float grad_scale = 1.0f;
  if (!overflow && options_.max_norm > 0.0) {
    last_grad_norm_ = reduced_grad_norm();
    // clip_grad_norm's coefficient, in its fp32 operations.
    const float total = static_cast<float>(last_grad_norm_);
    grad_scale = std::min((1.0f / (total + 1e-6f)) * static_cast<float>(options_.max_norm), 1.0f);
  }
  for (auto& bucket : buckets_) bucket.reduced.reset();
  if (overflow) {
    ++skipped_steps_;
    return;
  }
  auto& adam = dynamic_cast<optim::HybridAdam&>(*inner_);
  for (auto& bucket : buckets_) {
    std::vector<int64_t> indices;
    std::vector<at::Tensor> io;
    for (size_t k : bucket.layout.params) {
      const auto& slot = layout_.slots[k];
      // A parameter with no elements on this rank steps too, as in the inner
      // step: its step count is part of the state a checkpoint saves.
      if (!slot.managed || inner_index_[k] < 0) continue;
      indices.push_back(inner_index_[k]);
      io.push_back(bucket.host_io.narrow(0, slot.own_offset, slot.own_numel));
    }
    if (!indices.empty()) adam.step_host_mixed(indices, io, grad_scale);
    // Padding between the parameters carries zero gradients, so it goes
    // back as the zeros it held.
    publish_chunk(bucket, bucket.host_io, options_.fp8_communication);
  }
  if (!options_.overlap_allgather) wait_for_params();
}

double LowLevelZeroOptimizer::reduced_grad_norm() const {
  // Each gradient's fp32 norm as a one-element term: the norm of those terms
  // is the norm over the gradients (sqrt(x * x) == x in binary floating point).
  const double norm_type = options_.norm_type;
  auto term = [norm_type](const at::Tensor& g) {
    return amp::vector_norm(g, norm_type).to(at::kFloat).reshape({1});
  };
  std::vector<at::Tensor> terms;
  std::vector<double> weights;
  if (options_.norm_replicas.empty()) {
    for (const auto& bucket : buckets_) terms.push_back(term(bucket.reduced));
  } else {
    for (size_t k = 0; k < params_.size(); ++k) {
      const auto& slot = layout_.slots[k];
      if (!slot.managed) continue;
      terms.push_back(term(buckets_[slot.bucket].reduced.narrow(0, slot.own_offset, slot.own_numel)));
      weights.push_back(1.0 / static_cast<double>(options_.norm_replicas.at(k)));
    }
  }
  if (terms.empty()) {
    terms.push_back(at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(dp_group_->device())));
    weights.assign(weights.empty() ? 0 : 1, 1.0);
  }
  return amp::grad_norm(terms, norm_type, norm_reducer(), weights);
}

bool LowLevelZeroOptimizer::overflow_anywhere(bool local) const {
  // Every rank must skip the same steps: the shards over dp, and the other
  // parts of the model over model_parallel_group, each saw other gradients.
  for (const auto& group : {dp_group_, options_.model_parallel_group}) {
    if (!group || group->size() == 1) continue;
    local = group->all_reduce_scalar(local ? 1.0 : 0.0, cluster::ReduceOp::Max) > 0.0;
  }
  return local;
}

amp::NormReducer LowLevelZeroOptimizer::norm_reducer() const {
  // Each dp rank holds a disjoint part of the gradient (with several shard
  // groups: over the first, see the constructor), each model-parallel rank
  // other parameters or slices: sum (or max) over dp, then over those.
  return [this](const at::Tensor& local, double norm_type) {
    const auto op = std::isinf(norm_type) ? cluster::ReduceOp::Max : cluster::ReduceOp::Sum;
    at::Tensor total = local;
    for (const auto& group : {dp_group_, options_.model_parallel_group}) {
      if (!group || group->size() == 1) continue;
      total = total.to(group->device(), /*non_blocking=*/false, /*copy=*/true);
      group->all_reduce(total, op).wait();
    }
    return total.to(local.device());
  };
}

double LowLevelZeroOptimizer::clip_master_grads(const std::vector<at::Tensor>& bucket_grads) const {
  const amp::NormReducer reducer = norm_reducer();
  if (options_.norm_replicas.empty())
    return amp::clip_grad_norm(bucket_grads, options_.max_norm, options_.norm_type, reducer);
  // Per parameter, so each term takes its weight: this rank's part of it.
  std::vector<at::Tensor> grads;
  std::vector<double> weights;
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& slot = layout_.slots[k];
    if (!slot.managed) continue;
    grads.push_back(buckets_[slot.bucket].master_grad.narrow(0, slot.own_offset, slot.own_numel));
    weights.push_back(1.0 / static_cast<double>(options_.norm_replicas.at(k)));
  }
  // A rank with nothing here still joins the reduction (a zero term).
  if (grads.empty()) {
    grads.push_back(at::zeros({1}, at::TensorOptions().dtype(master_dtype_).device(dp_group_->device())));
    weights.push_back(1.0);
  }
  return amp::clip_grad_norm(grads, options_.max_norm, options_.norm_type, reducer, weights);
}

int64_t LowLevelZeroOptimizer::follow_parameters() {
  wait_for_params();
  at::NoGradGuard no_grad;
  int64_t reread = 0;
  for (auto& bucket : buckets_) {
    const int rank = shard_groups_[bucket.group].dp_group->rank();
    const int64_t shard = bucket.layout.shard_numel;
    at::Tensor own = bucket.flat_params.narrow(0, int64_t{rank} * shard, shard).to(bucket.master.device());
    if (aliases_params(bucket)) continue;  // the master is the parameters' own chunk
    ++reread;
    if (bucket.layout.dtype == master_dtype_) {
      bucket.master.copy_(own);
      continue;
    }
    // Keep exact masters where they still round to the parameter.
    at::Tensor same = bucket.master.to(bucket.layout.dtype).eq(own);
    bucket.master.copy_(at::where(same, bucket.master, own.to(master_dtype_)));
  }
  return reread;
}

LowLevelZeroOptimizer::MemoryBytes LowLevelZeroOptimizer::memory_bytes() const {
  MemoryBytes bytes;
  for (const auto& bucket : buckets_) {
    bytes.params += bucket.flat_params.nbytes();
    if (!aliases_params(bucket)) bytes.masters += bucket.master.nbytes();
    if (bucket.master_grad.defined()) bytes.grads += bucket.master_grad.nbytes();
    if (bucket.host_io.defined()) bytes.grads += bucket.host_io.nbytes();
    if (bucket.staging.defined()) bytes.grads += bucket.staging.nbytes();
  }
  for (const auto& [name, p] : params_) {
    if (p.grad().defined()) bytes.grads += p.grad().nbytes();
  }
  for (const auto& [name, t] : inner_->state_dict().tensors) bytes.optimizer_state += t.nbytes();
  return bytes;
}

}  // namespace colossus::zero
