// NvmeStore: host tensors whose bytes live in a file between uses (Gemini's
// NVMe offload of optimizer state). A group of tensors (one chunk's state) is
// written to its own file and its storage emptied in place, then refilled
// from the file before the next use; the tensors keep their identity, so the
// optimizer holding them never notices. Reads and writes run on a small
// thread pool, so the next chunk's read overlaps this chunk's step.
#pragma once
#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace colossus::zero::gemini {

class NvmeStore {
 public:
  // Files are `dir/<tag>.<key>.bin` (dir created); removed when the store dies.
  NvmeStore(std::string dir, std::string tag, int threads = 2);
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Starts writing `tensors` (contiguous, CPU) to file `key`; their storage is
  // emptied once the bytes are out. The caller must not touch them until a
  // read of the same key was waited for.
  void write_async(size_t key, std::vector<at::Tensor> tensors);
  // Allocates the tensors' storage again and starts reading file `key` into
  // it (after any pending write of that key).
  void read_async(size_t key, std::vector<at::Tensor> tensors);
  // Waits for the last operation on `key`; rethrows its error.
  void wait(size_t key);
  void wait_all();
  bool on_disk(size_t key) const;  // written and not read back since
  std::string path(size_t key) const;

 private:
  void submit(size_t key, std::function<void()> work);
  void run();

  std::string dir_, tag_;
  std::map<size_t, std::shared_future<void>> pending_;
  std::map<size_t, bool> on_disk_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace colossus::zero::gemini
