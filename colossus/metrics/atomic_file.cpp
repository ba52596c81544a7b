#include "colossus/metrics/atomic_file.h"

#include "colossus/core/errors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace colossus::metrics {

namespace fs = std::filesystem;

void write_file_atomically(const fs::path& path, std::string_view content) {
  if (path.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) throw ConfigError(fmt::format("cannot create folder '{}': {}", path.parent_path().string(), ec.message()));
  }
  // The pid keeps two processes writing the same file from sharing a temp file.
  fs::path tmp = path;
  tmp += fmt::format(".tmp.{}", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw ConfigError(fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(errno)));
  const char* data = content.data();
  size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw ConfigError(fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(err)));
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  // fsync before rename: otherwise a crash can leave the new name pointing at an empty file.
  int sync_rc = ::fsync(fd);
  int sync_errno = errno;
  int close_rc = ::close(fd);
  if (sync_rc != 0 || close_rc != 0) {
    int err = sync_rc != 0 ? sync_errno : errno;
    ::unlink(tmp.c_str());
    throw ConfigError(fmt::format("cannot write '{}': {}", tmp.string(), std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw ConfigError(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), path.string(), std::strerror(err)));
  }
}

}  // namespace colossus::metrics
