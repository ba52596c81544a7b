// POSIX file plumbing for checkpoints: a whole-file private mapping, a file
// written under a temporary name and published by rename, and the small
// filesystem operations (rename, link, remove, fsync of a directory) that the
// atomic save protocols are built from. Every failure throws CheckpointError
// naming the path and the OS error.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace colossus::checkpoint::io {

// The whole file, mapped MAP_PRIVATE: writes through a pointer into it land in
// private copy-on-write pages and never reach the file. Where the kernel
// refuses a writable mapping (strict overcommit), the mapping is read-only.
class MappedFile {
 public:
  static std::shared_ptr<const MappedFile> map(const std::string& path);

  // Only map() can name Key, so only it constructs (through make_shared).
  class Key {
    friend class MappedFile;
    Key() = default;
  };
  MappedFile(Key, std::byte* data, std::size_t size, bool writable) : data_(data), size_(size), writable_(writable) {}
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }  // bytes
  bool writable() const { return writable_; }
  // Returns this process's resident pages wholly inside [begin, begin + bytes)
  // to the kernel (madvise DONTNEED): a later read faults them in again from
  // the file, so a loader that copied a tensor out does not keep counting it
  // in its RSS. Pages written through the private mapping lose those writes.
  void release(const std::byte* begin, std::size_t bytes) const;

 private:
  std::byte* data_;
  std::size_t size_;
  bool writable_;
};

// The whole of a small file (JSON state, `latest`): opened without blocking
// (a FIFO or device never hangs the reader), refused unless it is a regular
// file of at most max_bytes. `what` names the file's role in errors, which
// never quote its contents.
std::string read_regular_file(const std::string& path, std::size_t max_bytes, std::string_view what);

// `path` with every symlink resolved (realpath), provided it lies inside
// `root` (also resolved); else CheckpointError naming both. So a shard or an
// index entry cannot lead a load out of its checkpoint folder. One exception:
// a Hugging Face hub cache snapshot (`.../snapshots/<rev>/`) links its files
// into the repository's `blobs/` folder, which is allowed for such a root.
std::string confined_path(const std::string& root, const std::string& path);

// `path + ".tmp.<pid>"`: where a file is written before it is renamed onto path.
std::string temp_path_for(const std::string& path);

// A file open for writing at temp_path. publish() flushes it to disk and
// renames it onto final_path; finish() only flushes and closes, leaving it at
// temp_path for the caller to move. If neither ran (an exception unwound past
// it), the destructor removes the temp file, so failed saves leave no debris.
class TempFile {
 public:
  TempFile(std::string final_path, std::string temp_path);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const void* data, std::size_t bytes);
  void finish();   // fsync + close; the file stays at temp_path()
  void publish();  // finish + rename onto final_path() + fsync of its directory

  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }

 private:
  void flush_and_close();
  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  bool done_ = false;
};

void rename_file(const std::string& from, const std::string& to);
// A second name for `from` at `to` (replaced atomically if it exists): a hard
// link where the filesystem has them, else a flushed copy.
void link_or_copy(const std::string& from, const std::string& to);
void remove_file(const std::string& path);  // a missing file is not an error
// Removes a file or a directory tree (a missing one is not an error). POSIX
// calls only: a link inside is removed, never followed; and no std::filesystem,
// whose remove_all torch's libraries export in a copy that crashed (issue 20).
void remove_tree(const std::string& path);
// Makes renames and removals inside `dir` durable.
void fsync_dir(const std::string& dir);
// Flushes every file and directory under `dir` (and `dir`): what a checkpoint
// step directory needs before it is renamed into place, whoever wrote its files.
void fsync_tree(const std::string& dir);
std::string parent_dir(const std::string& path);  // "." for a bare file name

// Crash-test hook: the save protocols call fault_point("step") between their
// steps; a test installs a hook that ends the process at a chosen step.
// Not thread-safe; for tests only.
void set_fault_hook(std::function<void(std::string_view step)> hook);
void fault_point(std::string_view step);

}  // namespace colossus::checkpoint::io
