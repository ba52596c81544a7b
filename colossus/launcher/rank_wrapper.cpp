#include "colossus/launcher/rank_wrapper.h"

#include "colossus/core/errors.h"
#include "colossus/launcher/child_process.h"
#include "colossus/launcher/job_monitor.h"
#include "colossus/launcher/net.h"
#include "colossus/launcher/rank_channel.h"
#include "colossus/launcher/signals.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace colossus::launcher {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kReadBytes = 64 * 1024;
constexpr std::chrono::milliseconds kDrainTimeout{2000};

int required_int(const EnvLookup& env, const char* name) {
  auto value = env(name);
  if (!value) {
    throw ConfigError(
        fmt::format("{} is not set: `colossus _rank` only runs under the mpirun that "
                    "`colossus run --backend mpi` starts",
                    name));
  }
  try {
    size_t used = 0;
    int parsed = std::stoi(*value, &used);
    if (used == value->size()) return parsed;
  } catch (const std::exception&) {
  }
  throw ConfigError(fmt::format("{}='{}' is not an integer", name, *value));
}

// The wrapper's side of one rank: the program, the channel, and the stop logic.
class RankWrapper {
 public:
  RankWrapper(Fd channel, SpawnSpec program) : channel_(std::move(channel)), spec_(std::move(program)) {}

  int run() {
    SignalPipe signals({SIGINT, SIGTERM, SIGHUP, SIGCHLD});
    // mpirun is our parent: if it dies, stop the program like a SIGTERM would.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    child_ = spawn_child(spec_);
    if (::getppid() == 1) request_stop(SIGTERM);
    std::optional<Clock::time_point> drain_deadline;
    while (true) {
      auto now = Clock::now();
      if (!status_) {
        if (auto status = try_reap(child_.pid)) {
          status_ = status;
          signal_group(child_.pid, SIGKILL);
          drain_deadline = now + kDrainTimeout;
        }
      }
      if (status_ && ((!child_.stdout_fd.valid() && !child_.stderr_fd.valid()) || now >= *drain_deadline)) break;
      if (stopping_ && !killed_ && now >= kill_at_) kill_now();

      std::vector<pollfd> fds{{signals.fd(), POLLIN, 0}};
      if (channel_.valid()) fds.push_back({channel_.get(), POLLIN, 0});
      if (child_.stdout_fd.valid()) fds.push_back({child_.stdout_fd.get(), POLLIN, 0});
      if (child_.stderr_fd.valid()) fds.push_back({child_.stderr_fd.get(), POLLIN, 0});
      int timeout_ms = 1000;
      if (stopping_ && !killed_) {
        auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - now).count() + 1;
        timeout_ms = static_cast<int>(std::clamp<long long>(wait, 0, timeout_ms));
      }
      if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) continue;
      for (const auto& entry : fds) {
        if (entry.revents == 0) continue;
        if (entry.fd == signals.fd()) {
          for (int signal_number : signals.drain()) {
            if (signal_number != SIGCHLD) request_stop(signal_number);
          }
        } else if (channel_.valid() && entry.fd == channel_.get()) {
          read_channel();
        } else if (child_.stdout_fd.valid() && entry.fd == child_.stdout_fd.get()) {
          forward(child_.stdout_fd, FrameType::Stdout);
        } else if (child_.stderr_fd.valid() && entry.fd == child_.stderr_fd.get()) {
          forward(child_.stderr_fd, FrameType::Stderr);
        }
      }
    }
    if (channel_.valid() && send_frame(channel_.get(), FrameType::Status, status_->encode())) return 0;
    return status_->shell_code();
  }

 private:
  void request_stop(int signal_number) {
    if (stopping_) {
      kill_now();
      return;
    }
    stopping_ = true;
    kill_at_ = Clock::now() + MonitorOptions{}.stop_grace;
    signal_group(child_.pid, signal_number);
  }

  void kill_now() {
    killed_ = true;
    signal_group(child_.pid, SIGKILL);
  }

  void read_channel() {
    std::string bytes = read_some(channel_.get(), kReadBytes);
    if (bytes.empty()) {
      // The launcher is gone (or gave up on us): nobody will hear the output.
      channel_.reset();
      request_stop(SIGTERM);
      return;
    }
    reader_.feed(bytes);
    try {
      while (auto frame = reader_.next()) {
        if (frame->type == FrameType::Stop) request_stop(std::stoi(frame->payload));
      }
    } catch (const std::exception&) {
      channel_.reset();
      request_stop(SIGTERM);
    }
  }

  void forward(Fd& fd, FrameType type) {
    std::string bytes = read_some(fd.get(), kReadBytes);
    if (bytes.empty()) {
      fd.reset();
      return;
    }
    if (channel_.valid() && !send_frame(channel_.get(), type, bytes)) {
      channel_.reset();
      request_stop(SIGTERM);
    }
  }

  Fd channel_;
  SpawnSpec spec_;
  Child child_;
  FrameReader reader_;
  std::optional<ExitStatus> status_;
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_{};
};

}  // namespace

