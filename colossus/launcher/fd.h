// A file descriptor that closes itself, plus the few blocking I/O helpers the
// launcher needs (whole writes that survive EINTR and short writes, pipes).
#pragma once
#include <string>
#include <string_view>
#include <utility>

namespace colossus::launcher {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

struct Pipe {
  Fd read;
  Fd write;
};
// Both ends close-on-exec; throws LaunchError when the system is out of fds.
Pipe make_pipe();

// Writes all of `data`; false when the reader is gone (EPIPE) or another error
// ends the stream, which callers treat as "nobody is listening any more".
bool write_all(int fd, std::string_view data);

// One read of up to `max_bytes` (retrying EINTR). An empty result means end of
// stream or error, unless *would_block says a non-blocking fd had nothing yet.
std::string read_some(int fd, size_t max_bytes, bool* would_block = nullptr);

}  // namespace colossus::launcher
