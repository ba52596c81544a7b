// GeminiDDP, where chunks live: the auto policy's memory samples during the
// warm-up step and its placement at the first step, moving chunks between
// device and host, and the byte accounting by place (see gemini_ddp.h).
#include <ATen/ATen.h>

#include <unistd.h>

#include <algorithm>

#include "colossus/cluster/launch.h"
#include "colossus/core/env.h"
#include "colossus/core/errors.h"
#include "colossus/zero/gemini/gemini_ddp.h"

namespace colossus::zero::gemini {

namespace {

int64_t chunk_bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// GeminiOptions::host_budget_probe's default.
int64_t default_host_budget() {
  const double physical = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  int ranks_here = 1;
  try {
    ranks_here = std::max(1, cluster::read_launch_info(process_env()).local_world_size);
  } catch (const std::exception&) {  // contradictory launch variables: the launch itself reports them
  }
  return physical > 0 ? static_cast<int64_t>(0.85 * physical / ranks_here) : 0;
}

std::optional<metrics::DeviceMemory> probe_memory(const GeminiOptions& options) {
  return options.memory_probe ? options.memory_probe() : metrics::device_memory();
}

// Whether the probe's peak can be reset, so that it tells one stretch's peak.
bool peak_resettable(const GeminiOptions& options) {
  return options.memory_probe ? static_cast<bool>(options.memory_peak_reset)
                              : metrics::device_memory_peak_resettable();
}

}  // namespace

void GeminiDDP::sample_memory() {
  const auto memory = probe_memory(options_);
  if (!memory) return;
  const int64_t model_now = device_model_bytes();
  // The bytes at this boundary, and, where the peak was reset when the
  // stretch began, the stretch's peak: activations and temporaries that
  // lived and died between two boundaries (attention's and the loss's
  // temporaries, a block's backward) count too. The model bytes at the peak
  // are not known; the larger of those at the two ends is taken (chunks
  // gathered for the segment, its gradient buffers).
  int64_t non_model = memory->allocated_bytes - model_now;
  if (period_model_bytes_ && peak_resettable(options_)) {
    const int64_t peak = std::max(memory->peak_allocated_bytes, memory->allocated_bytes);
    non_model = std::max(non_model, peak - std::max(*period_model_bytes_, model_now));
  }
  peak_non_model_bytes_ = std::max(peak_non_model_bytes_, non_model);
  period_model_bytes_.reset();
}

void GeminiDDP::start_memory_period() {
  if (!peak_resettable(options_)) return;
  if (options_.memory_probe) {
    options_.memory_peak_reset();
  } else {
    metrics::reset_device_memory_peak();
  }
  period_model_bytes_ = device_model_bytes();
}

void GeminiDDP::end_warmup(int64_t optim_bytes_per_element) {
  if (!warming_up_) return;
  warming_up_ = false;
  const auto memory = probe_memory(options_);
  if (!memory) return;  // no device figures: the warm-up placement stays
  size_t widest = 0;
  for (const auto& s : segment_chunks_) widest = std::max(widest, s.size());
  const int64_t elem = c10::elementSize(dtype_);
  const int64_t shard = chunk_numel_ / dp_group_->size();
  const double cap = options_.steady_cuda_cap_ratio * static_cast<double>(memory->total_bytes);
  // On the host an optimizer side is the host step's 14 bytes an element (18
  // accumulating: host_step.cpp), else the same as on the device.
  const int64_t host_bytes_per_element =
      host_step_ ? (options_.enable_gradient_accumulation ? 18 : 14) : optim_bytes_per_element;
  const auto placement = auto_placement(
      chunks_.size(), {.device_budget_bytes = static_cast<int64_t>(cap),
                       .non_model_peak_bytes = peak_non_model_bytes_,
                       .param_shard_bytes = shard * elem,
                       .optim_shard_bytes = shard * optim_bytes_per_element,
                       // Gathered chunks of two segments (plus prefetch) and their gradient
                       // buffers.
                       .working_bytes = static_cast<int64_t>(2 * widest + static_cast<size_t>(options_.max_prefetch)) *
                                        chunk_numel_ * elem,
                       .gpu_margin_mem_ratio = options_.gpu_margin_mem_ratio.value_or(1.0),
                       .host_budget_bytes = options_.host_budget_probe ? options_.host_budget_probe()
                                                                        : default_host_budget(),
                       .host_optim_shard_bytes = shard * host_bytes_per_element});
  apply_placement(placement);
}

void GeminiDDP::apply_placement(const std::vector<ChunkPlacement>& placement) {
  TORCH_CHECK(placement.size() == chunks_.size(), "gemini: placement for ", placement.size(), " chunks, have ",
              chunks_.size());
  finish_host_updates();
  at::NoGradGuard no_grad;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Chunk& chunk = chunks_[c];
    if (placement[c] == chunk.placement) continue;
    if (placement[c].keep_gathered != chunk.placement.keep_gathered) {
      throw ConfigError(
          "gemini: a chunk cannot change between sharded and "
          "kept gathered after construction");
    }
    const at::Tensor master = chunk.master;  // the exact values
    chunk.placement = placement[c];
    if (!chunk.placement.keep_gathered) {
      chunk.shard = host_or_device(chunk.shard, chunk.placement.param_on_host, dtype_);
    }
    const bool alias = master_dtype_ == dtype_ && chunk.placement.param_on_host == chunk.placement.optim_on_host;
    if (alias) {
      chunk.shard.copy_(master);
      chunk.master = chunk.shard;
    } else {
      chunk.master = host_or_device(master, chunk.placement.optim_on_host, master_dtype_);
    }
    if (chunk.grad_shard.defined()) {
      chunk.grad_shard = host_or_device(chunk.grad_shard, chunk.placement.optim_on_host, master_dtype_);
    }
    point_views(c);
  }
  arrange_host_io();  // chunks that moved to or from the host step
}

GeminiMemory GeminiDDP::memory_bytes() const {
  GeminiMemory m;
  for (const auto& chunk : chunks_) {
    const bool gathered = chunk.state != Chunk::State::Released;
    if (gathered) m.params_device += chunk_bytes(chunk.full);
    if (!chunk.placement.keep_gathered)
      (chunk.placement.param_on_host ? m.params_host : m.params_device) += chunk_bytes(chunk.shard);
    m.grads_device += chunk_bytes(chunk.grad_full) + chunk_bytes(chunk.reduced);
    (chunk.placement.optim_on_host ? m.grads_host : m.grads_device) += chunk_bytes(chunk.grad_shard);
    m.grads_host += chunk_bytes(chunk.host_io) + chunk_bytes(chunk.host_grad);
    if (!chunk.master.is_same(chunk.shard)) {
      (chunk.placement.optim_on_host ? m.masters_host : m.masters_device) += chunk_bytes(chunk.master);
    }
  }
  return m;
}

int64_t GeminiDDP::device_model_bytes() const {
  const auto m = memory_bytes();
  return m.params_device + m.grads_device + m.masters_device;
}

}  // namespace colossus::zero::gemini
