// Real jobs through the launcher binary, in both modes: the env (nccl) mode
// starts plain shell programs itself (the launcher must not care what the
// program is); the mpi mode goes through mpirun and `colossus _rank`. Both
// must look the same to the user.
#include "launcher_process.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <thread>
#include <chrono>

namespace colossus::launcher::testing {
namespace {

// Rank programs sleep this long unless stopped; any test that waited for it
// would blow its time budget, so "stopped quickly" is checked against it.
constexpr const char* kLongSleep = "60";
constexpr double kQuick = 20;

class LauncherModes : public ::testing::TestWithParam<std::string> {
 protected:
  std::vector<std::string> run_args(int ranks, std::vector<std::string> extra, const std::string& script) {
    std::vector<std::string> args{"run", "-n", std::to_string(ranks), "--backend", GetParam()};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"sh", "-c", script});
    return args;
  }
};

TEST_P(LauncherModes, EveryRankGetsItsPlaceAndPrefixedLines) {
  auto result = run_launcher(run_args(4, {},
                                      "echo \"rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK lws=$LOCAL_WORLD_SIZE "
                                      "group=$GROUP_RANK launcher=$COLOSSUS_LAUNCHER nvls=$NCCL_NVLS_ENABLE "
                                      "symm=$TORCH_SYMM_MEM_DISABLE_MULTICAST nvshmem=$NVSHMEM_DISABLE_NVLS "
                                      "master=$MASTER_ADDR\"; echo \"to-stderr $RANK\" >&2"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto out = lines_of(result.out);
  auto err = lines_of(result.err);
  ASSERT_EQ(out.size(), 4u) << result.out;
  ASSERT_EQ(err.size(), 4u) << result.err;
  std::sort(out.begin(), out.end());
  std::sort(err.begin(), err.end());
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(out[rank], fmt::format("[r{0}] rank={0} world=4 local={0} lws=4 group=0 launcher=1 nvls=0 symm=1 "
                                     "nvshmem=1 master=127.0.0.1",
                                     rank));
    EXPECT_EQ(err[rank], fmt::format("[r{0}] to-stderr {0}", rank));
  }
}

TEST_P(LauncherModes, UserSettingsAndProgramArgumentsPassThrough) {
  // Flags after PROGRAM belong to it, even ones that look like ours.
  auto args = run_args(2, {}, "echo \"$NCCL_NVLS_ENABLE $*\"");
  args.insert(args.end(), {"sh", "-n", "5", "--backend", "x"});
  auto result = run_launcher(args, {{"NCCL_NVLS_ENABLE", "1"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto out = lines_of(result.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[r0] 1 -n 5 --backend x", "[r1] 1 -n 5 --backend x"}));
}

TEST_P(LauncherModes, HeavyOutputNeverMixesLinesAndPartialLinesAreFlushed) {
  auto result =
      run_launcher(run_args(4, {},
                            "i=0; while [ $i -lt 1500 ]; do echo \"$RANK-$i-"
                            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-end\"; "
                            "i=$((i+1)); done; printf 'tail-without-newline'"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto lines = lines_of(result.out);
  ASSERT_EQ(lines.size(), 4u * 1501u);
  std::regex line_pattern(R"(\[r([0-3])\] (\1-[0-9]+-x+-end|tail-without-newline))");
  std::map<std::string, int> per_rank;
  for (const auto& line : lines) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, line_pattern)) << "mixed line: " << line;
    ++per_rank[match[1]];
  }
  for (const auto& [rank, count] : per_rank) EXPECT_EQ(count, 1501) << "rank " << rank;
  EXPECT_EQ(result.out.back(), '\n');
}

TEST_P(LauncherModes, ExitCodeOfAFailingRankStopsTheOthers) {
  auto result = run_launcher(
      run_args(3, {}, std::string("if [ $RANK = 2 ]; then sleep 0.5; exit 3; fi; exec sleep ") + kLongSleep));
  EXPECT_EQ(result.exit_code, 3) << result.err;
  EXPECT_NE(result.err.find("colossus run: rank 2 exited with code 3; stopped the other 2 ranks"), std::string::npos)
      << result.err;
  EXPECT_LT(result.seconds, kQuick);
}

TEST_P(LauncherModes, CrashingRankIsReportedBySignal) {
  auto result = run_launcher(
      run_args(3, {}, std::string("if [ $RANK = 1 ]; then sleep 0.5; kill -SEGV $$; fi; exec sleep ") + kLongSleep));
  EXPECT_EQ(result.exit_code, 128 + SIGSEGV) << result.err;
  EXPECT_NE(result.err.find("colossus run: rank 1 was killed by signal 11 (SIGSEGV); stopped the other 2 ranks"),
            std::string::npos)
      << result.err;
  EXPECT_LT(result.seconds, kQuick);
}

TEST_P(LauncherModes, HangingRankIsKilledAfterTheExitTimeout) {
  auto result = run_launcher(run_args(
      3, {"--exit_timeout", "2"}, std::string("if [ $RANK = 1 ]; then exec sleep ") + kLongSleep + "; fi; echo done"));
  EXPECT_EQ(result.exit_code, 124) << result.err;
  std::regex message(R"(colossus run: rank 1 did not exit within 2 s after rank [02] exited successfully; killed it)");
  EXPECT_TRUE(std::regex_search(result.err, message)) << result.err;
  EXPECT_GE(result.seconds, 2.0);
  EXPECT_LT(result.seconds, kQuick);
  auto out = lines_of(result.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[r0] done", "[r2] done"}));
}

TEST_P(LauncherModes, InterruptStopsEveryRank) {
  ScratchDir dir;
  LauncherProcess launcher(
      run_args(
          4, {},
          std::string("echo $$ > \"$PID_DIR/$RANK.tmp\"; mv \"$PID_DIR/$RANK.tmp\" \"$PID_DIR/$RANK\"; exec sleep ") +
              kLongSleep),
      {{"PID_DIR", dir.path()}});
  std::vector<int> pids;
  for (int rank = 0; rank < 4; ++rank) {
    pids.push_back(wait_for_pid_file(dir.file(std::to_string(rank))));
    ASSERT_GT(pids.back(), 0) << "rank " << rank << " never started";
  }
  ::kill(launcher.pid(), SIGINT);
  auto result = launcher.wait();
  EXPECT_EQ(result.exit_code, 130) << result.err;
  EXPECT_NE(result.err.find("colossus run: got SIGINT; stopped 4 ranks"), std::string::npos) << result.err;
  EXPECT_LT(result.seconds, kQuick + 10);
  for (int pid : pids) EXPECT_TRUE(process_gone(pid)) << "rank process " << pid << " survived";
}

TEST_P(LauncherModes, TerminateGives143) {
  ScratchDir dir;
  LauncherProcess launcher(
      run_args(
          2, {},
          std::string("echo $$ > \"$PID_DIR/$RANK.tmp\"; mv \"$PID_DIR/$RANK.tmp\" \"$PID_DIR/$RANK\"; exec sleep ") +
              kLongSleep),
      {{"PID_DIR", dir.path()}});
  ASSERT_GT(wait_for_pid_file(dir.file("0")), 0);
  ASSERT_GT(wait_for_pid_file(dir.file("1")), 0);
  ::kill(launcher.pid(), SIGTERM);
  auto result = launcher.wait();
  EXPECT_EQ(result.exit_code, 143) << result.err;
  EXPECT_NE(result.err.find("colossus run: got SIGTERM; stopped 2 ranks"), std::string::npos) << result.err;
}

TEST_P(LauncherModes, MissingProgramIsAUsageError) {
  auto result = run_launcher({"run", "-n", "2", "--backend", GetParam(), "./no-such-program"});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_EQ(result.err, "colossus run: error: program './no-such-program' does not exist\n");
}

INSTANTIATE_TEST_SUITE_P(Backends, LauncherModes, ::testing::Values("nccl", "mpi"),
                         [](const auto& info) { return info.param; });

TEST(LauncherEnvMode, GrandchildrenDieWithTheirRank) {
  ScratchDir dir;
  auto result = run_launcher({"run", "-n", "2", "--backend", "nccl", "sh", "-c",
                              std::string("if [ $RANK = 0 ]; then sleep ") + kLongSleep +
                                  " & echo $! > \"$PID_DIR/grandchild\"; wait; fi; "
                                  "while [ ! -s \"$PID_DIR/grandchild\" ]; do sleep 0.05; done; exit 4"},
                             {{"PID_DIR", dir.path()}});
  EXPECT_EQ(result.exit_code, 4) << result.err;
  int grandchild = wait_for_pid_file(dir.file("grandchild"), 1);
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(wait_until_gone(grandchild, 5)) << "background process of rank 0 survived";
}

TEST(LauncherEnvMode, RanksDieWhenTheLauncherIsKilled) {
  ScratchDir dir;
  LauncherProcess launcher(
      {"run", "-n", "2", "--backend", "nccl", "sh", "-c",
       std::string("echo $$ > \"$PID_DIR/$RANK.tmp\"; mv \"$PID_DIR/$RANK.tmp\" \"$PID_DIR/$RANK\"; exec sleep ") +
           kLongSleep},
      {{"PID_DIR", dir.path()}});
  int rank0 = wait_for_pid_file(dir.file("0"));
  int rank1 = wait_for_pid_file(dir.file("1"));
  ASSERT_GT(rank0, 0);
  ASSERT_GT(rank1, 0);
  ::kill(launcher.pid(), SIGKILL);
  launcher.wait();
  EXPECT_TRUE(wait_until_gone(rank0, 5));
  EXPECT_TRUE(wait_until_gone(rank1, 5));
}

TEST(LauncherEnvMode, TakenMasterPortIsRefusedUpFront) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  std::string port = std::to_string(ntohs(addr.sin_port));
  auto result = run_launcher({"run", "-n", "2", "--backend", "nccl", "--master_port", port, "true"});
  ::close(fd);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_EQ(result.err, "colossus run: error: master port " + port +
                            " is already in use on this host; pick another with --master_port or omit it to get a "
                            "free one\n");
  EXPECT_EQ(result.out, "");
}

TEST(LauncherEnvMode, HostfileOfLocalHostsRunsOneNodeLauncherEach) {
  ScratchDir dir;
  std::ofstream(dir.file("hosts")) << "localhost slots=2\n127.0.0.1:2\n";
  auto result = run_launcher({"run", "-n", "2", "--backend", "nccl", "--hostfile", dir.file("hosts"), "sh", "-c",
                              "echo \"$RANK/$WORLD_SIZE node $GROUP_RANK local $LOCAL_RANK\""});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto out = lines_of(result.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[r0] 0/4 node 0 local 0", "[r1] 1/4 node 0 local 1",
                                           "[r2] 2/4 node 1 local 0", "[r3] 3/4 node 1 local 1"}));
}

TEST(LauncherEnvMode, FailureOnOneNodeStopsTheOtherNode) {
  ScratchDir dir;
  std::ofstream(dir.file("hosts")) << "localhost\n127.0.0.1\n";
  auto result = run_launcher({"run", "-n", "2", "--backend", "nccl", "--hostfile", dir.file("hosts"), "sh", "-c",
                              std::string("if [ $RANK = 3 ]; then sleep 0.5; exit 5; fi; exec sleep ") + kLongSleep});
  EXPECT_EQ(result.exit_code, 5) << result.err;
  EXPECT_NE(result.err.find("colossus run: rank 3 exited with code 5; stopped the other rank"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("colossus run: node 1 (127.0.0.1) exited with code 5; stopped the other node"),
            std::string::npos)
      << result.err;
  EXPECT_LT(result.seconds, kQuick);
}

TEST(LauncherMpiMode, HostfileIsTranslatedForMpirun) {
  ScratchDir dir;
  std::ofstream(dir.file("hosts")) << "# one machine\nlocalhost slots=3\n";
  auto result = run_launcher({"run", "-n", "3", "--backend", "mpi", "--hostfile", dir.file("hosts"), "sh", "-c",
                              "echo \"$RANK/$WORLD_SIZE\""});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto out = lines_of(result.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[r0] 0/3", "[r1] 1/3", "[r2] 2/3"}));
}

// mpirun busy starting many ranks used to outlive a SIGKILLed launcher for
// tens of seconds (it got SIGTERM as its parent-death signal and finished
// launching first); mpirun, the rank wrappers and the programs all carry the
// scratch path on their command lines, so none of them may survive.
TEST(LauncherMpiMode, NothingOutlivesALauncherKilledWhileRanksStart) {
  ScratchDir dir;
  LauncherProcess launcher({"run", "-n", "192", "--backend", "mpi", "sh", "-c", "sleep 60; true", dir.path()});
  std::vector<pid_t> mpirun;
  for (int i = 0; i < 1000 && mpirun.empty(); ++i) {
    mpirun = children_of(launcher.pid());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(mpirun.size(), 1u) << "the launcher did not start mpirun";
  // Kill once the first ranks run (the launcher and mpirun name the path too),
  // long before all 192 do.
  for (int i = 0; i < 1000 && processes_naming(dir.path()) < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(launcher.pid(), SIGKILL);
  launcher.wait();
  EXPECT_TRUE(wait_until_gone(mpirun[0], 5)) << "mpirun outlived its launcher";
  int left = processes_naming(dir.path());
  for (int i = 0; i < 500 && left > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left = processes_naming(dir.path());
  }
  EXPECT_EQ(left, 0) << "processes of the job outlived its launcher";
  kill_processes_naming(dir.path());
}

TEST(LauncherDryRun, HostfileOfTwoHostsShowsOneCommandPerNode) {
  ScratchDir dir;
  std::ofstream(dir.file("hosts")) << "node-a slots=4\nnode-b:4\n";
  auto result = run_launcher({"run", "-n", "4", "--backend", "nccl", "--hostfile", dir.file("hosts"), "--dry_run",
                              "--master_port", "6000", "sh", "-c", "echo $RANK"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto lines = lines_of(result.out);
  ASSERT_EQ(lines.size(), 3u) << result.out;
  EXPECT_NE(lines[0].find("2 nodes"), std::string::npos);
  EXPECT_NE(lines[0].find("master node-a:6000"), std::string::npos);
  for (int node = 0; node < 2; ++node) {
    std::string host = node == 0 ? "node-a" : "node-b";
    const std::string& line = lines[node + 1];
    EXPECT_EQ(line.rfind(fmt::format("node {} ({}): ssh -o BatchMode=yes {} 'cd ", node, host, host), 0), 0u) << line;
    EXPECT_NE(line.find(fmt::format(" run --nproc_per_node 4 --nnodes 2 --node_rank {} --master_addr node-a "
                                    "--master_port 6000 --backend nccl",
                                    node)),
              std::string::npos)
        << line;
    EXPECT_NE(line.find("-- sh -c '\\''echo $RANK'\\'''"), std::string::npos) << line;
  }
}

TEST(LauncherDryRun, LocalRanksShowTheirEnvironment) {
  auto result = run_launcher({"run", "-n", "2", "--backend", "nccl", "--dry_run", "--master_port", "6001", "true"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto lines = lines_of(result.out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[2].find("RANK=1 "), std::string::npos);
  EXPECT_NE(lines[2].find("MASTER_PORT=6001"), std::string::npos);
  EXPECT_EQ(lines[2].substr(lines[2].size() - 5), " true");
}

// torchrun's spellings (hyphens, --rdzv-endpoint HOST:PORT) start the same
// ranks as ours; naming node 0 both ways is refused.
TEST(LauncherDryRun, TorchrunSpellingsMatchOurs) {
  auto ours = run_launcher({"run", "--nproc_per_node", "2", "--backend", "nccl", "--dry_run", "--master_addr",
                            "127.0.0.1", "--master_port", "6002", "true"});
  auto theirs = run_launcher({"run", "--nproc-per-node", "2", "--backend", "nccl", "--dry-run", "--rdzv-endpoint",
                              "127.0.0.1:6002", "true"});
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  ASSERT_EQ(theirs.exit_code, 0) << theirs.err;
  EXPECT_EQ(theirs.out, ours.out);
  EXPECT_NE(theirs.out.find("MASTER_PORT=6002"), std::string::npos) << theirs.out;
  auto hyphens = run_launcher({"run", "--nproc-per-node", "2", "--backend", "nccl", "--dry_run", "--master-addr",
                               "127.0.0.1", "--master-port", "6002", "--node-rank", "0", "--nnodes", "1", "true"});
  ASSERT_EQ(hyphens.exit_code, 0) << hyphens.err;
  EXPECT_EQ(hyphens.out, ours.out);
  auto both = run_launcher({"run", "-n", "2", "--dry_run", "--master_port", "6002", "--rdzv-endpoint", "h:1", "true"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("give one of the two forms"), std::string::npos) << both.err;
  auto no_host = run_launcher({"run", "-n", "2", "--dry_run", "--rdzv-endpoint", ":6002", "true"});
  EXPECT_EQ(no_host.exit_code, 2);
  EXPECT_NE(no_host.err.find("names no host"), std::string::npos) << no_host.err;
}

}  // namespace
}  // namespace colossus::launcher::testing
