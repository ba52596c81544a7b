#include "colossus/launcher/mpi_job.h"

#include "colossus/launcher/line_prefixer.h"
#include "colossus/launcher/net.h"
#include "colossus/launcher/rank_channel.h"
#include "colossus/launcher/signals.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <list>
#include <map>
#include <memory>

namespace colossus::launcher {

namespace {

using Clock = JobMonitor::Clock;
constexpr size_t kReadBytes = 64 * 1024;
// Once mpirun has exited, how long to wait for the last frames of its ranks.
constexpr std::chrono::milliseconds kDrainTimeout{2000};

struct Connection {
  Fd fd;
  FrameReader reader;
  int rank = -1;  // -1 until its hello
  bool reported = false;
};

struct RankOutput {
  LinePrefixer out;
  LinePrefixer err;
};

int poll_timeout_ms(std::optional<Clock::time_point> deadline, Clock::time_point now) {
  constexpr int kMaxWaitMs = 1000;
  if (!deadline) return kMaxWaitMs;
  auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - now).count();
  return static_cast<int>(std::clamp<long long>(wait + 1, 0, kMaxWaitMs));
}

class MpiSupervisor {
 public:
  explicit MpiSupervisor(MpiJob job)
      : job_(std::move(job)),
        monitor_(rank_ids(job_.world_size), job_.monitor),
        mpirun_out_("", fd_sink(STDOUT_FILENO)),
        mpirun_err_("", fd_sink(STDERR_FILENO)) {
    for (int rank = 0; rank < job_.world_size; ++rank) {
      std::string prefix = fmt::format("[r{}] ", rank);
      outputs_.push_back(std::make_unique<RankOutput>(
          RankOutput{LinePrefixer(prefix, fd_sink(STDOUT_FILENO)), LinePrefixer(prefix, fd_sink(STDERR_FILENO))}));
    }
  }

  int run() {
    SignalPipe signals({SIGINT, SIGTERM, SIGHUP, SIGCHLD});
    mpirun_ = spawn_child(job_.mpirun);
    bool watching_stdin = job_.watch_stdin;
    while (true) {
      auto now = Clock::now();
      check_mpirun(now);
      act(monitor_.next_action(now));
      bool mpirun_output_open = mpirun_.stdout_fd.valid() || mpirun_.stderr_fd.valid();
      if (mpirun_status_ && !mpirun_output_open && (connections_.empty() || now >= mpirun_exited_at_ + kDrainTimeout)) {
        connections_.clear();
        break;
      }

      std::vector<pollfd> fds{{signals.fd(), POLLIN, 0}, {job_.listener.get(), POLLIN, 0}};
      if (watching_stdin) fds.push_back({STDIN_FILENO, POLLIN, 0});
      size_t fixed = fds.size();
      if (mpirun_.stdout_fd.valid()) fds.push_back({mpirun_.stdout_fd.get(), POLLIN, 0});
      if (mpirun_.stderr_fd.valid()) fds.push_back({mpirun_.stderr_fd.get(), POLLIN, 0});
      size_t first_connection = fds.size();
      for (auto& connection : connections_) fds.push_back({connection.fd.get(), POLLIN, 0});
      auto deadline = monitor_.next_deadline();
      if (mpirun_status_)
        deadline = std::min(deadline.value_or(Clock::time_point::max()), mpirun_exited_at_ + kDrainTimeout);
      if (::poll(fds.data(), fds.size(), poll_timeout_ms(deadline, now)) <= 0) continue;

      now = Clock::now();
      if (fds[0].revents != 0) {
        for (int signal_number : signals.drain()) {
          if (signal_number != SIGCHLD) monitor_.launcher_signalled(signal_number, now);
        }
      }
      if (fds[1].revents != 0) {
        Fd accepted = accept_connection();
        if (accepted.valid()) connections_.push_back(Connection{std::move(accepted), {}, -1, false});
      }
      if (watching_stdin && fds[2].revents != 0 && read_some(STDIN_FILENO, kReadBytes).empty()) {
        watching_stdin = false;
        monitor_.parent_gone(now);
      }
      for (size_t k = fixed; k < first_connection; ++k) {
        if (fds[k].revents == 0) continue;
        bool is_stdout = mpirun_.stdout_fd.valid() && fds[k].fd == mpirun_.stdout_fd.get();
        pump_mpirun(is_stdout ? mpirun_.stdout_fd : mpirun_.stderr_fd, is_stdout ? mpirun_out_ : mpirun_err_);
      }
      auto connection = connections_.begin();
      for (size_t k = first_connection; k < fds.size(); ++k) {
        auto current = connection++;
        if (fds[k].revents != 0 && !read_connection(*current, now)) connections_.erase(current);
      }
    }

    // Ranks that never reported: mpirun failed to start them or lost them.
    std::vector<std::string> unreported;
    bool was_stopping = monitor_.stopping();
    for (int rank = 0; rank < job_.world_size; ++rank) {
      if (monitor_.running(static_cast<size_t>(rank))) unreported.push_back(std::to_string(rank));
      rank_ended(rank, ExitStatus::lost(), Clock::now());
    }
    std::string message = monitor_.final_message();
    int code = monitor_.exit_code();
    if (!was_stopping && !unreported.empty()) {
      message = fmt::format("colossus run: mpirun {} before {} reported an exit status (see mpirun's output above)",
                            mpirun_status_->describe(), describe_units("rank", unreported));
      code = mpirun_status_->success() ? 1 : mpirun_status_->shell_code();
    } else if (code == 0 && !mpirun_status_->success()) {
      message = fmt::format("colossus run: every rank exited 0 but mpirun {}", mpirun_status_->describe());
      code = mpirun_status_->shell_code();
    }
    if (!message.empty()) write_all(STDERR_FILENO, message + "\n");
    return code;
  }

