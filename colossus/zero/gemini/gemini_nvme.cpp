// GeminiOptimizer's NVMe offload: the inner optimizer's state of the chosen
// host chunks lives in files between steps. The step runs every other chunk
// in one inner step, then the offloaded chunks one at a time (their
// parameters' gradients shown to the inner optimizer only during their turn,
// which elementwise optimizers step exactly as in one call): chunk i's state
// is read before its step, chunk i+1's read is already in flight, and chunk
// i's write starts right after, all on NvmeStore's worker threads, through
// the store's aligned buffers (O_DIRECT), three kept for the whole run. The
// fp32 masters stay in host memory. The byte accounting by place lives here
// too.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cmath>

#include "colossus/core/errors.h"
#include "colossus/optim/lamb.h"
#include "colossus/optim/stateful_optimizer.h"
#include "colossus/zero/gemini/gemini_optimizer.h"

namespace colossus::zero::gemini {

void GeminiOptimizer::setup_nvme() {
  const auto& options = ddp_.options();
  if (options.nvme_offload_fraction <= 0.0) return;
  if (options.nvme_offload_dir.empty()) {
    throw ConfigError(fmt::format("gemini: nvme_offload_fraction={} needs nvme_offload_dir (a directory on fast local "
                                  "storage, e.g. /local_nvme/gemini)",
                                  options.nvme_offload_fraction));
  }
  if (!dynamic_cast<const optim::StatefulOptimizer*>(inner_.get()) || dynamic_cast<optim::Lamb*>(inner_.get())) {
    throw ConfigError(fmt::format("gemini: nvme_offload_fraction={} steps offloaded chunks one at a time, which needs an "
                                  "elementwise optimizer (AdamW, Adam, HybridAdam, SGD), not {}",
                                  options.nvme_offload_fraction, inner_->name()));
  }
  std::vector<size_t> host;
  for (size_t c = 0; c < ddp_.chunks().size(); ++c) {
    if (ddp_.chunks()[c].placement.optim_on_host) host.push_back(c);
  }
  const auto count = static_cast<size_t>(std::llround(options.nvme_offload_fraction * static_cast<double>(host.size())));
  nvme_chunks_.assign(host.begin(), host.begin() + static_cast<std::ptrdiff_t>(std::min(count, host.size())));
  if (nvme_chunks_.empty()) return;
  // One name per optimizer: ranks and runs may share the directory.
  static std::atomic<int> instances{0};
  nvme_ = std::make_unique<NvmeStore>(
      options.nvme_offload_dir,
      fmt::format("gemini_optim.rank{}.pid{}.{}", ddp_.dp_group()->rank(), ::getpid(), instances++),
      NvmeStoreOptions{.direct_io = options.nvme_direct_io});
}

std::vector<at::Tensor> GeminiOptimizer::chunk_state(size_t c) const {
  std::vector<at::Tensor> out;
  const auto& stateful = dynamic_cast<const optim::StatefulOptimizer&>(*inner_);
  for (size_t k : ddp_.chunks()[c].layout.params) {
    for (auto& t : stateful.state_tensors(inner_index_[k])) out.push_back(t);
  }
  return out;
}

void GeminiOptimizer::step_inner() {
  if (!nvme_) {
    inner_->step();
    return;
  }
  const auto& chunks = ddp_.chunks();
  std::vector<at::Tensor> grads(ddp_.params().size());
  auto show = [&](size_t c, bool visible) {
    for (size_t k : chunks[c].layout.params) {
      const at::Tensor& master = ddp_.master_view(k);
      if (visible && !grads[k].defined()) continue;  // never hidden
      if (!visible && !grads[k].defined()) grads[k] = master.grad();
      master.mutable_grad() = visible ? grads[k] : at::Tensor();
    }
  };
  std::vector<bool> offloaded(chunks.size(), false);
  for (size_t c : nvme_chunks_) offloaded[c] = true;
  for (size_t c : nvme_chunks_) show(c, false);
  try {
    inner_->step();  // every chunk whose state is in memory; then only one chunk's gradients at a time
    for (size_t c = 0; c < chunks.size(); ++c) {
      if (!offloaded[c]) show(c, false);
    }
    for (size_t i = 0; i < nvme_chunks_.size(); ++i) {
      const size_t c = nvme_chunks_[i];
      if (i == 0) nvme_->read_async(c, chunk_state(c));
      if (i + 1 < nvme_chunks_.size()) nvme_->read_async(nvme_chunks_[i + 1], chunk_state(nvme_chunks_[i + 1]));
      nvme_->wait(c);
      show(c, true);
      inner_->step();
      show(c, false);
      nvme_->write_async(c, chunk_state(c));  // state made by this first step is written too
    }
    nvme_->wait_all();
  } catch (...) {
    for (size_t c = 0; c < chunks.size(); ++c) show(c, true);
    throw;
  }
  for (size_t c = 0; c < chunks.size(); ++c) show(c, true);
}

void GeminiOptimizer::nvme_fetch_all() const {
  if (!nvme_) return;
  for (size_t c : nvme_chunks_) nvme_->read_async(c, chunk_state(c));
  nvme_->wait_all();
}

void GeminiOptimizer::nvme_evict_all() const {
  if (!nvme_) return;
  for (size_t c : nvme_chunks_) nvme_->write_async(c, chunk_state(c));
  nvme_->wait_all();
}

GeminiMemory GeminiOptimizer::memory_bytes() const {
  ddp_.finish_host_updates();  // the first step creates the moments on the host worker
  GeminiMemory m = ddp_.memory_bytes();
  // Between steps every offloaded group is in its file and the buffers hold
  // none of it (a checkpoint's reads are counted in optim_host meanwhile).
  m.nvme_buffers_host = nvme_ ? nvme_->buffer_bytes() : 0;
  const auto& stateful = dynamic_cast<const optim::StatefulOptimizer*>(inner_.get());
  for (size_t i = 0; i < inner_order_.size(); ++i) {
    const auto& slot = ddp_.layout().slots[inner_order_[i]];
    const bool host = ddp_.chunks()[slot.bucket].placement.optim_on_host;
    std::vector<at::Tensor> state;
    if (stateful) {
      state = stateful->state_tensors(static_cast<int64_t>(i));
    } else {
      // Other optimizers: their state_dict, by "state.<flat index>.<slot>".
      for (const auto& [name, t] : inner_->state_dict().tensors) {
        if (name.rfind(fmt::format("state.{}.", i), 0) == 0) state.push_back(t);
      }
    }
    for (const auto& t : state) {
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      if (bytes > 0 && t.storage().nbytes() == 0) {
        m.optim_nvme += bytes;  // emptied in place: the bytes are in the file
      } else {
        (host ? m.optim_host : m.optim_device) += bytes;
      }
    }
  }
  return m;
}

}  // namespace colossus::zero::gemini
