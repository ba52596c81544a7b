// NvmeStore (see nvme_store.h): one file per key, moved whole between the
// disk and an aligned pool buffer the group's tensors live in (O_DIRECT
// pread/pwrite, buffered where the filesystem refuses), on a small worker
// pool.
#include "colossus/zero/gemini/nvme_store.h"

#include <c10/core/StorageImpl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "colossus/cluster/logger.h"
#include "colossus/core/errors.h"
#include "colossus/zero/gemini/chunk_storage.h"

namespace colossus::zero::gemini {

struct NvmeStore::AlignedBuffer {
  std::byte* data = nullptr;
  int64_t capacity = 0;
  explicit AlignedBuffer(int64_t bytes) : capacity(bytes) {
    void* memory = nullptr;
    if (::posix_memalign(&memory, static_cast<size_t>(kIoAlignment), static_cast<size_t>(bytes)) != 0) {
      throw std::bad_alloc();
    }
    data = static_cast<std::byte*>(memory);
    std::memset(data, 0, static_cast<size_t>(bytes));  // the padding goes to disk as zeros
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

namespace {

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }
int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Each tensor's offset in its group's buffer and file.
std::vector<int64_t> offsets_of(const std::vector<at::Tensor>& tensors) {
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    const auto storage_bytes = static_cast<int64_t>(t.storage().nbytes());
    TORCH_CHECK(t.is_contiguous() && t.storage_offset() == 0 && t.device().is_cpu() &&
                    (storage_bytes == 0 || storage_bytes == nbytes(t)),
                "nvme offload: state tensors must be contiguous CPU tensors that own their storage");
    offset = round_up(offset, NvmeStore::kTensorAlignment);
    offsets.push_back(offset);
    offset += nbytes(t);
  }
  return offsets;
}

void no_delete(void*) {}

// The tensor's storage becomes `bytes` at `data` (owned by the pool): the
// allocator's memory it held, if any, is freed.
void bind_storage(const at::Tensor& t, std::byte* data) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(data, nullptr, &no_delete, t.device()));
  storage->set_nbytes(static_cast<size_t>(nbytes(t)));
}

const cluster::Logger& logger() {
  static const cluster::Logger log("gemini");
  return log;
}

}  // namespace

NvmeStore::NvmeStore(std::string dir, std::string tag, NvmeStoreOptions options)
    : dir_(std::move(dir)), tag_(std::move(tag)), options_(options), direct_(options.direct_io) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    throw ConfigError(fmt::format("gemini: nvme_offload_dir='{}' cannot be created ({}); pass a writable directory",
                                  dir_, ec.message()));
  }
  options_.buffers = std::max<size_t>(options_.buffers, 1);
  for (int i = 0; i < std::max(options_.threads, 1); ++i) workers_.emplace_back([this] { run(); });
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

int64_t NvmeStore::file_bytes(const std::vector<at::Tensor>& tensors) {
  const auto offsets = offsets_of(tensors);
  return tensors.empty() ? 0 : round_up(offsets.back() + nbytes(tensors.back()), kIoAlignment);
}

int64_t NvmeStore::buffer_allocations() const {
  std::lock_guard lock(pool_mutex_);
  return allocations_;
}

int64_t NvmeStore::buffer_bytes() const {
  std::lock_guard lock(pool_mutex_);
  return live_bytes_;
}

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

NvmeStore::BufferPtr NvmeStore::acquire(int64_t bytes) {
  std::unique_lock lock(pool_mutex_);
  // New buffers take the largest group asked for so far, so that groups of
  // a few sizes (a chunk with padding, the last one) settle on one size.
  largest_request_ = std::max({largest_request_, bytes, kIoAlignment});
  for (;;) {
    auto fits = std::find_if(free_.begin(), free_.end(), [&](const BufferPtr& b) { return b->capacity >= bytes; });
    if (fits != free_.end()) {
      BufferPtr buffer = *fits;
      free_.erase(fits);
      return buffer;
    }
    if (!free_.empty() && live_buffers_ >= options_.buffers) {
      // Free but too small (a smaller group came first): make room for a
      // larger one in its place.
      live_bytes_ -= free_.back()->capacity;
      free_.pop_back();
      --live_buffers_;
      continue;
    }
    // Below the pool's size, or nothing would give one back: a new buffer.
    // Otherwise a write in flight will.
    if (live_buffers_ < options_.buffers || writes_in_flight_ == 0) {
      auto buffer = std::make_shared<AlignedBuffer>(largest_request_);
      ++live_buffers_;
      live_bytes_ += buffer->capacity;
      ++allocations_;
      return buffer;
    }
    pool_ready_.wait(lock);
  }
}

void NvmeStore::release(const BufferPtr& buffer, bool after_write) {
  {
    std::lock_guard lock(pool_mutex_);
    if (after_write) --writes_in_flight_;
    // One made past the pool's size (a checkpoint's reads) goes, and so does
    // one smaller than the largest group: the pool settles on one size.
    if (live_buffers_ > options_.buffers || buffer->capacity < largest_request_) {
      --live_buffers_;
      live_bytes_ -= buffer->capacity;
    } else {
      free_.push_back(buffer);
    }
  }
  pool_ready_.notify_all();
}

