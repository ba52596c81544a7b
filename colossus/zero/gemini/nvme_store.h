// NvmeStore: host tensors whose bytes live in a file between uses (Gemini's
// NVMe offload of optimizer state). A group of tensors (one chunk's state) is
// written to its own file and its storage emptied in place, then refilled
// from the file before the next use; the tensors keep their identity, so the
// optimizer holding them never notices. While a group is in memory its
// tensors live in one aligned buffer of a small pool that the store keeps
// for its whole life (nothing is allocated or freed step by step), and the
// file moves straight between that buffer and the disk with O_DIRECT where
// the filesystem takes it (buffered IO where it refuses: one logged line).
// Reads and writes run on a small thread pool, so the next chunk's read
// overlaps this chunk's step.
#pragma once
#include <ATen/core/Tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace colossus::zero::gemini {

struct NvmeStoreOptions {
  // O_DIRECT (no page cache: the bytes go from the buffer to the device);
  // where the filesystem refuses it (EINVAL) the store falls back to
  // buffered IO and logs one line. false: buffered IO from the start.
  bool direct_io = true;
  int threads = 2;
  // Buffers kept between steps: the chunk being stepped, the one read ahead
  // and the one being written. More are made only while every buffer holds
  // a group in memory and none is being written (a checkpoint reads every
  // group in); those go again when their write is done.
  size_t buffers = 3;
  // Test only: every O_DIRECT open fails with EINVAL, as on a filesystem
  // without O_DIRECT, so the fallback runs on any machine.
  bool refuse_direct_io_for_testing = false;
};

class NvmeStore {
 public:
  // O_DIRECT's alignment of buffer addresses, file offsets and lengths (the
  // largest logical block size in use); a file's tail is padded to it.
  static constexpr int64_t kIoAlignment = 4096;
  // Alignment of each tensor inside a group's buffer.
  static constexpr int64_t kTensorAlignment = 64;

  // Files are `dir/<tag>.<key>.bin` (dir created); removed when the store dies.
  NvmeStore(std::string dir, std::string tag, NvmeStoreOptions options = {});
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Starts writing `tensors` (contiguous, CPU, each its own storage) to file
  // `key`; their storage is emptied once the bytes are out. The caller must
  // not touch them until a read of the same key was waited for.
  void write_async(size_t key, std::vector<at::Tensor> tensors);
  // Points the tensors' storage into a pool buffer and starts reading file
  // `key` into it (after any pending write of that key). May wait for a
  // write to free a buffer.
  void read_async(size_t key, std::vector<at::Tensor> tensors);
  // Waits for the last operation on `key`; rethrows its error.
  void wait(size_t key);
  void wait_all();
  bool on_disk(size_t key) const;  // written and not read back since
  std::string path(size_t key) const;
  // The file's size for a group: the tensors back to back at
  // kTensorAlignment, the tail padded to kIoAlignment.
  static int64_t file_bytes(const std::vector<at::Tensor>& tensors);

  // Whether IO goes through O_DIRECT (false: asked off, or refused).
  bool direct_io() const { return direct_.load(); }
  // Buffers allocated so far (steady after the first steps), and the bytes
  // of those alive now.
  int64_t buffer_allocations() const;
  int64_t buffer_bytes() const;

 private:
  struct AlignedBuffer;  // nvme_store.cpp
  using BufferPtr = std::shared_ptr<AlignedBuffer>;

  void submit(size_t key, std::function<void()> work);
  void run();
  BufferPtr acquire(int64_t bytes);  // caller's thread; may wait for a write
  void release(const BufferPtr& buffer, bool after_write);
  // One whole transfer of `bytes` (a multiple of kIoAlignment) between
  // `data` and file `key`; O_DIRECT unless refused.
  void transfer(size_t key, std::byte* data, int64_t bytes, bool write);
  void refuse_direct(const std::string& path, const char* what);

  std::string dir_, tag_;
  NvmeStoreOptions options_;
  std::atomic<bool> direct_;
  std::map<size_t, std::shared_future<void>> pending_;
  std::map<size_t, bool> on_disk_;
  std::map<size_t, BufferPtr> held_;  // groups in memory: the buffer their tensors live in
  // The pool (free buffers, counts) is shared with the workers, which give
  // buffers back after writes.
  mutable std::mutex pool_mutex_;
  std::condition_variable pool_ready_;
  std::vector<BufferPtr> free_;
  size_t live_buffers_ = 0;  // free + in use
  int64_t live_bytes_ = 0;
  int64_t largest_request_ = 0;
  int64_t allocations_ = 0;
  int writes_in_flight_ = 0;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace colossus::zero::gemini
