// Background checkpoint writing: the tensors of a save are copied to host
// memory on the caller's thread (so training may update the originals right
// after), then a job writes them on a worker thread while training goes on.
// Every file a job writes should still be published atomically (temp file +
// rename, as save_safetensors/save_sharded do), so a crash mid-save leaves the
// previous checkpoint intact.
#pragma once
#include "colossus/checkpoint/safetensors.h"

#include <exception>
#include <functional>
#include <thread>

namespace colossus::checkpoint {

// Host copies of `tensors`, same names, dtypes and shapes, contiguous, that no
// later in-place update of the originals reaches. CUDA tensors are copied into
// pinned (page-locked) memory; CPU tensors are cloned unless
// `cpu_tensors_are_private` says nobody else holds them (e.g. the fresh clones
// of an optimizer's state_dict()), in which case they are passed through.
NamedTensors host_snapshot(const NamedTensors& tensors, bool cpu_tensors_are_private = false);

// One background job at a time: submit() joins the previous job first, so a
// writer never holds more than one snapshot in memory and two saves to the
// same files never race. An owner that cares about errors calls wait() before
// destroying it; the destructor joins and drops an error nobody waited for.
class AsyncWriter {
 public:
  AsyncWriter() = default;
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Joins the previous job; if it failed, rethrows its exception and `job`
  // does not start. Otherwise runs `job` on a new thread.
  void submit(std::function<void()> job);
  // Blocks until the current job (if any) has finished; rethrows its
  // exception, once.
  void wait();
  // A job was submitted and not yet waited for (it may have finished).
  bool busy() const { return worker_.joinable(); }

 private:
  std::thread worker_;
  std::exception_ptr error_;
};

}  // namespace colossus::checkpoint
