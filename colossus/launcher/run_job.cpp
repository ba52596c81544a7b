#include "colossus/launcher/run_job.h"

#include "colossus/core/errors.h"
#include "colossus/launcher/child_process.h"
#include "colossus/launcher/fd.h"
#include "colossus/launcher/launch_plan.h"
#include "colossus/launcher/mpi_job.h"
#include "colossus/launcher/net.h"
#include "colossus/launcher/rank_channel.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace colossus::launcher {

namespace {

MonitorOptions monitor_options(const RunOptions& options, const std::string& noun,
                               std::chrono::milliseconds extra_grace = std::chrono::milliseconds(0)) {
  MonitorOptions monitor;
  monitor.noun = noun;
  monitor.exit_timeout = std::chrono::milliseconds(static_cast<long long>(options.exit_timeout_s * 1000.0));
  // Units that stop their own children (node launchers, rank wrappers) get
  // their own grace period plus a margin before we kill them.
  monitor.stop_grace += extra_grace;
  return monitor;
}

void print_line(const std::string& line) { write_all(STDOUT_FILENO, line + "\n"); }

std::string current_directory() {
  char buffer[4096];
  if (::getcwd(buffer, sizeof(buffer)) == nullptr) {
    throw LaunchError(fmt::format("cannot read the current directory: {}", std::strerror(errno)));
  }
  return buffer;
}

// A temporary file holding mpirun's hostfile, removed when the job ends.
class TempFile {
 public:
  explicit TempFile(const std::string& contents) {
    const char* tmp = std::getenv("TMPDIR");
    path_ = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/colossus-hosts-XXXXXX";
    Fd fd(::mkstemp(path_.data()));
    if (!fd.valid()) throw LaunchError(fmt::format("cannot create {}: {}", path_, std::strerror(errno)));
    if (!write_all(fd.get(), contents)) throw LaunchError(fmt::format("cannot write {}", path_));
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int run_local(const RunOptions& options, const std::string& program_path, const Environment& base) {
  JobLayout layout{.nproc_per_node = options.nproc_per_node, .nnodes = options.nnodes, .node_rank = options.node_rank};
  if (!options.master_addr.empty()) layout.master_addr = options.master_addr;
  layout.master_port =
      choose_master_port(options.master_port, options.node_rank == 0 && is_local_host(layout.master_addr));
  if (options.dry_run) {
    print_line(fmt::format("colossus run (dry run): backend nccl, node {} of {}, {} ranks per node, master {}:{}",
                           layout.node_rank, layout.nnodes, layout.nproc_per_node, layout.master_addr,
                           layout.master_port));
    for (int local_rank = 0; local_rank < layout.nproc_per_node; ++local_rank) {
      std::string vars;
      for (const auto& [name, value] : rank_variables(layout, local_rank, base))
        vars += " " + shell_quote(name + "=" + value);
      print_line(fmt::format("rank {}: env{} {}", layout.global_rank(local_rank), vars, shell_join(options.command)));
    }
    return 0;
  }
  return supervise_local_units(plan_local_ranks(layout, program_path, options.command, base),
                               {.monitor = monitor_options(options, "rank"), .watch_stdin = options.watch_stdin});
}

int run_nodes(const RunOptions& options, const std::vector<Host>& hosts, const Environment& base) {
  JobLayout layout{.nproc_per_node = options.nproc_per_node, .nnodes = static_cast<int>(hosts.size())};
  bool all_local = true;
  for (const auto& host : hosts) all_local = all_local && is_local_host(host.name);
  bool master_here = is_local_host(hosts[0].name);
  // "localhost" would send the other hosts to themselves.
  layout.master_addr = master_here && !all_local ? local_hostname() : hosts[0].name;
  layout.master_port = choose_master_port(options.master_port, master_here);
  NodeLaunch launch{.self_path = self_executable(), .cwd = current_directory()};
  if (!all_local) launch.ssh_path = resolve_program("ssh");
  auto units = plan_nodes(options, hosts, layout, launch, base);
  if (options.dry_run) {
    print_line(fmt::format("colossus run (dry run): backend nccl, {} nodes from {}, {} ranks per node, master {}:{}",
                           hosts.size(), options.hostfile, layout.nproc_per_node, layout.master_addr,
                           layout.master_port));
    for (const auto& unit : units) print_line(fmt::format("node {}: {}", unit.id, shell_join(unit.spawn.argv)));
    return 0;
  }
  return supervise_local_units(std::move(units), {.monitor = monitor_options(options, "node", std::chrono::seconds(3)),
                                                  .watch_stdin = options.watch_stdin});
}

int run_mpi(const RunOptions& options, const std::string& program_path, const std::vector<Host>* hosts,
            const Environment& base) {
  if (options.nnodes > 1) {
    throw ConfigError(
        fmt::format("--nnodes {} with --backend mpi: mpirun starts the ranks of every node, so give "
                    "the nodes with --hostfile instead (or use --backend nccl)",
                    options.nnodes));
  }
  JobLayout layout{.nproc_per_node = options.nproc_per_node, .nnodes = hosts ? static_cast<int>(hosts->size()) : 1};
  bool master_here = !hosts || is_local_host((*hosts)[0].name);
  if (hosts) layout.master_addr = (*hosts)[0].name;
  layout.master_port = choose_master_port(options.master_port, master_here);

  std::string mpirun_path;
  try {
    mpirun_path = resolve_program("mpirun");
  } catch (const ConfigError&) {
    throw ConfigError("--backend mpi needs mpirun, which is not on PATH; install OpenMPI or use --backend nccl");
  }
  // Remote ranks must reach our rank channel, so with a hostfile it listens
  // on every interface and is named by host name (or COLOSSUS_LAUNCHER_ADDR).
  std::string bind_address = hosts ? "0.0.0.0" : "127.0.0.1";
  std::string reachable = hosts ? base.get("COLOSSUS_LAUNCHER_ADDR").value_or(local_hostname()) : "127.0.0.1";
  MpiLaunch launch{.mpirun_path = mpirun_path, .self_path = self_executable(), .program_path = program_path};
  std::string hostfile_text = hosts ? mpi_hostfile_text(*hosts, options.nproc_per_node) : "";

  if (options.dry_run) {
    launch.hostfile_path = hosts ? "<temporary hostfile>" : "";
    launch.channel_address = reachable + ":<port chosen at start>";
    launch.channel_token = "<random>";
    print_line(fmt::format("colossus run (dry run): backend mpi, {} ranks, master {}:{}", layout.world_size(),
                           layout.master_addr, layout.master_port));
    print_line("mpirun: " + shell_join(mpirun_arguments(layout, launch, options.command, base)));
    if (hosts) {
      print_line("hostfile for mpirun:");
      std::string line;
      for (char c : hostfile_text) {
        if (c != '\n') {
          line += c;
          continue;
        }
        print_line("  " + line);
        line.clear();
      }
    }
    return 0;
  }

  std::optional<TempFile> hostfile;
  if (hosts) {
    hostfile.emplace(hostfile_text);
    launch.hostfile_path = hostfile->path();
  }
  int channel_port = 0;
  MpiJob job;
  job.listener = listen_tcp(bind_address, &channel_port);
  job.token = random_token();
  launch.channel_address = fmt::format("{}:{}", reachable, channel_port);
  launch.channel_token = job.token;
  // A launcher that dies abruptly takes mpirun with it by SIGKILL: mpirun
  // defers a SIGTERM until it has started every rank, which with many ranks
  // left it running for tens of seconds. The ranks' wrappers stop their
  // programs themselves when mpirun or the launcher's channel goes away.
  job.mpirun = SpawnSpec{.path = mpirun_path,
                         .argv = mpirun_arguments(layout, launch, options.command, base),
                         .env = mpirun_environment(base, launch),
                         .death_signal = SIGKILL};
  job.world_size = layout.world_size();
  job.monitor = monitor_options(options, "rank", std::chrono::seconds(2));
  job.watch_stdin = options.watch_stdin;
  return supervise_mpi_job(std::move(job));
}

}  // namespace

int choose_master_port(const std::optional<int>& requested, bool master_is_here) {
  if (requested) {
    if (master_is_here && port_in_use(*requested)) {
      throw ConfigError(
          fmt::format("master port {} is already in use on this host; pick another with "
                      "--master_port or omit it to get a free one",
                      *requested));
    }
    return *requested;
  }
  return master_is_here ? free_port() : kDefaultMasterPort;
}

int run_job(const RunOptions& options) {
  options.validate();
  std::string program_path = resolve_program(options.command[0]);
  std::string backend = choose_backend(options.backend);
  Environment base = Environment::current();
  if (!options.hostfile.empty()) {
    auto hosts = select_hosts(parse_hostfile(options.hostfile), options.include, options.exclude, options.hostfile);
    check_slots(hosts, options.nproc_per_node, options.hostfile);
    if (backend == "mpi") return run_mpi(options, program_path, &hosts, base);
    return run_nodes(options, hosts, base);
  }
  if (backend == "mpi") return run_mpi(options, program_path, nullptr, base);
  return run_local(options, program_path, base);
}

}  // namespace colossus::launcher
