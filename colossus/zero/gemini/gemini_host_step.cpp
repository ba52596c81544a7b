// GeminiDDP's side of the host step (see enable_host_step in gemini_ddp.h):
// which chunks hold a bf16 host_io in place of their fp32 gradient shard, the
// statistics taken on the device at the end of backward, the ordered copies,
// and the worker thread (host_worker.h) that does the host's part.
//
// Ordering on CUDA: during backward each chunk's statistics are queued on the
// current stream one chunk behind its reduce; its gradient's copy to the host
// runs on a side stream (copy_stream_) after an event on the current one, so
// backward's kernels do not wait for the PCIe transfer (on an H100 they did:
// 44 ms of a 1B model's backward), with an event after it; `reduced` is
// recorded on the side stream so its memory is not reused before the copy
// read it. At the end the statistics' small copy. The optimizer waits for the
// statistics and queues each host chunk's CPU Adam on the worker, which waits
// for that chunk's event first, and returns: when the next forward gathers chunk
// i, the main thread waits for chunk i's update alone and queues its copy up
// ahead of the gather. The next backward's copy into host_io is ordered
// behind it through the current stream (or the event it waits for).
//
// With gradient accumulation a landed copy is handed, with its event, to the
// worker, which sums it into host_grad; a chunk's next copy into host_io
// waits for that sum (a whole forward later, so it has long finished). The
// statistics of those chunks come from the sums at the step.
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include "colossus/amp/clip_grad.h"
#include "colossus/core/errors.h"
#include "colossus/zero/gemini/gemini_ddp.h"
#include "colossus/zero/gemini/host_worker.h"

namespace colossus::zero::gemini {

namespace {

c10::Stream current_stream(const c10::Device& device) {
  return at::accelerator::getCurrentStream(device.has_index() ? device.index() : at::accelerator::getDeviceIndex());
}

}  // namespace

void GeminiDDP::enable_host_step() {
  if (dtype_ != at::kBFloat16 || master_dtype_ != at::kFloat) {
    throw ConfigError(fmt::format("gemini: the host step needs bf16 parameters with fp32 masters, not {} with {}",
                                  c10::toString(dtype_), c10::toString(master_dtype_)));
  }
  if (grads_pending_step_ || in_backward_) {
    throw DistError("gemini: enable_host_step() between a backward and its step; call it before training");
  }
  host_step_ = true;
  host_worker_ = std::make_unique<HostWorker>(chunks_.size());
  upload_pending_.assign(chunks_.size(), 0);
  if (device_.is_cuda()) {
    const c10::Device device(device_.type(), device_.has_index() ? device_.index() : at::accelerator::getDeviceIndex());
    copy_stream_ = c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device);
  }
  arrange_host_io();
}

void GeminiDDP::arrange_host_io() {
  if (!host_step_) return;
  at::NoGradGuard no_grad;
  finish_host_updates();
  const bool pin = device_.is_cuda();
  const bool accumulating = options_.enable_gradient_accumulation;
  bool stats_changed = false;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Chunk& chunk = chunks_[c];
    if (host_steps(chunk) && !chunk.host_io.defined()) {
      chunk.host_io = at::empty({chunk.layout.shard_numel},
                                at::TensorOptions().dtype(at::kBFloat16).device(c10::kCPU).pinned_memory(pin));
      if (accumulating) {
        // The sum so far moves as it is (fp32); the next micro-batch adds.
        chunk.host_grad = at::empty({chunk.layout.shard_numel}, at::TensorOptions().dtype(at::kFloat));
        if (grads_pending_step_) chunk.host_grad.copy_(chunk.grad_shard);
      } else if (grads_pending_step_) {
        // A pending gradient was reduced in bf16, so it is exact in bf16.
        chunk.host_io.copy_(chunk.grad_shard);
      }
      chunk.grad_shard.reset();
    } else if (!host_steps(chunk) && chunk.host_io.defined()) {
      if (grads_pending_step_) wait_host_gradient(c);
      chunk.grad_shard = at::empty({chunk.layout.shard_numel}, at::TensorOptions().dtype(master_dtype_).device(
                                                                   chunk.master.device()));
      if (grads_pending_step_) {
        chunk.grad_shard.copy_(accumulating ? chunk.host_grad : chunk.host_io);
        // Its statistics were taken from host_grad's side (or not at all).
        if (accumulating) {
          record_chunk_stats(c, chunk.grad_shard);
          stats_changed = true;
        }
      } else {
        chunk.grad_shard.zero_();
      }
      chunk.host_io.reset();
      chunk.host_io_landed.reset();
      chunk.host_grad.reset();
    }
    point_views(c);
  }
  if (!grad_stats_host_.defined()) {
    const int64_t n = 2 * static_cast<int64_t>(chunks_.size());
    grad_stats_device_ = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(device_));
    grad_stats_host_ = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(c10::kCPU).pinned_memory(pin));
  }
  if (stats_changed) send_grad_stats();
}

void GeminiDDP::record_chunk_stats(size_t c, const at::Tensor& grad) {
  const auto n = static_cast<int64_t>(chunks_.size());
  const auto index = static_cast<int64_t>(c);
  if (options_.max_norm > 0.0) {
    grad_stats_device_.narrow(0, index, 1).copy_(amp::vector_norm(grad, options_.norm_type).reshape({1}));
  }
  grad_stats_device_.narrow(0, n + index, 1).copy_(at::isfinite(grad).all().reshape({1}));
}

