#include "colossus/launcher/job_monitor.h"

#include <gtest/gtest.h>

#include <csignal>

namespace colossus::launcher {
namespace {

using Clock = JobMonitor::Clock;
using Action = JobMonitor::Action;
using std::chrono::milliseconds;

MonitorOptions options(int exit_timeout_ms = 2000, int grace_ms = 5000) {
  return MonitorOptions{
      .noun = "rank", .exit_timeout = milliseconds(exit_timeout_ms), .stop_grace = milliseconds(grace_ms)};
}

TEST(JobMonitor, AllCleanExitsSucceedSilently) {
  JobMonitor monitor({"0", "1"}, options());
  auto t0 = Clock::now();
  monitor.unit_exited(1, ExitStatus::code(0), t0);
  EXPECT_EQ(monitor.next_action(t0), Action::None);
  monitor.unit_exited(0, ExitStatus::code(0), t0 + milliseconds(100));
  EXPECT_TRUE(monitor.all_exited());
  EXPECT_EQ(monitor.next_action(t0 + milliseconds(5000)), Action::None);
  EXPECT_EQ(monitor.exit_code(), 0);
  EXPECT_EQ(monitor.final_message(), "");
}

TEST(JobMonitor, FailureStopsThenKillsAfterGrace) {
  JobMonitor monitor({"0", "1", "2", "3"}, options());
  auto t0 = Clock::now();
  monitor.unit_exited(2, ExitStatus::code(3), t0);
  EXPECT_TRUE(monitor.stopping());
  EXPECT_EQ(monitor.next_action(t0), Action::Stop);
  EXPECT_EQ(monitor.stop_signal(), SIGTERM);
  EXPECT_EQ(monitor.next_action(t0 + milliseconds(4999)), Action::None);
  EXPECT_EQ(*monitor.next_deadline(), t0 + milliseconds(5000));
  // Exits caused by our SIGTERM are not new failures.
  monitor.unit_exited(0, ExitStatus::signal(SIGTERM), t0 + milliseconds(10));
  monitor.unit_exited(1, ExitStatus::signal(SIGTERM), t0 + milliseconds(10));
  EXPECT_EQ(monitor.next_action(t0 + milliseconds(5000)), Action::Kill);
  EXPECT_EQ(monitor.next_action(t0 + milliseconds(6000)), Action::None);
  monitor.unit_exited(3, ExitStatus::signal(SIGKILL), t0 + milliseconds(5001));
  EXPECT_EQ(monitor.exit_code(), 3);
  EXPECT_EQ(monitor.final_message(),
            "colossus run: rank 2 exited with code 3; stopped the other 3 ranks "
            "(1 did not stop within 5 s of SIGTERM and was killed)");
}

TEST(JobMonitor, SignalDeathGives128PlusSignal) {
  JobMonitor monitor({"0", "1"}, options());
  auto t0 = Clock::now();
  monitor.unit_exited(1, ExitStatus::signal(SIGSEGV), t0);
  EXPECT_EQ(monitor.next_action(t0), Action::Stop);
  monitor.unit_exited(0, ExitStatus::signal(SIGTERM), t0);
  EXPECT_EQ(monitor.next_action(t0), Action::None);
  EXPECT_EQ(monitor.exit_code(), 139);
  EXPECT_EQ(monitor.final_message(), "colossus run: rank 1 was killed by signal 11 (SIGSEGV); stopped the other rank");
}

TEST(JobMonitor, FailureOfTheLastRunningUnitStopsNothing) {
  JobMonitor monitor({"0", "1"}, options());
  auto t0 = Clock::now();
  monitor.unit_exited(0, ExitStatus::code(0), t0);
  monitor.unit_exited(1, ExitStatus::code(7), t0);
  EXPECT_EQ(monitor.next_action(t0), Action::None);
  EXPECT_EQ(monitor.exit_code(), 7);
  EXPECT_EQ(monitor.final_message(), "colossus run: rank 1 exited with code 7");
}

TEST(JobMonitor, StragglersAreStoppedAfterTheExitTimeout) {
  JobMonitor monitor({"0", "1", "2", "3"}, options(2000));
  auto t0 = Clock::now();
  monitor.unit_exited(0, ExitStatus::code(0), t0);
  monitor.unit_exited(2, ExitStatus::code(0), t0 + milliseconds(500));
  EXPECT_EQ(*monitor.next_deadline(), t0 + milliseconds(2000));
  EXPECT_EQ(monitor.next_action(t0 + milliseconds(1999)), Action::None);
  EXPECT_EQ(monitor.next_action(t0 + milliseconds(2000)), Action::Stop);
  monitor.unit_exited(1, ExitStatus::signal(SIGTERM), t0 + milliseconds(2001));
  monitor.unit_exited(3, ExitStatus::signal(SIGTERM), t0 + milliseconds(2001));
  EXPECT_EQ(monitor.exit_code(), kHangExitCode);
  EXPECT_EQ(monitor.final_message(),
            "colossus run: ranks 1, 3 did not exit within 2 s after rank 0 exited successfully; killed them");
}

TEST(JobMonitor, ZeroExitTimeoutNeverDeclaresAHang) {
  JobMonitor monitor({"0", "1"}, options(0));
  auto t0 = Clock::now();
  monitor.unit_exited(0, ExitStatus::code(0), t0);
  EXPECT_FALSE(monitor.next_deadline().has_value());
  EXPECT_EQ(monitor.next_action(t0 + std::chrono::hours(10)), Action::None);
}

TEST(JobMonitor, LauncherSignalIsForwardedAndASecondOneKills) {
  JobMonitor monitor({"0", "1", "2"}, options());
  auto t0 = Clock::now();
  monitor.launcher_signalled(SIGINT, t0);
  EXPECT_EQ(monitor.next_action(t0), Action::Stop);
  EXPECT_EQ(monitor.stop_signal(), SIGINT);
  monitor.unit_exited(0, ExitStatus::signal(SIGINT), t0);
  monitor.launcher_signalled(SIGINT, t0 + milliseconds(100));
  EXPECT_EQ(monitor.next_action(t0 + milliseconds(100)), Action::Kill);
  monitor.unit_exited(1, ExitStatus::signal(SIGKILL), t0 + milliseconds(101));
  monitor.unit_exited(2, ExitStatus::signal(SIGKILL), t0 + milliseconds(101));
  EXPECT_EQ(monitor.exit_code(), 130);
  EXPECT_EQ(monitor.final_message(),
            "colossus run: got SIGINT; stopped 3 ranks (2 did not stop within 5 s of SIGINT and were killed)");
}

TEST(JobMonitor, SigtermGives143) {
  JobMonitor monitor({"0"}, options());
  auto t0 = Clock::now();
  monitor.launcher_signalled(SIGTERM, t0);
  EXPECT_EQ(monitor.next_action(t0), Action::Stop);
  monitor.unit_exited(0, ExitStatus::signal(SIGTERM), t0);
  EXPECT_EQ(monitor.exit_code(), 143);
  EXPECT_EQ(monitor.final_message(), "colossus run: got SIGTERM; stopped 1 rank");
}

TEST(JobMonitor, ParentGoneStopsQuietly) {
  JobMonitor monitor({"0", "1"}, options());
  auto t0 = Clock::now();
  monitor.parent_gone(t0);
  EXPECT_EQ(monitor.next_action(t0), Action::Stop);
  monitor.unit_exited(0, ExitStatus::signal(SIGTERM), t0);
  monitor.unit_exited(1, ExitStatus::signal(SIGTERM), t0);
  EXPECT_EQ(monitor.exit_code(), 143);
  EXPECT_EQ(monitor.final_message(), "");
}

TEST(JobMonitor, NodesAreNamedWithTheirHosts) {
  JobMonitor monitor({"0 (a)", "1 (b)"}, MonitorOptions{.noun = "node"});
  auto t0 = Clock::now();
  monitor.unit_exited(1, ExitStatus::code(255), t0);
  monitor.unit_exited(0, ExitStatus::code(143), t0);
  EXPECT_EQ(monitor.final_message(), "colossus run: node 1 (b) exited with code 255; stopped the other node");
}

TEST(JobMonitor, LongListsAreShortened) {
  std::vector<std::string> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(std::to_string(i));
  EXPECT_EQ(describe_units("rank", ids), "ranks 0, 1, 2, 3, 4, 5, 6, 7, ... (12 in total)");
  EXPECT_EQ(describe_units("rank", {"3"}), "rank 3");
}

TEST(ExitStatus, DescribesAndRoundTrips) {
  EXPECT_EQ(ExitStatus::code(3).describe(), "exited with code 3");
  EXPECT_EQ(ExitStatus::signal(SIGKILL).describe(), "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(ExitStatus::signal(SIGKILL).shell_code(), 137);
  EXPECT_EQ(ExitStatus::lost().shell_code(), 1);
  for (auto status : {ExitStatus::code(0), ExitStatus::code(42), ExitStatus::signal(SIGSEGV), ExitStatus::lost()}) {
    auto decoded = ExitStatus::decode(status.encode());
    EXPECT_EQ(decoded.kind, status.kind);
    EXPECT_EQ(decoded.value, status.value);
  }
  EXPECT_THROW(ExitStatus::decode("code x"), std::exception);
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
}

}  // namespace
}  // namespace colossus::launcher
