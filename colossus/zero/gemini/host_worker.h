// HostWorker: the host side of Gemini's host step, off the thread that
// drives the GPU. One worker thread runs, in the order they were queued, each
// chunk's work once the copy it reads has landed (a CUDA event): under
// gradient accumulation the sum of a micro-batch's bf16 gradient into the
// chunk's fp32 host gradient (kernels::accumulate_bf16_cpu), and after the
// step's statistics the chunk's CPU Adam update. The kernels spread over every
// core themselves. Neither backward nor the next forward waits for the host
// except where it needs a chunk: GeminiDDP waits for that chunk alone.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace colossus::zero::gemini {

class HostWorker {
 public:
  explicit HostWorker(size_t chunks);
  ~HostWorker();  // finishes what is queued
  HostWorker(const HostWorker&) = delete;
  HostWorker& operator=(const HostWorker&) = delete;

  // Once `landed` (if any) has completed: sum = grad when `first`, else
  // sum += grad. sum: fp32, grad: bf16, both contiguous host tensors of one
  // size; both must stay unchanged until wait(chunk).
  void enqueue_sum(size_t chunk, at::Tensor sum, at::Tensor grad, std::optional<c10::Event> landed, bool first);
  // Once `landed` (if any) has completed, runs `work`.
  void enqueue(size_t chunk, std::optional<c10::Event> landed, std::function<void()> work);
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
    std::optional<c10::Event> landed;
    std::function<void()> work;
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
