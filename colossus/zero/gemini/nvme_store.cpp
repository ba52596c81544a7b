// NvmeStore (see nvme_store.h): positional reads and writes (pread/pwrite) of
// raw tensor bytes, one file per key, on a small worker pool.
#include "colossus/zero/gemini/nvme_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "colossus/core/errors.h"
#include "colossus/zero/gemini/chunk_storage.h"

namespace colossus::zero::gemini {

namespace {

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Whole transfers: pread/pwrite may move fewer bytes than asked.
void transfer(int fd, const std::string& path, std::byte* data, int64_t bytes, int64_t offset, bool write) {
  while (bytes > 0) {
    const ssize_t n = write ? ::pwrite(fd, data, static_cast<size_t>(bytes), offset)
                            : ::pread(fd, data, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw CheckpointError(fmt::format("gemini nvme offload: {} '{}' failed: {}", write ? "writing" : "reading",
                                        path, n < 0 ? std::strerror(errno) : "unexpected end of file"));
    }
    data += n;
    bytes -= n;
    offset += n;
  }
}

void transfer_all(const std::string& path, const std::vector<at::Tensor>& tensors, bool write) {
  const int fd = write ? ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600) : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw CheckpointError(fmt::format("gemini nvme offload: cannot open '{}': {}", path, std::strerror(errno)));
  }
  try {
    int64_t offset = 0;
    for (const auto& t : tensors) {
      transfer(fd, path, static_cast<std::byte*>(t.data_ptr()), nbytes(t), offset, write);
      offset += nbytes(t);
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

}  // namespace

NvmeStore::NvmeStore(std::string dir, std::string tag, int threads) : dir_(std::move(dir)), tag_(std::move(tag)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    throw ConfigError(fmt::format("gemini: nvme_offload_dir='{}' cannot be created ({}); pass a writable directory",
                                  dir_, ec.message()));
  }
  for (int i = 0; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { run(); });
}

NvmeStore::~NvmeStore() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& worker : workers_) worker.join();
  for (const auto& [key, written] : on_disk_) {
    std::error_code ec;
    std::filesystem::remove(path(key), ec);  // scratch files: nothing to report
  }
}

std::string NvmeStore::path(size_t key) const { return (std::filesystem::path(dir_) / fmt::format("{}.{}.bin", tag_, key)).string(); }

void NvmeStore::run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // an exception is stored in the future
  }
}

void NvmeStore::submit(size_t key, std::function<void()> work) {
  // Operations on one key run in order: each waits for the previous one.
  std::shared_future<void> previous;
  if (auto it = pending_.find(key); it != pending_.end()) previous = it->second;
  std::packaged_task<void()> task([previous, work = std::move(work)] {
    if (previous.valid()) previous.get();
    work();
  });
  pending_[key] = task.get_future().share();
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
  }
  ready_.notify_one();
}

void NvmeStore::write_async(size_t key, std::vector<at::Tensor> tensors) {
  on_disk_[key] = true;
  submit(key, [this, key, tensors = std::move(tensors)] {
    transfer_all(path(key), tensors, /*write=*/true);
    for (const auto& t : tensors) free_storage(t);
  });
}

void NvmeStore::read_async(size_t key, std::vector<at::Tensor> tensors) {
  if (!on_disk(key)) return;
  on_disk_[key] = false;
  // The storage comes back before the read is queued: a pending write of this
  // key frees it first, so the allocation waits for that write too.
  submit(key, [this, key, tensors = std::move(tensors)] {
    for (const auto& t : tensors) alloc_storage(t);
    transfer_all(path(key), tensors, /*write=*/false);
  });
}

void NvmeStore::wait(size_t key) {
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  auto future = it->second;
  pending_.erase(it);
  future.get();
}

void NvmeStore::wait_all() {
  std::exception_ptr error;
  while (!pending_.empty()) {
    try {
      wait(pending_.begin()->first);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

bool NvmeStore::on_disk(size_t key) const {
  auto it = on_disk_.find(key);
  return it != on_disk_.end() && it->second;
}

}  // namespace colossus::zero::gemini
