#include "colossus/launcher/signals.h"

#include "colossus/core/errors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <string>

namespace colossus::launcher {

namespace {

int read_end = -1;
int write_end = -1;
std::map<int, struct sigaction> previous;
struct sigaction previous_sigpipe {};

void on_signal(int signal_number) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(signal_number);
  if (::write(write_end, &byte, 1) < 0) {
    // The pipe is full: the loop already has wake-ups queued.
  }
  errno = saved_errno;
}

}  // namespace

SignalPipe::SignalPipe(std::vector<int> signals) : signals_(std::move(signals)) {
  if (read_end >= 0) throw LaunchError("internal: only one SignalPipe may exist at a time");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw LaunchError(std::string("cannot create the signal pipe: ") + std::strerror(errno));
  }
  read_end = fds[0];
  write_end = fds[1];
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int signal_number : signals_) ::sigaction(signal_number, &action, &previous[signal_number]);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &previous_sigpipe);
}

SignalPipe::~SignalPipe() {
  for (int signal_number : signals_) ::sigaction(signal_number, &previous[signal_number], nullptr);
  ::sigaction(SIGPIPE, &previous_sigpipe, nullptr);
  previous.clear();
  ::close(read_end);
  ::close(write_end);
  read_end = write_end = -1;
}

int SignalPipe::fd() const { return read_end; }

std::vector<int> SignalPipe::drain() {
  std::vector<int> received;
  unsigned char buffer[64];
  while (true) {
    ssize_t got = ::read(read_end, buffer, sizeof(buffer));
    if (got > 0) {
      received.insert(received.end(), buffer, buffer + got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    return received;
  }
}

void reset_signals_for_exec() {
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  for (int signal_number = 1; signal_number < NSIG; ++signal_number) {
    if (signal_number == SIGKILL || signal_number == SIGSTOP) continue;
    ::sigaction(signal_number, &action, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace colossus::launcher