void GeminiDDP::send_to_host(size_t c) {
  Chunk& chunk = chunks_[c];
  // host_io is free: the last step's parameters have gone up from it and the
  // last micro-batch's sum has read it.
  finish_host_update(c);
  const bool accumulating = options_.enable_gradient_accumulation;
  if (!accumulating) {
    // The bf16 gradient widened to fp32, so the norm is the one the fp32
    // gradient shard would give (bit for bit: the host step replaces that
    // path).
    record_chunk_stats(c, chunk.reduced.to(at::kFloat));
  }
  if (copy_stream_) {
    c10::Event reduced_ready(device_.type());
    reduced_ready.record(current_stream(device_));
    reduced_ready.block(*copy_stream_);
    {
      c10::StreamGuard on_copy_stream(*copy_stream_);
      chunk.host_io.copy_(chunk.reduced, /*non_blocking=*/true);
    }
    chunk.reduced.record_stream(*copy_stream_);
    chunk.host_io_landed.emplace(device_.type());
    chunk.host_io_landed->record(*copy_stream_);
  } else {
    // On the current stream (CUDA: its later kernels queue behind the copy).
    const bool cuda = device_.is_cuda();
    chunk.host_io.copy_(chunk.reduced, /*non_blocking=*/cuda);
    if (cuda) {
      chunk.host_io_landed.emplace(device_.type());
      chunk.host_io_landed->record(current_stream(device_));
    }
  }
  if (accumulating) {
    // The first backward since the step starts the sum, as the gradient
    // shard path's copy_ does.
    host_worker_->enqueue_sum(c, chunk.host_grad, chunk.host_io, std::move(chunk.host_io_landed),
                              /*first=*/!grads_pending_step_);
    chunk.host_io_landed.reset();
  }
  // `reduced` is freed by the caller: on CUDA the allocator holds its memory
  // until the copy stream's work recorded above has run; on the CPU the copy
  // is done.
}

void GeminiDDP::send_grad_stats() {
  const bool cuda = device_.is_cuda();
  grad_stats_host_.copy_(grad_stats_device_, /*non_blocking=*/cuda);
  if (cuda) {
    grad_stats_landed_.emplace(device_.type());
    grad_stats_landed_->record(current_stream(device_));
  }
}

GeminiDDP::GradStats GeminiDDP::grad_stats() {
  if (!host_step_ || !grads_pending_step_) {
    throw DistError("gemini: grad_stats() needs the host step and a backward since the last step");
  }
  if (grad_stats_landed_) grad_stats_landed_->synchronize();
  const auto n = static_cast<int64_t>(chunks_.size());
  const float* values = grad_stats_host_.data_ptr<float>();
  GradStats stats;
  stats.norms.assign(values, values + n);
  for (int64_t c = 0; c < n; ++c) stats.finite.push_back(values[n + c] != 0.0f);
  if (options_.enable_gradient_accumulation) {
    // The summed chunks' statistics, from the sums: the norm as
    // clip_grad_norm takes it from an fp32 gradient shard on the host.
    host_worker_->wait_all();
    for (size_t c = 0; c < chunks_.size(); ++c) {
      if (!host_steps(chunks_[c])) continue;
      stats.finite[c] = host_worker_->finite(c);
      if (options_.max_norm > 0.0) {
        stats.norms[c] = amp::vector_norm(chunks_[c].host_grad, options_.norm_type).item<float>();
      }
    }
  }
  return stats;
}

void GeminiDDP::wait_host_gradient(size_t c) {
  if (options_.enable_gradient_accumulation) {
    host_worker_->wait(c);
    return;
  }
  auto& landed = chunks_.at(c).host_io_landed;
  if (landed) landed->synchronize();
}

void GeminiDDP::queue_host_update(size_t c, std::function<void()> update) {
  if (!host_step_ || !host_steps(chunks_.at(c))) {
    throw DistError(fmt::format("gemini: queue_host_update({}) for a chunk the host step does not cover", c));
  }
  // Without accumulation the update waits for the gradient's copy; with it,
  // the worker's queue already orders it after the chunk's sums.
  std::optional<c10::Event> landed = std::move(chunks_[c].host_io_landed);
  chunks_[c].host_io_landed.reset();
  host_worker_->enqueue(c, std::move(landed), std::move(update));
  upload_pending_[c] = 1;
}

void GeminiDDP::finish_host_update(size_t c) {
  if (!host_worker_) return;
  host_worker_->wait(c);
  if (upload_pending_[c]) {
    upload_pending_[c] = 0;
    upload_host_step(c);
  }
}

void GeminiDDP::wait_host_work() {
  if (host_worker_) host_worker_->wait_all();
}

void GeminiDDP::finish_host_updates() {
  if (!host_worker_) return;
  // In the order they were queued: each copy up goes while the worker
  // updates the next chunk.
  for (size_t c : forward_order_) finish_host_update(c);
}

void GeminiDDP::upload_host_step(size_t c) {
  Chunk& chunk = chunks_.at(c);
  at::NoGradGuard no_grad;
  // Pinned to the device: returns at once; the next forward is queued behind.
  chunk.shard.copy_(chunk.host_io, /*non_blocking=*/device_.is_cuda() && !chunk.placement.param_on_host);
}

}  // namespace colossus::zero::gemini
