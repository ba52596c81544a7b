#include "colossus/checkpoint/async_writer.h"

#include <ATen/ops/empty.h>

#include <utility>

namespace colossus::checkpoint {

NamedTensors host_snapshot(const NamedTensors& tensors, bool cpu_tensors_are_private) {
  NamedTensors out;
  out.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    at::Tensor source = tensor.detach();
    if (source.is_cpu() && cpu_tensors_are_private) {
      out.emplace_back(name, source);
      continue;
    }
    // Pinned memory makes the device-to-host copy a DMA at full bus speed; it
    // needs the CUDA runtime, which a CPU tensor's program may not have.
    at::Tensor host = at::empty(source.sizes(), source.options().device(at::kCPU).pinned_memory(!source.is_cpu()));
    // Synchronous: the background thread reads `host` without any stream.
    host.copy_(source, /*non_blocking=*/false);
    out.emplace_back(name, std::move(host));
  }
  return out;
}

AsyncWriter::~AsyncWriter() {
  if (worker_.joinable()) worker_.join();
}

void AsyncWriter::submit(std::function<void()> job) {
  wait();
  worker_ = std::thread([this, job = std::move(job)] {
    try {
      job();
    } catch (...) {
      error_ = std::current_exception();  // read only after join(), which orders it
    }
  });
}

void AsyncWriter::wait() {
  if (worker_.joinable()) worker_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace colossus::checkpoint
