#include "colossus/launcher/launch_plan.h"

#include "colossus/launcher/net.h"
#include "colossus/launcher/rank_channel.h"

#include <fmt/format.h>

namespace colossus::launcher {

void add_launcher_defaults(Environment& env, int nproc_per_node) {
  env.set("COLOSSUS_LAUNCHER", "1");
  disable_multicast_by_default(env);
  if (nproc_per_node > 1) env.set_default("OMP_NUM_THREADS", "1");
}

std::map<std::string, std::string> rank_variables(const JobLayout& layout, int local_rank, const Environment& base) {
  Environment env = base;
  add_launcher_defaults(env, layout.nproc_per_node);
  std::map<std::string, std::string> vars{
      {"RANK", std::to_string(layout.global_rank(local_rank))},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(layout.world_size())},
      {"LOCAL_WORLD_SIZE", std::to_string(layout.nproc_per_node)},
      {"GROUP_RANK", std::to_string(layout.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(layout.nnodes)},
      {"MASTER_ADDR", layout.master_addr},
      {"MASTER_PORT", std::to_string(layout.master_port)},
      {"COLOSSUS_LAUNCHER", "1"},
  };
  for (const char* name : kMulticastVariables) vars[name] = *env.get(name);
  if (auto threads = env.get("OMP_NUM_THREADS")) vars["OMP_NUM_THREADS"] = *threads;
  return vars;
}

std::vector<LocalUnit> plan_local_ranks(const JobLayout& layout, const std::string& program_path,
                                        const std::vector<std::string>& command, const Environment& base) {
  std::vector<LocalUnit> units;
  for (int local_rank = 0; local_rank < layout.nproc_per_node; ++local_rank) {
    Environment env = base;
    for (const auto& [name, value] : rank_variables(layout, local_rank, base)) env.set(name, value);
    int rank = layout.global_rank(local_rank);
    LocalUnit unit;
    unit.id = std::to_string(rank);
    unit.output_prefix = fmt::format("[r{}] ", rank);
    unit.spawn = SpawnSpec{.path = program_path, .argv = command, .env = env.entries()};
    units.push_back(std::move(unit));
  }
  return units;
}

std::map<std::string, std::string> forwarded_variables(const Environment& base) {
  static const char* const kPrefixes[] = {"NCCL_", "CUDA_", "TORCH_", "NVSHMEM_", "OMP_", "COLOSSUS_"};
  std::map<std::string, std::string> vars;
  for (const auto& [name, value] : base.vars()) {
    bool forward = name == "PATH" || name == "LD_LIBRARY_PATH";
    for (const char* prefix : kPrefixes) forward = forward || name.rfind(prefix, 0) == 0;
    if (forward) vars[name] = value;
  }
  return vars;
}

std::vector<LocalUnit> plan_nodes(const RunOptions& options, const std::vector<Host>& hosts, const JobLayout& layout,
                                  const NodeLaunch& launch, const Environment& base) {
  std::vector<LocalUnit> units;
  for (size_t node = 0; node < hosts.size(); ++node) {
    std::vector<std::string> run_args{launch.self_path,   "run",
                                      "--nproc_per_node", std::to_string(layout.nproc_per_node),
                                      "--nnodes",         std::to_string(hosts.size()),
                                      "--node_rank",      std::to_string(node),
                                      "--master_addr",    layout.master_addr,
                                      "--master_port",    std::to_string(layout.master_port),
                                      "--backend",        "nccl",
                                      "--exit_timeout",   fmt::format("{:g}", options.exit_timeout_s),
                                      "--watch_stdin",    "--"};
    run_args.insert(run_args.end(), options.command.begin(), options.command.end());

    LocalUnit unit;
    unit.id = fmt::format("{} ({})", node, hosts[node].name);
    unit.stop_by_closing_stdin = true;
    // A node launcher cleans up its ranks on SIGTERM, so that is what it gets
    // if we die.
    unit.spawn = SpawnSpec{
        .path = launch.self_path, .argv = run_args, .env = base.entries(), .stdin_pipe = true, .death_signal = SIGTERM};
    if (!is_local_host(hosts[node].name)) {
      std::string remote = "cd " + shell_quote(launch.cwd) + " && env";
      for (const auto& [name, value] : forwarded_variables(base)) remote += " " + shell_quote(name + "=" + value);
      remote += " " + shell_join(run_args);
      unit.spawn.path = launch.ssh_path;
      unit.spawn.argv = {"ssh", "-o", "BatchMode=yes", hosts[node].name, remote};
    }
    units.push_back(std::move(unit));
  }
  return units;
}

std::vector<std::string> mpirun_environment(const Environment& base, const MpiLaunch& launch) {
  Environment env = base;
  env.set(kChannelTokenVar, launch.channel_token);
  return env.entries();
}

std::vector<std::string> mpirun_arguments(const JobLayout& layout, const MpiLaunch& launch,
                                          const std::vector<std::string>& command, const Environment& base) {
  // Shared memory without CMA (often blocked in containers), TCP between
  // hosts; no core binding and yielding when idle, so ranks can share cores.
  std::vector<std::string> args{"mpirun",
                                "-np",
                                std::to_string(layout.world_size()),
                                "--oversubscribe",
                                "--bind-to",
                                "none",
                                "--allow-run-as-root",
                                "--mca",
                                "btl",
                                launch.hostfile_path.empty() ? "self,vader" : "self,vader,tcp",
                                "--mca",
                                "btl_vader_single_copy_mechanism",
                                "none",
                                "--mca",
                                "mpi_yield_when_idle",
                                "1"};
  if (!launch.hostfile_path.empty()) {
    args.insert(args.end(), {"--hostfile", launch.hostfile_path});
  } else {
    // One node: mpirun's out-of-band channel needs no other interface, so it
    // listens on none (by default it listens on all of them).
    args.insert(args.end(), {"--mca", "oob_tcp_if_include", "lo"});
  }
  Environment env = base;
  add_launcher_defaults(env, layout.nproc_per_node);
  std::map<std::string, std::string> exported{
      {"COLOSSUS_LAUNCHER", "1"},
      {"MASTER_ADDR", layout.master_addr},
      {"MASTER_PORT", std::to_string(layout.master_port)},
      {kChannelAddressVar, launch.channel_address},
  };
  for (const char* name : kMulticastVariables) exported[name] = *env.get(name);
  if (auto threads = env.get("OMP_NUM_THREADS")) exported["OMP_NUM_THREADS"] = *threads;
  for (const auto& [name, value] : exported) args.insert(args.end(), {"-x", name + "=" + value});
  // The rank token is a secret: mpirun forwards it from its own environment
  // (mpirun_environment), so it never appears on a command line `ps` shows.
  args.insert(args.end(), {"-x", kChannelTokenVar});
  args.insert(args.end(), {launch.self_path, "_rank", "--", launch.program_path});
  args.insert(args.end(), command.begin() + 1, command.end());
  return args;
}

std::string shell_quote(const std::string& word) {
  if (word.empty()) return "''";
  bool plain = true;
  for (char c : word) {
    bool safe =
        std::isalnum(static_cast<unsigned char>(c)) || std::string_view("@%+=:,./_-").find(c) != std::string_view::npos;
    plain = plain && safe;
  }
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string line;
  for (const auto& word : words) line += (line.empty() ? "" : " ") + shell_quote(word);
  return line;
}

}  // namespace colossus::launcher
