#include "colossus/core/errors.h"
#include "colossus/launcher/child_process.h"
#include "colossus/launcher/launch_plan.h"
#include "colossus/launcher/net.h"
#include "colossus/launcher/rank_wrapper.h"
#include "colossus/launcher/run_job.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

namespace colossus::launcher {
namespace {

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

RunOptions with_program(RunOptions options) {
  options.command = {"true"};
  return options;
}

TEST(RunOptions, ValidationNamesTheBadValue) {
  EXPECT_NO_THROW(with_program({}).validate());
  EXPECT_EQ(error_of([] { with_program({.nproc_per_node = 0}).validate(); }),
            "--nproc_per_node 0 is invalid; give the number of ranks per node (at least 1)");
  EXPECT_EQ(error_of([] { with_program({.nproc_per_node = 100000}).validate(); }),
            "--nproc_per_node 100000 is more than 1024 ranks on one node; give one rank per GPU (or a few per CPU "
            "core), and more nodes for more ranks");
  EXPECT_EQ(error_of([] { with_program({.nnodes = 0}).validate(); }),
            "--nnodes 0 is invalid; give the number of nodes (at least 1)");
  EXPECT_EQ(error_of([] { with_program({.nnodes = 2, .node_rank = 2}).validate(); }),
            "--node_rank 2 is outside 0..1 (--nnodes 2)");
  EXPECT_EQ(error_of([] { with_program({.node_rank = -1}).validate(); }),
            "--node_rank -1 is outside 0..0 (--nnodes 1)");
  EXPECT_EQ(error_of([] { with_program({.master_port = 0}).validate(); }),
            "--master_port 0 is not a TCP port; give 1..65535 or omit it to get a free one");
  EXPECT_EQ(error_of([] { with_program({.master_port = 65536}).validate(); }),
            "--master_port 65536 is not a TCP port; give 1..65535 or omit it to get a free one");
  EXPECT_EQ(error_of([] { with_program({.backend = "gloo"}).validate(); }),
            "--backend 'gloo' is not supported; use auto, nccl or mpi");
  EXPECT_EQ(error_of([] { with_program({.exit_timeout_s = -1}).validate(); }),
            "--exit_timeout -1 is negative; give seconds (0 disables hang detection)");
  EXPECT_EQ(error_of([] { RunOptions{}.validate(); }),
            "no program given; usage: colossus run [OPTIONS] PROGRAM [ARGS...]");
  EXPECT_EQ(error_of([] { with_program({.nnodes = 2, .node_rank = 1}).validate(); }),
            "--nnodes 2 needs --master_addr (the address of node 0, the same on every node)");
  EXPECT_EQ(error_of([] { with_program({.nnodes = 2, .master_addr = "n0"}).validate(); }),
            "--nnodes 2 needs --master_port (the same on every node)");
  EXPECT_EQ(error_of([] { with_program({.nnodes = 2, .hostfile = "hf"}).validate(); }),
            "--hostfile hf decides the nodes, their ranks and the master; drop --nnodes/--node_rank/--master_addr");
  EXPECT_EQ(error_of([] { with_program({.exclude = {"a"}}).validate(); }),
            "--exclude picks hosts from a hostfile; give --hostfile too");
}

TEST(RunOptions, FlagParsing) {
  EXPECT_EQ(parse_int_flag("--nnodes", "12", "a count"), 12);
  EXPECT_EQ(error_of([] { parse_int_flag("--nnodes", "1x", "a count"); }),
            "--nnodes '1x' is not an integer; expected a count");
  EXPECT_DOUBLE_EQ(parse_seconds_flag("--exit_timeout", "2.5"), 2.5);
  EXPECT_EQ(error_of([] { parse_seconds_flag("--exit_timeout", "soon"); }),
            "--exit_timeout 'soon' is not a number of seconds; expected e.g. 300 (0 disables it)");
  EXPECT_EQ(choose_backend("mpi"), "mpi");
  EXPECT_EQ(choose_backend("nccl"), "nccl");
  EXPECT_EQ(choose_backend("auto"), gpu_visible() ? "nccl" : "mpi");
}

TEST(ResolveProgram, FindsOnPathAndExplainsFailures) {
  std::string sh = resolve_program("sh");
  EXPECT_EQ(sh.front(), '/');
  EXPECT_EQ(::access(sh.c_str(), X_OK), 0);
  EXPECT_EQ(resolve_program("/bin/sh").front(), '/');
  EXPECT_NE(error_of([] {
              resolve_program("no-such-program-xyz");
            }).find("program 'no-such-program-xyz' was not found on PATH"),
            std::string::npos);
  EXPECT_EQ(error_of([] { resolve_program("/no/such/file"); }), "program '/no/such/file' does not exist");
  std::string plain_file = ::testing::TempDir() + "/launcher_not_executable.txt";
  { std::ofstream(plain_file) << "data\n"; }
  ::chmod(plain_file.c_str(), 0644);
  EXPECT_EQ(error_of([&] { resolve_program(plain_file); }),
            "program '" + plain_file + "' is not an executable file (check its permissions)");
  std::remove(plain_file.c_str());
}

TEST(MasterPort, TakenPortIsRefusedAndFreePortsAreFree) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  int port = ntohs(addr.sin_port);
  EXPECT_TRUE(port_in_use(port));
  EXPECT_EQ(error_of([&] { choose_master_port(port, true); }),
            fmt::format("master port {} is already in use on this host; pick another with --master_port or omit it "
                        "to get a free one",
                        port));
  // Not our business when node 0 is another host.
  EXPECT_EQ(choose_master_port(port, false), port);
  ::close(fd);
  int free = choose_master_port(std::nullopt, true);
  EXPECT_GT(free, 0);
  EXPECT_FALSE(port_in_use(free));
  EXPECT_EQ(choose_master_port(std::nullopt, false), kDefaultMasterPort);
}

TEST(LocalHost, RecognisesThisMachineOnly) {
  EXPECT_TRUE(is_local_host("localhost"));
  EXPECT_TRUE(is_local_host("127.0.0.1"));
  EXPECT_TRUE(is_local_host(local_hostname()));
  EXPECT_FALSE(is_local_host("node-that-does-not-exist.example"));
}

TEST(LaunchPlan, RankVariablesFollowTorchrun) {
  JobLayout layout{.nproc_per_node = 4, .nnodes = 2, .node_rank = 1, .master_addr = "n0", .master_port = 1234};
  Environment base;
  base.set("NCCL_NVLS_ENABLE", "1");  // the user's choice wins over our default
  auto vars = rank_variables(layout, 2, base);
  EXPECT_EQ(vars["RANK"], "6");
  EXPECT_EQ(vars["LOCAL_RANK"], "2");
  EXPECT_EQ(vars["WORLD_SIZE"], "8");
  EXPECT_EQ(vars["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(vars["GROUP_RANK"], "1");
  EXPECT_EQ(vars["MASTER_ADDR"], "n0");
  EXPECT_EQ(vars["MASTER_PORT"], "1234");
  EXPECT_EQ(vars["COLOSSUS_LAUNCHER"], "1");
  EXPECT_EQ(vars["NCCL_NVLS_ENABLE"], "1");
  EXPECT_EQ(vars["TORCH_SYMM_MEM_DISABLE_MULTICAST"], "1");
  EXPECT_EQ(vars["NVSHMEM_DISABLE_NVLS"], "1");
  EXPECT_EQ(vars["OMP_NUM_THREADS"], "1");

  auto units = plan_local_ranks(layout, "/bin/echo", {"echo", "hi"}, base);
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[3].id, "7");
  EXPECT_EQ(units[3].output_prefix, "[r7] ");
  EXPECT_EQ(units[3].spawn.argv, (std::vector<std::string>{"echo", "hi"}));
  auto& env = units[3].spawn.env;
  EXPECT_NE(std::find(env.begin(), env.end(), "RANK=7"), env.end());
}

TEST(LaunchPlan, NodesRunLocallyOrOverSsh) {
  RunOptions options{.nproc_per_node = 2, .exit_timeout_s = 30, .command = {"train", "--lr", "0.1"}};
  std::vector<Host> hosts{{"localhost", 2, 1}, {"far-away", std::nullopt, 2}};
  JobLayout layout{.nproc_per_node = 2, .nnodes = 2, .master_addr = "me", .master_port = 4000};
  Environment base;
  base.set("PATH", "/opt/bin:/usr/bin");
  base.set("NCCL_DEBUG", "INFO");
  base.set("HOME", "/root");
  auto units = plan_nodes(options, hosts, layout,
                          {.self_path = "/x/colossus", .cwd = "/work dir", .ssh_path = "/usr/bin/ssh"}, base);
  ASSERT_EQ(units.size(), 2u);
  std::vector<std::string> local_args{"/x/colossus",
                                      "run",
                                      "--nproc_per_node",
                                      "2",
                                      "--nnodes",
                                      "2",
                                      "--node_rank",
                                      "0",
                                      "--master_addr",
                                      "me",
                                      "--master_port",
                                      "4000",
                                      "--backend",
                                      "nccl",
                                      "--exit_timeout",
                                      "30",
                                      "--watch_stdin",
                                      "--",
                                      "train",
                                      "--lr",
                                      "0.1"};
  EXPECT_EQ(units[0].id, "0 (localhost)");
  EXPECT_EQ(units[0].spawn.path, "/x/colossus");
  EXPECT_EQ(units[0].spawn.argv, local_args);
  EXPECT_TRUE(units[0].stop_by_closing_stdin);
  EXPECT_TRUE(units[0].spawn.stdin_pipe);
  EXPECT_EQ(units[1].spawn.path, "/usr/bin/ssh");
  ASSERT_EQ(units[1].spawn.argv.size(), 5u);
  EXPECT_EQ(units[1].spawn.argv[3], "far-away");
  EXPECT_EQ(units[1].spawn.argv[4],
            "cd '/work dir' && env NCCL_DEBUG=INFO PATH=/opt/bin:/usr/bin /x/colossus run --nproc_per_node 2 "
            "--nnodes 2 --node_rank 1 --master_addr me --master_port 4000 --backend nccl --exit_timeout 30 "
            "--watch_stdin -- train --lr 0.1");
}

TEST(LaunchPlan, MpirunCommandLine) {
  JobLayout layout{.nproc_per_node = 3};
  MpiLaunch launch{.mpirun_path = "/usr/bin/mpirun",
                   .self_path = "/x/colossus",
                   .program_path = "/bin/prog",
                   .hostfile_path = "",
                   .channel_address = "127.0.0.1:5000",
                   .channel_token = "tok"};
  auto args = mpirun_arguments(layout, launch, {"prog", "--flag", "a b"}, Environment{});
  std::string line = shell_join(args);
  EXPECT_EQ(line.rfind("mpirun -np 3 --oversubscribe --bind-to none --allow-run-as-root --mca btl self,vader "
                       "--mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 ",
                       0),
            0u)
      << line;
  EXPECT_NE(line.find("-x COLOSSUS_LAUNCHER=1"), std::string::npos);
  EXPECT_NE(line.find("-x COLOSSUS_RANK_CHANNEL=127.0.0.1:5000"), std::string::npos);
  // The token travels in mpirun's environment, never on a command line.
  EXPECT_EQ(line.find("tok"), std::string::npos) << line;
  EXPECT_NE(line.find("-x COLOSSUS_RANK_TOKEN "), std::string::npos) << line;
  const auto env = mpirun_environment(Environment{}, launch);
  EXPECT_NE(std::find(env.begin(), env.end(), "COLOSSUS_RANK_TOKEN=tok"), env.end());
  // One node: mpirun's own channels stay on loopback.
  EXPECT_NE(line.find("--mca oob_tcp_if_include lo"), std::string::npos) << line;
  EXPECT_NE(line.find("-x NCCL_NVLS_ENABLE=0"), std::string::npos);
  EXPECT_EQ(line.substr(line.find(" /x/colossus")), " /x/colossus _rank -- /bin/prog --flag 'a b'");
  EXPECT_EQ(line.find("--hostfile"), std::string::npos);
  launch.hostfile_path = "/tmp/h";
  line = shell_join(mpirun_arguments(layout, launch, {"prog"}, Environment{}));
  EXPECT_NE(line.find("--mca btl self,vader,tcp"), std::string::npos);
  EXPECT_NE(line.find("--hostfile /tmp/h"), std::string::npos);
  EXPECT_EQ(line.find("oob_tcp_if_include"), std::string::npos) << "several nodes need a routable interface";
}

TEST(LaunchPlan, ShellQuoting) {
  EXPECT_EQ(shell_quote("plain-word_1.2/x=y"), "plain-word_1.2/x=y");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("echo $RANK"), "'echo $RANK'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
}

TEST(RankWrapper, EnvironmentComesFromOpenMpi) {
  auto place = read_mpi_rank_place(map_env({{"OMPI_COMM_WORLD_RANK", "5"},
                                            {"OMPI_COMM_WORLD_SIZE", "8"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  Environment base;
  base.set("COLOSSUS_RANK_CHANNEL", "127.0.0.1:1");
  base.set("COLOSSUS_RANK_TOKEN", "secret");
  auto env = wrapped_program_environment(base, place);
  EXPECT_EQ(env.get("RANK"), "5");
  EXPECT_EQ(env.get("WORLD_SIZE"), "8");
  EXPECT_EQ(env.get("LOCAL_RANK"), "1");
  EXPECT_EQ(env.get("LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(env.get("GROUP_RANK"), "1");
  EXPECT_FALSE(env.get("COLOSSUS_RANK_TOKEN").has_value());
  EXPECT_FALSE(env.get("COLOSSUS_RANK_CHANNEL").has_value());
  EXPECT_EQ(error_of([] { read_mpi_rank_place(map_env({})); }),
            "OMPI_COMM_WORLD_RANK is not set: `colossus _rank` only runs under the mpirun that `colossus run "
            "--backend mpi` starts");
}

}  // namespace
}  // namespace colossus::launcher
