// HostWorker (see host_worker.h).
#include "colossus/zero/gemini/host_worker.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "colossus/core/errors.h"
#include "colossus/kernels/grad_accumulate.h"

namespace colossus::zero::gemini {

HostWorker::HostWorker(size_t chunks) : pending_(chunks, 0), finite_(chunks, 1), worker_([this] { run(); }) {}

HostWorker::~HostWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  worker_.join();
}

void HostWorker::enqueue_sum(size_t chunk, at::Tensor sum, at::Tensor grad, std::optional<c10::Event> landed,
                             bool first) {
  if (chunk >= pending_.size() || !sum.is_cpu() || !grad.is_cpu() || sum.scalar_type() != at::kFloat ||
      grad.scalar_type() != at::kBFloat16 || !sum.is_contiguous() || !grad.is_contiguous() ||
      sum.numel() != grad.numel()) {
    throw DistError(fmt::format("gemini: HostWorker::enqueue_sum wants chunk < {} and an fp32 sum beside a bf16 "
                                "gradient of its size on the host; got chunk {}, {} {} and {} {}",
                                pending_.size(), chunk, c10::toString(sum.scalar_type()), sum.device().str(),
                                c10::toString(grad.scalar_type()), grad.device().str()));
  }
  // The flag is written by the worker and read after wait(chunk), which
  // synchronises through the mutex.
  char* finite = &finite_[chunk];
  enqueue(chunk, std::move(landed), [sum = std::move(sum), grad = std::move(grad), first, finite] {
    *finite = kernels::accumulate_bf16_cpu(sum.data_ptr<float>(), grad.data_ptr(), sum.numel(), first) ? 1 : 0;
  });
}

void HostWorker::enqueue(size_t chunk, std::optional<c10::Event> landed, std::function<void()> work) {
  if (chunk >= pending_.size()) {
    throw DistError(fmt::format("gemini: HostWorker::enqueue: chunk {} of {}", chunk, pending_.size()));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++pending_[chunk];
    tasks_.push_back({chunk, std::move(landed), std::move(work)});
  }
  queued_.notify_one();
}

void HostWorker::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    queued_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, nothing left
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    const size_t chunk = task.chunk;
    lock.unlock();
    std::exception_ptr error;
    try {
      if (task.landed) task.landed->synchronize();
      task.work();
    } catch (...) {
      error = std::current_exception();
    }
    task = {};  // what the work held goes before the waiter wakes
    lock.lock();
    if (error && !error_) error_ = error;
    --pending_[chunk];
    done_.notify_all();
  }
}

void HostWorker::rethrow_locked() {
  if (error_) std::rethrow_exception(error_);
}

void HostWorker::wait(size_t chunk) {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_.at(chunk) == 0; });
  rethrow_locked();
}

void HostWorker::wait_all() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] {
    for (int n : pending_)
      if (n != 0) return false;
    return true;
  });
  rethrow_locked();
}

bool HostWorker::finite(size_t chunk) const { return finite_.at(chunk) != 0; }

}  // namespace colossus::zero::gemini