 private:
  static std::vector<std::string> rank_ids(int world_size) {
    std::vector<std::string> ids;
    for (int rank = 0; rank < world_size; ++rank) ids.push_back(std::to_string(rank));
    return ids;
  }

  Fd accept_connection() { return accept_tcp(job_.listener.get()); }

  void check_mpirun(Clock::time_point now) {
    if (mpirun_status_) return;
    if (auto status = try_reap(mpirun_.pid)) {
      mpirun_status_ = status;
      mpirun_exited_at_ = now;
      signal_group(mpirun_.pid, SIGKILL);
    }
  }

  void act(JobMonitor::Action action) {
    if (action == JobMonitor::Action::Stop) {
      stop_requested_ = true;
      for (auto& connection : connections_) send_stop(connection);
    } else if (action == JobMonitor::Action::Kill) {
      // Closing a wrapper's connection makes it kill its program at once.
      connections_.clear();
      signal_group(mpirun_.pid, SIGKILL);
    }
  }

  void send_stop(Connection& connection) {
    if (connection.rank >= 0 && !connection.reported) {
      send_frame(connection.fd.get(), FrameType::Stop, std::to_string(monitor_.stop_signal()));
    }
  }

  void rank_ended(int rank, ExitStatus status, Clock::time_point now) {
    if (!monitor_.running(static_cast<size_t>(rank))) return;
    outputs_[rank]->out.finish();
    outputs_[rank]->err.finish();
    monitor_.unit_exited(static_cast<size_t>(rank), status, now);
  }

  void pump_mpirun(Fd& fd, LinePrefixer& prefixer) {
    std::string bytes = read_some(fd.get(), kReadBytes);
    if (bytes.empty()) {
      prefixer.finish();
      fd.reset();
    } else {
      prefixer.feed(bytes);
    }
  }

  // False when the connection is finished and should be dropped.
  bool read_connection(Connection& connection, Clock::time_point now) {
    std::string bytes = read_some(connection.fd.get(), kReadBytes);
    if (bytes.empty()) {
      if (connection.rank >= 0) rank_ended(connection.rank, ExitStatus::lost(), now);
      return false;
    }
    connection.reader.feed(bytes);
    try {
      while (auto frame = connection.reader.next()) {
        if (!handle_frame(connection, *frame, now)) return false;
      }
    } catch (const std::exception&) {
      if (connection.rank >= 0) rank_ended(connection.rank, ExitStatus::lost(), now);
      return false;
    }
    return true;
  }

  bool handle_frame(Connection& connection, const Frame& frame, Clock::time_point now) {
    if (connection.rank < 0) {
      // Only a wrapper with our token, naming a rank not yet seen, is accepted.
      if (frame.type != FrameType::Hello) return false;
      auto space = frame.payload.find(' ');
      if (space == std::string::npos || frame.payload.substr(0, space) != job_.token) return false;
      int rank = -1;
      try {
        rank = std::stoi(frame.payload.substr(space + 1));
      } catch (const std::exception&) {
        return false;
      }
      if (rank < 0 || rank >= job_.world_size || seen_[rank]) return false;
      seen_[rank] = true;
      connection.rank = rank;
      if (stop_requested_) send_stop(connection);
      return true;
    }
    switch (frame.type) {
      case FrameType::Stdout:
        outputs_[connection.rank]->out.feed(frame.payload);
        return true;
      case FrameType::Stderr:
        outputs_[connection.rank]->err.feed(frame.payload);
        return true;
      case FrameType::Status:
        connection.reported = true;
        rank_ended(connection.rank, ExitStatus::decode(frame.payload), now);
        return true;
      default:
        return true;
    }
  }

  MpiJob job_;
  JobMonitor monitor_;
  Child mpirun_;
  std::optional<ExitStatus> mpirun_status_;
  Clock::time_point mpirun_exited_at_{};
  LinePrefixer mpirun_out_;
  LinePrefixer mpirun_err_;
  std::vector<std::unique_ptr<RankOutput>> outputs_;
  std::list<Connection> connections_;
  std::map<int, bool> seen_;
  bool stop_requested_ = false;
};

}  // namespace

int supervise_mpi_job(MpiJob job) { return MpiSupervisor(std::move(job)).run(); }

}  // namespace colossus::launcher