MpiRankPlace read_mpi_rank_place(const EnvLookup& env) {
  MpiRankPlace place;
  place.rank = required_int(env, "OMPI_COMM_WORLD_RANK");
  place.world_size = required_int(env, "OMPI_COMM_WORLD_SIZE");
  place.local_rank = required_int(env, "OMPI_COMM_WORLD_LOCAL_RANK");
  place.local_world_size = required_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE");
  return place;
}

Environment wrapped_program_environment(const Environment& base, const MpiRankPlace& place) {
  Environment env = base;
  env.set("RANK", std::to_string(place.rank));
  env.set("LOCAL_RANK", std::to_string(place.local_rank));
  env.set("WORLD_SIZE", std::to_string(place.world_size));
  env.set("LOCAL_WORLD_SIZE", std::to_string(place.local_world_size));
  // colossus run gives every node the same number of ranks, so the node index
  // follows from the rank.
  env.set("GROUP_RANK", std::to_string(place.rank / place.local_world_size));
  env.set("GROUP_WORLD_SIZE", std::to_string(place.world_size / place.local_world_size));
  env.set("COLOSSUS_LAUNCHER", "1");
  env.unset(kChannelAddressVar);
  env.unset(kChannelTokenVar);
  return env;
}

int run_rank_wrapper(const std::vector<std::string>& command) {
  if (command.empty()) throw ConfigError("no program given; usage: colossus _rank -- PROGRAM [ARGS...]");
  EnvLookup env = process_env();
  MpiRankPlace place = read_mpi_rank_place(env);
  auto address = env(kChannelAddressVar);
  auto token = env(kChannelTokenVar);
  if (!address || !token) {
    throw ConfigError(
        fmt::format("{} is not set: `colossus _rank` only runs under the mpirun that "
                    "`colossus run --backend mpi` starts",
                    address ? kChannelTokenVar : kChannelAddressVar));
  }
  auto colon = address->rfind(':');
  if (colon == std::string::npos) {
    throw ConfigError(fmt::format("{}='{}' is not host:port", kChannelAddressVar, *address));
  }
  int port = 0;
  try {
    port = std::stoi(address->substr(colon + 1));
  } catch (const std::exception&) {
    throw ConfigError(fmt::format("{}='{}' is not host:port", kChannelAddressVar, *address));
  }
  Fd channel;
  try {
    channel = connect_tcp(address->substr(0, colon), port);
  } catch (const LaunchError& e) {
    throw LaunchError(
        fmt::format("rank {} cannot reach the launcher: {}; set COLOSSUS_LAUNCHER_ADDR to an address "
                    "of the launching host that every node can reach",
                    place.rank, e.what()));
  }
  if (!send_frame(channel.get(), FrameType::Hello, fmt::format("{} {}", *token, place.rank))) {
    throw LaunchError(fmt::format("rank {} lost the connection to the launcher at {}", place.rank, *address));
  }

  SpawnSpec spec;
  try {
    spec.path = resolve_program(command[0]);
  } catch (const ConfigError& e) {
    // Said through the channel, so the launcher reports it like any failure.
    send_frame(channel.get(), FrameType::Stderr, fmt::format("colossus _rank: {}\n", e.what()));
    send_frame(channel.get(), FrameType::Status, ExitStatus::code(127).encode());
    return 0;
  }
  spec.argv = command;
  spec.env = wrapped_program_environment(Environment::current(), place).entries();
  return RankWrapper(std::move(channel), std::move(spec)).run();
}

}  // namespace colossus::launcher
