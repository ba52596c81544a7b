// HostAccumulator: Gemini's host step under gradient accumulation sums each
// micro-batch's reduced bf16 gradient, once its copy has landed in pinned
// host memory, into the chunk's fp32 host gradient. One worker thread does
// the sums in the order they were queued (the kernel itself spreads over
// every core), so neither backward nor the next micro-batch waits for the
// host; the optimizer waits before it reads the sums.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace colossus::zero::gemini {

class HostAccumulator {
 public:
  explicit HostAccumulator(size_t chunks);
  ~HostAccumulator();  // finishes what is queued
  HostAccumulator(const HostAccumulator&) = delete;
  HostAccumulator& operator=(const HostAccumulator&) = delete;

  // Once `landed` (if any) has completed: sum = grad when `first`, else
  // sum += grad. sum: fp32, grad: bf16, both contiguous host tensors of one
  // size; both must stay unchanged until wait(chunk).
  void enqueue(size_t chunk, at::Tensor sum, at::Tensor grad, std::optional<c10::Event> landed, bool first);
  // Until everything queued for `chunk` (or for every chunk) is done;
  // rethrows the first error the worker met.
  void wait(size_t chunk);
  void wait_all();
  // Whether every value of the chunk's sum was finite after its last
  // addition (read after wait).
  bool finite(size_t chunk) const;

 private:
  struct Task {
    size_t chunk;
    at::Tensor sum, grad;
    std::optional<c10::Event> landed;
    bool first;
  };
  void run();
  void rethrow_locked();

  std::mutex mutex_;
  std::condition_variable queued_, done_;
  std::deque<Task> tasks_;
  std::vector<int> pending_;  // queued or running, per chunk
  std::vector<char> finite_;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread worker_;  // last: started once the rest exists
};

}  // namespace colossus::zero::gemini
