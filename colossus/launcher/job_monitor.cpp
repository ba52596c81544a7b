#include "colossus/launcher/job_monitor.h"

#include <fmt/format.h>

#include <csignal>

namespace colossus::launcher {

namespace {

std::string seconds_text(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000.0);
}

}  // namespace

std::string describe_units(const std::string& noun, const std::vector<std::string>& ids) {
  constexpr size_t kMaxListed = 8;
  std::string text = ids.size() == 1 ? noun : noun + "s";
  for (size_t i = 0; i < ids.size() && i < kMaxListed; ++i) text += (i == 0 ? " " : ", ") + ids[i];
  if (ids.size() > kMaxListed) text += fmt::format(", ... ({} in total)", ids.size());
  return text;
}

JobMonitor::JobMonitor(std::vector<std::string> ids, MonitorOptions options)
    : ids_(std::move(ids)), options_(std::move(options)), statuses_(ids_.size()) {}

size_t JobMonitor::running_count() const {
  size_t count = 0;
  for (const auto& status : statuses_) count += status.has_value() ? 0 : 1;
  return count;
}

void JobMonitor::begin_stop(Reason reason, Clock::time_point now) {
  reason_ = reason;
  running_at_stop_ = running_count();
  stop_at_ = now;
}

void JobMonitor::unit_exited(size_t unit, ExitStatus status, Clock::time_point now) {
  if (statuses_.at(unit).has_value()) return;
  statuses_[unit] = status;
  if (reason_ != Reason::None) return;  // exits caused by our own stop are expected
  if (!status.success()) {
    failed_unit_ = unit;
    begin_stop(Reason::Failure, now);
  } else if (!first_success_) {
    first_success_ = unit;
    first_success_at_ = now;
  }
}

void JobMonitor::launcher_signalled(int signal_number, Clock::time_point now) {
  if (reason_ != Reason::None) {
    kill_now_ = true;
    return;
  }
  signal_number_ = signal_number;
  begin_stop(Reason::Signal, now);
}

void JobMonitor::parent_gone(Clock::time_point now) {
  if (reason_ != Reason::None) return;
  begin_stop(Reason::ParentGone, now);
}

JobMonitor::Action JobMonitor::next_action(Clock::time_point now) {
  if (reason_ == Reason::None && first_success_ && options_.exit_timeout.count() > 0 && !all_exited() &&
      now >= first_success_at_ + options_.exit_timeout) {
    for (size_t unit = 0; unit < statuses_.size(); ++unit) {
      if (running(unit)) stragglers_.push_back(unit);
    }
    begin_stop(Reason::Hang, now);
  }
  if (reason_ == Reason::None || all_exited()) return Action::None;
  if (!stop_sent_) {
    stop_sent_ = true;
    return Action::Stop;
  }
  if (!kill_sent_ && (kill_now_ || now >= stop_at_ + options_.stop_grace)) {
    kill_sent_ = true;
    killed_count_ = running_count();
    return Action::Kill;
  }
  return Action::None;
}

int JobMonitor::stop_signal() const { return reason_ == Reason::Signal ? signal_number_ : SIGTERM; }

std::optional<JobMonitor::Clock::time_point> JobMonitor::next_deadline() const {
  if (reason_ == Reason::None) {
    if (first_success_ && options_.exit_timeout.count() > 0) return first_success_at_ + options_.exit_timeout;
    return std::nullopt;
  }
  if (!stop_sent_) return stop_at_;
  if (!kill_sent_) return kill_now_ ? stop_at_ : stop_at_ + options_.stop_grace;
  return std::nullopt;
}

int JobMonitor::exit_code() const {
  switch (reason_) {
    case Reason::None:
      return 0;
    case Reason::Failure:
      return statuses_[failed_unit_]->shell_code();
    case Reason::Hang:
      return kHangExitCode;
    case Reason::Signal:
      return 128 + signal_number_;
    case Reason::ParentGone:
      return 128 + SIGTERM;
  }
  return 1;
}

std::string JobMonitor::final_message() const {
  const std::string plural = options_.noun + "s";
  std::string killed;
  if (killed_count_ > 0) {
    std::string asked = reason_ == Reason::Signal ? signal_name(signal_number_) : "SIGTERM";
    killed = fmt::format(" ({} did not stop within {} of {} and {} killed)", killed_count_,
                         seconds_text(options_.stop_grace), asked, killed_count_ == 1 ? "was" : "were");
  }
  switch (reason_) {
    case Reason::None:
    case Reason::ParentGone:
      return "";
    case Reason::Failure: {
      std::string line =
          fmt::format("colossus run: {} {} {}", options_.noun, ids_[failed_unit_], statuses_[failed_unit_]->describe());
      if (running_at_stop_ == 1) line += fmt::format("; stopped the other {}", options_.noun);
      if (running_at_stop_ > 1) line += fmt::format("; stopped the other {} {}", running_at_stop_, plural);
      return line + killed;
    }
    case Reason::Hang: {
      std::vector<std::string> straggler_ids;
      for (size_t unit : stragglers_) straggler_ids.push_back(ids_[unit]);
      return fmt::format("colossus run: {} did not exit within {} after {} {} exited successfully; killed {}{}",
                         describe_units(options_.noun, straggler_ids), seconds_text(options_.exit_timeout),
                         options_.noun, ids_[*first_success_], stragglers_.size() == 1 ? "it" : "them", killed);
    }
    case Reason::Signal: {
      std::string line = fmt::format("colossus run: got {}", signal_name(signal_number_));
      if (running_at_stop_ > 0) {
        line += fmt::format("; stopped {} {}", running_at_stop_, running_at_stop_ == 1 ? options_.noun : plural);
      }
      return line + killed;
    }
  }
  return "";
}

}  // namespace colossus::launcher
