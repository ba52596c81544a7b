#include "colossus/launcher/fd.h"

#include "colossus/core/errors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace colossus::launcher {

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw LaunchError(std::string("cannot create a pipe for rank output: ") + std::strerror(errno));
  }
  return Pipe{Fd(fds[0]), Fd(fds[1])};
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t written = ::write(fd, data.data(), data.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(written));
  }
  return true;
}

std::string read_some(int fd, size_t max_bytes, bool* would_block) {
  std::string buffer(max_bytes, '\0');
  if (would_block) *would_block = false;
  while (true) {
    ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got >= 0) {
      buffer.resize(static_cast<size_t>(got));
      return buffer;
    }
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && would_block) *would_block = true;
    return {};
  }
}

}  // namespace colossus::launcher