void NvmeStore::refuse_direct(const std::string& path, const char* what) {
  if (direct_.exchange(false)) {
    logger().warning(fmt::format("gemini nvme offload: {} '{}' with O_DIRECT was refused ({}); using buffered IO",
                                 what, path, std::strerror(EINVAL)),
                     cluster::kAllRanks);
  }
}

void NvmeStore::transfer(size_t key, std::byte* data, int64_t bytes, bool write) {
  const std::string file = path(key);
  const int flags = (write ? O_WRONLY | O_CREAT : O_RDONLY) | O_CLOEXEC;
  for (;;) {
    const bool direct = direct_.load();
    int fd = -1;
    if (direct && options_.refuse_direct_io_for_testing) {
      errno = EINVAL;
    } else {
      fd = ::open(file.c_str(), flags | (direct ? O_DIRECT : 0), 0600);
    }
    if (fd < 0) {
      if (direct && errno == EINVAL) {
        refuse_direct(file, "opening");
        continue;
      }
      throw CheckpointError(fmt::format("gemini nvme offload: cannot open '{}': {}", file, std::strerror(errno)));
    }
    // Whole transfers: pread/pwrite may move fewer bytes than asked.
    int64_t done = 0;
    int error = 0;
    while (done < bytes) {
      const ssize_t n = write ? ::pwrite(fd, data + done, static_cast<size_t>(bytes - done), done)
                              : ::pread(fd, data + done, static_cast<size_t>(bytes - done), done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = n < 0 ? errno : -1;
        break;
      }
      done += n;
    }
    ::close(fd);
    if (error == 0) return;
    if (direct && error == EINVAL) {  // opened, but the filesystem takes no direct transfer
      refuse_direct(file, write ? "writing" : "reading");
      continue;
    }
    throw CheckpointError(fmt::format("gemini nvme offload: {} '{}' failed: {}", write ? "writing" : "reading", file,
                                      error > 0 ? std::strerror(error) : "unexpected end of file"));
  }
}

void NvmeStore::write_async(size_t key, std::vector<at::Tensor> tensors) {
  on_disk_[key] = true;
  const auto offsets = offsets_of(tensors);
  const int64_t bytes = file_bytes(tensors);
  // A group read back lives in its buffer already; a new one (its first
  // write, or state the optimizer made anew) is copied into one.
  BufferPtr buffer, outgrown;  // outgrown: the group's buffer, too small now; freed after the copy
  if (auto it = held_.find(key); it != held_.end()) {
    buffer = it->second;
    held_.erase(it);
  }
  if (!buffer || buffer->capacity < bytes) {
    outgrown = std::move(buffer);
    buffer = acquire(bytes);
  }
  {
    std::lock_guard lock(pool_mutex_);
    ++writes_in_flight_;
  }
  submit(key, [this, key, tensors = std::move(tensors), offsets, bytes, buffer, outgrown] {
    try {
      // Tensors in the buffer at other offsets than now (the optimizer made
      // state for a parameter that had none) are copied from a snapshot.
      std::byte* const begin = buffer->data;
      std::byte* const end = buffer->data + buffer->capacity;
      std::vector<std::byte> snapshot;
      for (size_t i = 0; i < tensors.size(); ++i) {
        auto* data = static_cast<std::byte*>(tensors[i].data_ptr());
        if (nbytes(tensors[i]) > 0 && data >= begin && data < end && data != begin + offsets[i] && snapshot.empty()) {
          snapshot.assign(begin, end);
        }
      }
      for (size_t i = 0; i < tensors.size(); ++i) {
        const at::Tensor& t = tensors[i];
        if (nbytes(t) == 0) continue;
        std::byte* slot = begin + offsets[i];
        auto* data = static_cast<std::byte*>(t.data_ptr());
        if (data != slot) {
          const std::byte* from = data >= begin && data < end ? snapshot.data() + (data - begin) : data;
          std::memcpy(slot, from, static_cast<size_t>(nbytes(t)));
        }
        free_storage(t);  // the allocator's memory, if it had any, goes back
      }
      if (outgrown) release(outgrown, false);
      transfer(key, buffer->data, bytes, /*write=*/true);
    } catch (...) {
      release(buffer, true);
      throw;
    }
    release(buffer, true);
  });
}

void NvmeStore::read_async(size_t key, std::vector<at::Tensor> tensors) {
  if (!on_disk(key)) return;
  on_disk_[key] = false;
  const auto offsets = offsets_of(tensors);
  const int64_t bytes = file_bytes(tensors);
  BufferPtr buffer = acquire(bytes);
  held_[key] = buffer;
  // The storage is pointed at the buffer inside the task: a pending write of
  // this key empties it first.
  submit(key, [this, key, tensors = std::move(tensors), offsets, bytes, buffer] {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (nbytes(tensors[i]) > 0) bind_storage(tensors[i], buffer->data + offsets[i]);
    }
    transfer(key, buffer->data, bytes, /*write=*/false);
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
