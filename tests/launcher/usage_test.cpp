// Usage errors through the real command registration, in-process: each must
// be one line on stderr and exit code 2, before anything is started.
#include "colossus/cli/commands.h"

#include <gtest/gtest.h>

#include <fstream>

namespace colossus::launcher {
namespace {

struct CommandResult {
  int exit_code;
  std::string err;
};

CommandResult run_command_line(std::vector<std::string> args) {
  CLI::App app{"colossus"};
  app.require_subcommand(1);
  auto run = cli::add_run_command(app);
  args.insert(args.begin(), "colossus");
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  ::testing::internal::CaptureStderr();
  int code = run.run();
  return {code, ::testing::internal::GetCapturedStderr()};
}

TEST(RunCommand, BadInputIsOneLineAndExitCode2) {
  std::string dir = ::testing::TempDir();
  std::string bad_line = dir + "/launcher_usage_bad_line";
  std::string malformed = dir + "/launcher_usage_malformed";
  std::string good = dir + "/launcher_usage_good";
  std::string missing = dir + "/launcher_usage_missing";
  std::ofstream(bad_line) << "node-a\nnode-b slots=two\n";
  std::ofstream(malformed) << "node-a extra words\n";
  std::ofstream(good) << "node-a\nnode-b\n";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases{
      {{"-n", "0", "true"}, "--nproc_per_node 0 is invalid; give the number of ranks per node (at least 1)"},
      {{"-n", "two", "true"},
       "--nproc_per_node 'two' is not an integer; expected the number of ranks per node (at least 1)"},
      {{"--nnodes", "2", "--node_rank", "5", "true"}, "--node_rank 5 is outside 0..1 (--nnodes 2)"},
      {{"--master_port", "0", "true"}, "--master_port 0 is not a TCP port; give 1..65535 or omit it to get a free one"},
      {{"--exit_timeout", "soon", "true"},
       "--exit_timeout 'soon' is not a number of seconds; expected e.g. 300 (0 disables it)"},
      {{"-n", "2"}, "no program given; usage: colossus run [OPTIONS] PROGRAM [ARGS...]"},
      {{"-n", "2", "./no-such-program"}, "program './no-such-program' does not exist"},
      {{"--hostfile", missing, "true"}, "hostfile '" + missing + "' cannot be read: No such file or directory"},
      {{"--hostfile", bad_line, "true"},
       bad_line + ":2: bad slot count 'two' for host 'node-b'; expected a positive integer"},
      {{"--hostfile", malformed, "true"},
       malformed + ":1: cannot parse 'node-a extra words'; expected 'hostname', 'hostname slots=N' or 'hostname:N'"},
      {{"--hostfile", good, "--include", "node-a,node-z", "true"},
       "--include names host 'node-z', which hostfile '" + good + "' does not list (it lists: node-a, node-b)"},
      {{"--hostfile", good, "--exclude", "node-a", "--exclude", "node-b", "true"},
       "no hosts left after --include/--exclude (hostfile '" + good + "' lists: node-a, node-b)"},
      {{"--hostfile", good, "-n", "2", "--include", "node-a", "true"}, ""},
  };
  for (const auto& test_case : cases) {
    std::vector<std::string> args{"run", "--backend", "nccl", "--dry_run"};
    args.insert(args.end(), test_case.args.begin(), test_case.args.end());
    if (test_case.message.empty()) {
      // The control: the same command line with good input passes validation.
      ::testing::internal::CaptureStdout();
      auto result = run_command_line(args);
      std::string out = ::testing::internal::GetCapturedStdout();
      EXPECT_EQ(result.exit_code, 0) << result.err;
      EXPECT_NE(out.find("node 0 (node-a): ssh"), std::string::npos) << out;
      EXPECT_EQ(out.find("node-b"), std::string::npos) << out;
      continue;
    }
    auto result = run_command_line(args);
    EXPECT_EQ(result.exit_code, 2) << test_case.message;
    EXPECT_EQ(result.err, "colossus run: error: " + test_case.message + "\n");
  }
}

TEST(RunCommand, EverythingAfterProgramIsTheProgramsOwn) {
  ::testing::internal::CaptureStdout();
  auto result = run_command_line({"run", "--backend", "nccl", "--dry_run", "-n", "1", "--master_port", "7000", "sh",
                                  "-n", "5", "--dry_run", "--", "x"});
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(out.find("MASTER_PORT=7000"), std::string::npos) << out;
  EXPECT_NE(out.find(" sh -n 5 --dry_run -- x\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace colossus::launcher
