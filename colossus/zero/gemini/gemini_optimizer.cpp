// GeminiOptimizer: construction and the step (see gemini_optimizer.h); the
// unsharded state_dict lives in gemini_state.cpp.
#include "colossus/zero/gemini/gemini_optimizer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "colossus/amp/clip_grad.h"
#include "colossus/amp/unscale.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/optim/hybrid_adam.h"
#include "colossus/optim/lamb.h"

namespace colossus::zero::gemini {

namespace {

const optim::Optimizer& require(const std::unique_ptr<optim::Optimizer>& inner) {
  if (!inner)
    throw ConfigError(
        "GeminiOptimizer: the inner optimizer is null; pass e.g. "
        "std::make_unique<AdamW>(...)");
  return *inner;
}

// Master + gradient shard + two moments, per element (the auto policy's
// estimate).
constexpr int64_t kOptimBytesPerElement = 16;

}  // namespace

GeminiOptimizer::GeminiOptimizer(std::unique_ptr<optim::Optimizer> inner, GeminiDDP& ddp)
    : Optimizer(require(inner).param_groups()),
      inner_(std::move(inner)),
      ddp_(ddp),
      last_grad_norm_(std::numeric_limits<double>::quiet_NaN()) {
  if (!inner_->state_dict().tensors.empty()) {
    throw ConfigError(
        fmt::format("GeminiOptimizer: {} has already stepped; "
                    "wrap it before its first step",
                    inner_->name()));
  }
  const auto& params = ddp_.params();
  std::unordered_map<const c10::TensorImpl*, size_t> index_of;
  for (size_t k = 0; k < params.size(); ++k) index_of[params[k].second.unsafeGetTensorImpl()] = k;
  std::vector<bool> in_optimizer(params.size(), false);
  for (const auto& group : inner_->param_groups()) {
    for (const auto& p : group.params) {
      auto it = index_of.find(p.unsafeGetTensorImpl());
      if (it == index_of.end() || !p.requires_grad()) {
        throw ConfigError(
            fmt::format("GeminiOptimizer: {} holds a tensor that is not a "
                        "trainable parameter of the model; build it on "
                        "model->parameters()",
                        inner_->name()));
      }
      inner_order_.push_back(it->second);
      in_optimizer[it->second] = true;
    }
  }
  inner_index_.assign(params.size(), -1);
  for (size_t i = 0; i < inner_order_.size(); ++i) inner_index_[inner_order_[i]] = static_cast<int64_t>(i);
  for (size_t k = 0; k < params.size(); ++k) {
    if (params[k].second.requires_grad() && !in_optimizer[k]) {
      throw ConfigError(
          fmt::format("GeminiOptimizer: parameter '{}' requires grad but {} "
                      "does not hold it; give the optimizer every "
                      "trainable parameter (or set requires_grad false)",
                      params[k].first, inner_->name()));
    }
  }
  if (ddp_.options().precision == "fp16") {
    auto scaler_options = ddp_.options().loss_scaler;
    scaler_options.validate();
    scaler_.emplace(scaler_options);
  }
  rebind_masters();
  setup_nvme();
  // ZeRO-Offload's bf16 host step wherever the optimizer side is on the host.
  if (dynamic_cast<optim::HybridAdam*>(inner_.get()) && ddp_.dtype() == at::kBFloat16 &&
      ddp_.master_dtype() == at::kFloat && nvme_chunks_.empty()) {
    ddp_.enable_host_step();
    rebind_masters();  // the host-step chunks' master views no longer carry gradients
  }
  if (auto* lamb = dynamic_cast<optim::Lamb*>(inner_.get())) {
    if (ddp_.master_dtype() != at::kFloat) {
      throw ConfigError(
          "GeminiOptimizer: Lamb under Gemini needs fp32 "
          "masters; set master_weights = true");
    }
    lamb->set_partition_reducer([group = ddp_.dp_group()](std::vector<double>& sums) {
      if (group->size() == 1 || sums.empty()) return;
      at::Tensor t = at::from_blob(sums.data(), {static_cast<int64_t>(sums.size())}, at::kDouble)
                         .to(group->device(), /*non_blocking=*/false,
                             /*copy=*/true);
      group->all_reduce(t, cluster::ReduceOp::Sum).wait();
      at::Tensor host = t.cpu();
      std::copy_n(host.data_ptr<double>(), sums.size(), sums.data());
    });
  }
}

void GeminiOptimizer::rebind_masters() {
  size_t flat = 0;
  for (auto& group : inner_->param_groups()) {
    for (auto& p : group.params) p = ddp_.master_view(inner_order_[flat++]);
  }
}

at::Tensor GeminiOptimizer::scale_loss(const at::Tensor& loss) const {
  return scaler_ ? loss * scaler_->scale() : loss;
}

GeminiOptimizer::~GeminiOptimizer() {
  // The host worker's queued updates step this optimizer's inner state; their
  // parameters still go up when the model next gathers the chunks.
  try {
    ddp_.wait_host_work();
  } catch (const std::exception& e) {  // a destructor must not throw; say what the last update hit
    fmt::print(stderr, "gemini: the last step's host update failed: {}\n", e.what());
  } catch (...) {  // NOLINT(bugprone-empty-catch): as above, with nothing to say
  }
}

void GeminiOptimizer::step() {
  at::NoGradGuard no_grad;
  ddp_.finish_host_updates();  // the last step's (the forward usually did)
  if (ddp_.warming_up()) {
    ddp_.end_warmup(kOptimBytesPerElement);
    rebind_masters();
  }
  auto& inner_groups = inner_->param_groups();
  for (size_t g = 0; g < groups_.size() && g < inner_groups.size(); ++g) {
    inner_groups[g].lr = groups_[g].lr;
    inner_groups[g].weight_decay = groups_[g].weight_decay;
    inner_groups[g].options = groups_[g].options;
  }
  if (ddp_.host_step_enabled()) {
    step_host();
    return;
  }
  std::vector<at::Tensor> grads;
  for (const auto& chunk : ddp_.chunks()) grads.push_back(chunk.grad_shard);
  const auto group = ddp_.dp_group();
  bool overflow = false;
  if (ddp_.options().precision != "fp32") {
    overflow = amp::unscale_and_check_finite(grads, 1.0 / loss_scale());
    if (group->size() > 1) {
      overflow = group->all_reduce_scalar(overflow ? 1.0 : 0.0, cluster::ReduceOp::Max) > 0.0;
    }
  }
  last_step_skipped_ = overflow;
  if (overflow) {
    ++skipped_steps_;
    if (scaler_) scaler_->update(true);
    ddp_.after_step();  // the masters did not move; the next backward starts
                        // fresh gradients
    return;
  }
  const double max_norm = ddp_.options().max_norm;
  if (max_norm > 0.0) {
    last_grad_norm_ = amp::clip_grad_norm(grads, max_norm, ddp_.options().norm_type, norm_reducer());
  }
  step_inner();
  if (scaler_) scaler_->update(false);
  ddp_.after_step();
}

amp::NormReducer GeminiOptimizer::norm_reducer() const {
  // Each rank holds a disjoint part of the whole gradient: sum (or max) over dp.
  const auto group = ddp_.dp_group();
  if (group->size() == 1) return {};
  return [group](const at::Tensor& local, double norm_type) {
    at::Tensor total = local.to(group->device(), /*non_blocking=*/false, /*copy=*/true);
    group->all_reduce(total, std::isinf(norm_type) ? cluster::ReduceOp::Max : cluster::ReduceOp::Sum).wait();
    return total.to(local.device());
  };
}

void GeminiOptimizer::step_host() {
  // bf16: no loss scale. The statistics were taken on the device at the end
  // of backward; reading them does not wait for the gradients' copies.
  const auto stats = ddp_.grad_stats();
  const auto group = ddp_.dp_group();
  bool overflow = std::find(stats.finite.begin(), stats.finite.end(), false) != stats.finite.end();
  if (group->size() > 1) overflow = group->all_reduce_scalar(overflow ? 1.0 : 0.0, cluster::ReduceOp::Max) > 0.0;
  last_step_skipped_ = overflow;
  if (overflow) {
    ++skipped_steps_;
    ddp_.after_step();
    return;
  }
  const double max_norm = ddp_.options().max_norm;
  float grad_scale = 1.0f;
  auto& chunks = ddp_.chunks();
  if (max_norm > 0.0) {
    // One fp32 term a chunk: the norm of the terms is the norm over the
    // chunks (sqrt(x * x) == x in binary floating point), as clip_grad_norm
    // takes it over the gradient shards.
    std::vector<at::Tensor> terms;
    for (float norm : stats.norms) terms.push_back(at::full({1}, norm, at::TensorOptions().dtype(at::kFloat)));
    last_grad_norm_ = amp::grad_norm(terms, ddp_.options().norm_type, norm_reducer());
    // clip_grad_norm's coefficient, in its fp32 operations.
    const auto total = static_cast<float>(last_grad_norm_);
    grad_scale = std::min((1.0f / (total + 1e-6f)) * static_cast<float>(max_norm), 1.0f);
    for (auto& chunk : chunks) {
      if (chunk.grad_shard.defined()) chunk.grad_shard.mul_(static_cast<double>(grad_scale));
    }
  }
  // Chunks on the device (or not host-stepped) first: their master views
  // hold the gradients; host-step chunks' views have none, so it skips them.
  inner_->step();
  // Host-step chunks: each one's CPU Adam on the host worker, in the order
  // the next forward gathers them; step() returns at once and that forward
  // waits only for the chunk it gathers, so the CPU Adam of the later chunks
  // runs beside the forward of the earlier ones (on an H100 1.15x the step
  // that waited here for each chunk, bench/RESULTS.md).
  auto& adam = dynamic_cast<optim::HybridAdam&>(*inner_);
  const auto& slots = ddp_.layout().slots;
  for (size_t c : ddp_.forward_order()) {
    Chunk& chunk = chunks[c];
    if (!ddp_.host_steps(chunk)) continue;
    std::vector<int64_t> indices;
    std::vector<at::Tensor> grads, io;
    for (size_t k : chunk.layout.params) {
      const auto& slot = slots[k];
      // A parameter with no elements on this rank steps too, as in the inner
      // step: its step count is part of the state a checkpoint saves.
      if (inner_index_[k] < 0) continue;
      indices.push_back(inner_index_[k]);
      io.push_back(chunk.host_io.narrow(0, slot.own_offset, slot.own_numel));
      // The gradient: the landed bf16 copy, which the new parameters
      // overwrite, or with accumulation the fp32 sum beside it.
      grads.push_back(chunk.host_grad.defined() ? chunk.host_grad.narrow(0, slot.own_offset, slot.own_numel)
                                                : io.back());
    }
    // Padding carries zero gradients, so it goes back as the zeros it held.
    ddp_.queue_host_update(c, [&adam, indices = std::move(indices), grads = std::move(grads), io = std::move(io),
                               grad_scale] {
      if (!indices.empty()) adam.step_host_mixed(indices, grads, io, grad_scale);
    });
  }
  ddp_.after_step();
}

}  // namespace colossus::zero::gemini
