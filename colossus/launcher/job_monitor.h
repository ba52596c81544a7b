// The launcher's decisions, kept apart from processes so they can be tested as
// plain logic: which event ends the job (a failing unit, a hang, a signal to
// the launcher), when to ask the survivors to stop, when to kill them, and the
// one line and exit code that report it. A "unit" is a rank, or a node when a
// hostfile launcher supervises per-node launchers.
#pragma once
#include "colossus/launcher/exit_status.h"

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace colossus::launcher {

struct MonitorOptions {
  std::string noun = "rank";                        // what a unit is called in messages
  std::chrono::milliseconds exit_timeout{300'000};  // after the first clean exit; 0 disables
  std::chrono::milliseconds stop_grace{5'000};      // between asking to stop and SIGKILL
};

// "rank 3" or "ranks 1, 3, 5" (at most 8 listed, then the count).
std::string describe_units(const std::string& noun, const std::vector<std::string>& ids);

// Exit code when stragglers were killed after --exit_timeout (as `timeout` does).
inline constexpr int kHangExitCode = 124;

class JobMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Action { None, Stop, Kill };

  // ids[i] names unit i in messages: "2" for rank 2, "1 (host-b)" for a node.
  JobMonitor(std::vector<std::string> ids, MonitorOptions options);

  void unit_exited(size_t unit, ExitStatus status, Clock::time_point now);
  // SIGINT/SIGTERM/SIGHUP reached the launcher; a second one skips the grace.
  void launcher_signalled(int signal_number, Clock::time_point now);
  // The launcher that started this one went away (our stdin closed): stop
  // without a message, since that launcher reports the cause.
  void parent_gone(Clock::time_point now);

  // What to do now; each of Stop and Kill is returned at most once.
  Action next_action(Clock::time_point now);
  // The signal Stop sends: the launcher's own signal when forwarding, else SIGTERM.
  int stop_signal() const;
  // When next_action() may next return something other than None.
  std::optional<Clock::time_point> next_deadline() const;

  size_t size() const { return statuses_.size(); }
  bool running(size_t unit) const { return !statuses_.at(unit).has_value(); }
  size_t running_count() const;
  bool all_exited() const { return running_count() == 0; }
  bool stopping() const { return reason_ != Reason::None; }

  // Valid once all_exited(): 0 when every unit exited 0.
  int exit_code() const;
  // One line for stderr ("colossus run: rank 2 exited with code 3; stopped the
  // other 3 ranks"); empty on success or when stopped by the parent.
  std::string final_message() const;

 private:
  enum class Reason { None, Failure, Hang, Signal, ParentGone };
  void begin_stop(Reason reason, Clock::time_point now);

  std::vector<std::string> ids_;
  MonitorOptions options_;
  std::vector<std::optional<ExitStatus>> statuses_;

  Reason reason_ = Reason::None;
  size_t failed_unit_ = 0;
  std::optional<size_t> first_success_;
  Clock::time_point first_success_at_{};
  std::vector<size_t> stragglers_;
  int signal_number_ = 0;
  size_t running_at_stop_ = 0;
  Clock::time_point stop_at_{};
  bool stop_sent_ = false;
  bool kill_now_ = false;
  bool kill_sent_ = false;
  size_t killed_count_ = 0;
};

}  // namespace colossus::launcher
