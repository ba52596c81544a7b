#include "colossus/checkpoint/file_io.h"

#include "colossus/core/errors.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace colossus::checkpoint::io {

namespace {

[[noreturn]] void fail(std::string_view what, const std::string& path, int err) {
  throw CheckpointError(fmt::format("{} '{}': {}", what, path, std::strerror(err)));
}

// Closes on scope exit; used where an fd never escapes the function.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

void write_fully(int fd, const std::byte* data, std::size_t bytes, const std::string& path) {
  // write() may write less than asked (signals, >2 GB requests); loop until done.
  constexpr std::size_t kMaxChunk = std::size_t{1} << 30;
  while (bytes > 0) {
    ssize_t n = ::write(fd, data, std::min(bytes, kMaxChunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", path, errno);
    }
    data += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

std::function<void(std::string_view)>& fault_hook() {
  static std::function<void(std::string_view)> hook;
  return hook;
}

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::map(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
  // forever; the regular-file check below refuses it. No effect on files.
  FdGuard file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.fd < 0) fail("cannot open checkpoint file", path, errno);
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) fail("cannot stat checkpoint file", path, errno);
  if (!S_ISREG(st.st_mode)) throw CheckpointError(fmt::format("checkpoint file '{}' is not a regular file", path));
  auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) return std::make_shared<const MappedFile>(Key{}, nullptr, 0, false);
  // MAP_NORESERVE: a private writable mapping would otherwise be charged in
  // full against the commit limit although its pages are only read.
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, file.fd, 0);
  bool writable = true;
  if (addr == MAP_FAILED && errno == ENOMEM) {
    addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd, 0);
    writable = false;
  }
  if (addr == MAP_FAILED) fail("cannot map checkpoint file", path, errno);
  return std::make_shared<const MappedFile>(Key{}, static_cast<std::byte*>(addr), size, writable);
}

void MappedFile::release(const std::byte* begin, std::size_t bytes) const {
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  // Whole pages only: a page shared with a neighbouring tensor may still be in use.
  const auto first = (reinterpret_cast<std::uintptr_t>(begin) + page - 1) / page * page;
  const auto last = (reinterpret_cast<std::uintptr_t>(begin) + bytes) / page * page;
  if (last <= first) return;
  // Advice only: where the kernel declines, the pages just stay resident.
  ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

std::string read_regular_file(const std::string& path, std::size_t max_bytes, std::string_view what) {
  FdGuard file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.fd < 0) fail(fmt::format("cannot open {}", what), path, errno);
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) fail(fmt::format("cannot stat {}", what), path, errno);
  if (!S_ISREG(st.st_mode)) throw CheckpointError(fmt::format("{} '{}' is not a regular file", what, path));
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    throw CheckpointError(fmt::format("{} '{}' is {} bytes, more than the {} such a file can have", what, path,
                                      st.st_size, max_bytes));
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::read(file.fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(fmt::format("cannot read {}", what), path, errno);
    }
    if (n == 0) break;  // shrank while we read: what is there
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  return text;
}

std::string confined_path(const std::string& root, const std::string& path) {
  namespace fs = std::filesystem;
  auto resolve = [](const std::string& p) {
    std::error_code ec;
    auto real = fs::canonical(p, ec);
    if (ec) throw CheckpointError(fmt::format("cannot resolve '{}': {}", p, ec.message()));
    return real;
  };
  const fs::path real_root = resolve(root);
  const fs::path real = resolve(path);
  auto inside = [&](const fs::path& dir) {
    auto [dir_end, real_it] = std::mismatch(dir.begin(), dir.end(), real.begin(), real.end());
    return dir_end == dir.end() && real_it != real.end();
  };
  if (inside(real_root)) return real.string();
  // huggingface_hub's cache: models--org--name/snapshots/<rev>/x -> ../../blobs/<sha>.
  const fs::path repo = real_root.parent_path().parent_path();
  if (real_root.parent_path().filename() == "snapshots" && inside(repo / "blobs")) return real.string();
  throw CheckpointError(fmt::format("'{}' resolves to '{}', outside the checkpoint folder '{}'; a checkpoint may only "
                                    "name files inside its own folder",
                                    path, real.string(), real_root.string()));
}

std::string temp_path_for(const std::string& path) { return fmt::format("{}.tmp.{}", path, ::getpid()); }

TempFile::TempFile(std::string final_path, std::string temp_path)
    : final_path_(std::move(final_path)), temp_path_(std::move(temp_path)) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", temp_path_, errno);
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!done_) ::unlink(temp_path_.c_str());
}

