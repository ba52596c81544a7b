#include "colossus/launcher/process_supervisor.h"

#include "colossus/launcher/line_prefixer.h"
#include "colossus/launcher/signals.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

namespace colossus::launcher {

namespace {

using Clock = JobMonitor::Clock;

// Read size per wake-up: large enough that a chatty rank drains in few reads.
constexpr size_t kReadBytes = 64 * 1024;
// After every unit exited, how long to wait for their pipes to reach EOF.
constexpr std::chrono::milliseconds kDrainTimeout{2000};

struct Slot {
  Child child;
  bool exited = false;
  std::unique_ptr<LinePrefixer> out;
  std::unique_ptr<LinePrefixer> err;
};

int poll_timeout_ms(std::optional<Clock::time_point> deadline, Clock::time_point now) {
  // Woken by the signal pipe for exits; the cap only bounds how late a missed
  // wake-up could be noticed.
  constexpr int kMaxWaitMs = 1000;
  if (!deadline) return kMaxWaitMs;
  auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - now).count();
  return static_cast<int>(std::clamp<long long>(wait + 1, 0, kMaxWaitMs));
}

void pump(Fd& fd, LinePrefixer& prefixer) {
  std::string bytes = read_some(fd.get(), kReadBytes);
  if (bytes.empty()) {
    prefixer.finish();
    fd.reset();
  } else {
    prefixer.feed(bytes);
  }
}

}  // namespace

int supervise_local_units(std::vector<LocalUnit> units, const SupervisorOptions& options) {
  SignalPipe signals({SIGINT, SIGTERM, SIGHUP, SIGCHLD});
  std::vector<std::string> ids;
  for (const auto& unit : units) ids.push_back(unit.id);
  JobMonitor monitor(ids, options.monitor);

  std::vector<Slot> slots(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    try {
      slots[i].child = spawn_child(units[i].spawn);
    } catch (...) {
      for (size_t started = 0; started < i; ++started) {
        signal_group(slots[started].child.pid, SIGKILL);
        while (!try_reap(slots[started].child.pid)) ::usleep(1000);
      }
      throw;
    }
    slots[i].out = std::make_unique<LinePrefixer>(units[i].output_prefix, fd_sink(STDOUT_FILENO));
    slots[i].err = std::make_unique<LinePrefixer>(units[i].output_prefix, fd_sink(STDERR_FILENO));
  }

  bool watching_stdin = options.watch_stdin;
  std::optional<Clock::time_point> drain_deadline;
  while (true) {
    auto now = Clock::now();
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].exited) continue;
      if (auto status = try_reap(slots[i].child.pid)) {
        slots[i].exited = true;
        // Whatever the unit left running in its group goes with it.
        signal_group(slots[i].child.pid, SIGKILL);
        slots[i].child.stdin_fd.reset();
        monitor.unit_exited(i, *status, now);
      }
    }
    switch (monitor.next_action(now)) {
      case JobMonitor::Action::Stop:
        for (size_t i = 0; i < slots.size(); ++i) {
          if (slots[i].exited) continue;
          if (units[i].stop_by_closing_stdin) {
            slots[i].child.stdin_fd.reset();
          } else {
            signal_group(slots[i].child.pid, monitor.stop_signal());
          }
        }
        break;
      case JobMonitor::Action::Kill:
        for (auto& slot : slots) {
          if (!slot.exited) signal_group(slot.child.pid, SIGKILL);
        }
        break;
      case JobMonitor::Action::None:
        break;
    }

    bool outputs_open = std::any_of(slots.begin(), slots.end(), [](const Slot& slot) {
      return slot.child.stdout_fd.valid() || slot.child.stderr_fd.valid();
    });
    if (monitor.all_exited()) {
      if (!outputs_open) break;
      if (!drain_deadline) drain_deadline = now + kDrainTimeout;
      if (now >= *drain_deadline) {
        for (auto& slot : slots) {
          slot.out->finish();
          slot.err->finish();
        }
        break;
      }
    }

    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, int>> owners;  // (slot, 1 = stdout / 2 = stderr) per fds entry after the fixed ones
    fds.push_back({signals.fd(), POLLIN, 0});
    if (watching_stdin) fds.push_back({STDIN_FILENO, POLLIN, 0});
    size_t fixed = fds.size();
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i].child.stdout_fd.valid()) {
        fds.push_back({slots[i].child.stdout_fd.get(), POLLIN, 0});
        owners.emplace_back(i, 1);
      }
      if (slots[i].child.stderr_fd.valid()) {
        fds.push_back({slots[i].child.stderr_fd.get(), POLLIN, 0});
        owners.emplace_back(i, 2);
      }
    }
    auto deadline = monitor.next_deadline();
    if (drain_deadline && (!deadline || *drain_deadline < *deadline)) deadline = drain_deadline;
    int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms(deadline, now));
    if (ready <= 0) continue;

    now = Clock::now();
    if (fds[0].revents != 0) {
      for (int signal_number : signals.drain()) {
        if (signal_number != SIGCHLD) monitor.launcher_signalled(signal_number, now);
      }
    }
    if (watching_stdin && fds[1].revents != 0) {
      if (read_some(STDIN_FILENO, kReadBytes).empty()) {
        watching_stdin = false;
        monitor.parent_gone(now);
      }
    }
    for (size_t k = fixed; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      auto [slot_index, stream] = owners[k - fixed];
      Slot& slot = slots[slot_index];
      if (stream == 1) {
        pump(slot.child.stdout_fd, *slot.out);
      } else {
        pump(slot.child.stderr_fd, *slot.err);
      }
    }
  }

  std::string message = monitor.final_message();
  if (!message.empty()) write_all(STDERR_FILENO, message + "\n");
  return monitor.exit_code();
}

}  // namespace colossus::launcher