void TempFile::write(const void* data, std::size_t bytes) {
  if (fd_ < 0) throw CheckpointError(fmt::format("internal: write to closed file '{}'", temp_path_));
  write_fully(fd_, static_cast<const std::byte*>(data), bytes, temp_path_);
}

void TempFile::flush_and_close() {
  if (fd_ < 0) return;
  // fsync before rename: otherwise a crash can leave the new name pointing at
  // a file whose data never reached the disk.
  if (::fsync(fd_) != 0) fail("cannot fsync", temp_path_, errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close", temp_path_, errno);
}

void TempFile::finish() {
  flush_and_close();
  done_ = true;
}

void TempFile::publish() {
  flush_and_close();
  rename_file(temp_path_, final_path_);
  done_ = true;
  fsync_dir(parent_dir(final_path_));
}

void rename_file(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    int err = errno;
    throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", from, to, std::strerror(err)));
  }
}

void link_or_copy(const std::string& from, const std::string& to) {
  std::string staging = fmt::format("{}.link.{}", to, ::getpid());
  ::unlink(staging.c_str());
  if (::link(from.c_str(), staging.c_str()) == 0) {
    rename_file(staging, to);
    return;
  }
  // No hard links here (some network and FUSE filesystems): copy instead.
  FdGuard in{::open(from.c_str(), O_RDONLY | O_CLOEXEC)};
  if (in.fd < 0) fail("cannot open", from, errno);
  TempFile out(to, staging);
  std::vector<std::byte> buffer(std::size_t{8} << 20);
  while (true) {
    ssize_t n = ::read(in.fd, buffer.data(), buffer.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot read", from, errno);
    }
    if (n == 0) break;
    out.write(buffer.data(), static_cast<std::size_t>(n));
  }
  out.publish();
}

void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) fail("cannot remove", path, errno);
}

namespace {

// Removes the entries of the directory open at `dir_fd` (which it closes),
// depth first, never following a symbolic link out of the tree.
void remove_entries(int dir_fd, const std::string& path) {
  DIR* dir = ::fdopendir(dir_fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(dir_fd);
    fail("cannot list directory", path, err);
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(dir, ::closedir);
  while (dirent* entry = ::readdir(dir)) {
    const std::string_view name(entry->d_name);
    if (name == "." || name == "..") continue;
    const std::string child = path + "/" + std::string(name);
    struct stat st {};
    if (::fstatat(::dirfd(dir), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) fail("cannot stat", child, errno);
    if (S_ISDIR(st.st_mode)) {
      const int child_fd = ::openat(::dirfd(dir), entry->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child_fd < 0) fail("cannot open directory", child, errno);
      remove_entries(child_fd, child);
      if (::unlinkat(::dirfd(dir), entry->d_name, AT_REMOVEDIR) != 0) fail("cannot remove", child, errno);
    } else if (::unlinkat(::dirfd(dir), entry->d_name, 0) != 0) {
      fail("cannot remove", child, errno);
    }
  }
}

}  // namespace

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    fail("cannot stat", path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fail("cannot open directory", path, errno);
    remove_entries(fd, path);
    if (::rmdir(path.c_str()) != 0) fail("cannot remove", path, errno);
  } else {
    remove_file(path);
  }
}

void fsync_dir(const std::string& dir) {
  FdGuard d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) fail("cannot open directory", dir, errno);
  // Some filesystems cannot fsync a directory (EINVAL); their renames are as
  // durable as they get, so that is not an error.
  if (::fsync(d.fd) != 0 && errno != EINVAL && errno != ENOTSUP) fail("cannot fsync directory", dir, errno);
}

void fsync_tree(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    // Links are neither followed nor flushed: what they name is not part of the tree.
    const fs::file_status status = entry.symlink_status();
    if (fs::is_directory(status)) {
      fsync_dir(entry.path().string());
    } else if (fs::is_regular_file(status)) {
      FdGuard f{::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
      if (f.fd < 0) fail("cannot open", entry.path().string(), errno);
      if (::fsync(f.fd) != 0) fail("cannot fsync", entry.path().string(), errno);
    }
  }
  fsync_dir(dir);
}

std::string parent_dir(const std::string& path) {
  auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void set_fault_hook(std::function<void(std::string_view step)> hook) { fault_hook() = std::move(hook); }

void fault_point(std::string_view step) {
  if (fault_hook()) fault_hook()(step);
}

}  // namespace colossus::checkpoint::io
