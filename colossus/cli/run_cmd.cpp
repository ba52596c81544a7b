// `colossus run` and the hidden `colossus _rank` on the CLI (the launcher
// layer does the work; this file only maps options onto it).
// Everything after PROGRAM belongs to the program: the positional list takes
// it whole (positionals_at_end), so `colossus run -n 2 prog -n 5` gives prog
// its own `-n 5`.
#include "colossus/cli/commands.h"
#include "colossus/core/errors.h"
#include "colossus/launcher/hostfile.h"
#include "colossus/launcher/rank_wrapper.h"
#include "colossus/launcher/run_job.h"

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <tuple>

namespace colossus::cli {

namespace {

// Kept as text so that a malformed number is reported like any other usage
// error (one line, exit code 2) instead of by the generic parser.
struct RunFlags {
  std::string nproc_per_node = "1";
  std::string nnodes = "1";
  std::string node_rank = "0";
  std::string master_addr;
  std::string master_port;
  std::string rdzv_endpoint;
  std::string hostfile;
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  std::string backend = "auto";
  std::string exit_timeout = "300";
  bool dry_run = false;
  bool watch_stdin = false;
  std::vector<std::string> command;
};

constexpr int kUsageExitCode = 2;

launcher::RunOptions to_options(const RunFlags& flags) {
  launcher::RunOptions options;
  options.nproc_per_node =
      launcher::parse_int_flag("--nproc_per_node", flags.nproc_per_node, "the number of ranks per node (at least 1)");
  options.nnodes = launcher::parse_int_flag("--nnodes", flags.nnodes, "the number of nodes (at least 1)");
  options.node_rank = launcher::parse_int_flag("--node_rank", flags.node_rank, "this node's index, 0..nnodes-1");
  options.master_addr = flags.master_addr;
  std::string port = flags.master_port;
  if (!flags.rdzv_endpoint.empty()) {
    // torchrun's HOST[:PORT] form (IPv6 in brackets); it names node 0 as
    // --master_addr / --master_port do, so only one of the two forms.
    if (!flags.master_addr.empty() || !flags.master_port.empty()) {
      throw ConfigError(fmt::format("--rdzv_endpoint {} and --master_addr / --master_port both name node 0; give one "
                                    "of the two forms",
                                    flags.rdzv_endpoint));
    }
    const std::string& endpoint = flags.rdzv_endpoint;
    const size_t bracket = endpoint.rfind(']');
    const size_t colon = endpoint.rfind(':');
    const bool has_port = colon != std::string::npos && (bracket == std::string::npos || colon > bracket) &&
                          (bracket != std::string::npos || endpoint.find(':') == colon);
    std::string host = has_port ? endpoint.substr(0, colon) : endpoint;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host.empty()) {
      throw ConfigError(fmt::format("--rdzv_endpoint '{}' names no host; use HOST[:PORT], e.g. node-a:29500", endpoint));
    }
    options.master_addr = host;
    if (has_port) port = endpoint.substr(colon + 1);
  }
  if (!port.empty()) {
    options.master_port = launcher::parse_int_flag("--master_port", port, "a TCP port, 1..65535");
  }
  options.hostfile = flags.hostfile;
  for (const auto& item : flags.include) {
    for (auto& name : launcher::split_host_list(item)) options.include.push_back(name);
  }
  for (const auto& item : flags.exclude) {
    for (auto& name : launcher::split_host_list(item)) options.exclude.push_back(name);
  }
  options.backend = flags.backend;
  options.exit_timeout_s = launcher::parse_seconds_flag("--exit_timeout", flags.exit_timeout);
  options.dry_run = flags.dry_run;
  options.watch_stdin = flags.watch_stdin;
  options.command = flags.command;
  return options;
}

int report_usage_error(const char* command, const ConfigError& error) {
  std::fprintf(stderr, "colossus %s: error: %s\n", command, error.what());
  return kUsageExitCode;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto* run = app.add_subcommand(
      "run", "Start PROGRAM as N ranks per node: with the torchrun env on GPUs (nccl), through mpirun on CPUs (mpi)");
  auto flags = std::make_shared<RunFlags>();
  // torchrun's hyphenated spellings are accepted beside ours.
  run->add_option("-n,--nproc_per_node,--nproc-per-node", flags->nproc_per_node, "ranks per node (default 1)")
      ->type_name("INT");
  run->add_option("--nnodes", flags->nnodes, "number of nodes (default 1)")->type_name("INT");
  run->add_option("--node_rank,--node-rank", flags->node_rank, "index of this node, 0..nnodes-1 (default 0)")
      ->type_name("INT");
  run->add_option("--master_addr,--master-addr", flags->master_addr, "address of node 0 (default 127.0.0.1)")
      ->type_name("HOST");
  run->add_option("--master_port,--master-port", flags->master_port, "port on node 0 (default: a free port)")
      ->type_name("PORT");
  run->add_option("--rdzv_endpoint,--rdzv-endpoint", flags->rdzv_endpoint,
                  "node 0 as HOST[:PORT] (torchrun's form of --master_addr / --master_port)")
      ->type_name("HOST:PORT");
  run->add_option("--hostfile", flags->hostfile, "nodes to run on: lines 'host [slots=N]' or 'host:N'")
      ->type_name("FILE");
  // One value per use (repeatable), so a following PROGRAM is not taken as a host.
  for (auto [flag, names, help] :
       {std::tuple{"--include", &flags->include, "only these hostfile hosts (comma-separated)"},
        std::tuple{"--exclude", &flags->exclude, "skip these hostfile hosts (comma-separated)"}}) {
    run->add_option(flag, *names, help)
        ->type_name("HOSTS")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->allow_extra_args(false);
  }
  run->add_option("--backend", flags->backend, "auto (nccl with a GPU, else mpi), nccl or mpi")->type_name("NAME");
  run->add_option("--exit_timeout,--exit-timeout", flags->exit_timeout,
                  "once a rank exited 0, kill ranks still running after this many seconds (default 300, 0: never)")
      ->type_name("SECONDS");
  run->add_flag("--dry_run,--dry-run", flags->dry_run, "print what would be started per node or rank, start nothing");
  // Internal: per-node launchers of a hostfile job stop when their stdin closes.
  run->add_flag("--watch_stdin", flags->watch_stdin)->group("");
  run->add_option("PROGRAM", flags->command, "the program and its arguments (passed on unparsed)")->expected(-1);
  run->positionals_at_end(true);
  run->footer(
      "Example: colossus run -n 4 ./train --config cfg.toml\n"
      "Each rank's output lines are prefixed [rN]. See docs/launcher.md.");
  return {run, [flags] {
            try {
              return launcher::run_job(to_options(*flags));
            } catch (const ConfigError& error) {
              return report_usage_error("run", error);
            }
          }};
}

Command add_rank_command(CLI::App& app) {
  auto* rank = app.add_subcommand("_rank", "internal: runs one rank under the mpirun that `colossus run` starts");
  rank->group("");  // hidden from --help
  auto command = std::make_shared<std::vector<std::string>>();
  rank->add_option("PROGRAM", *command, "the program and its arguments")->expected(-1);
  rank->positionals_at_end(true);
  return {rank, [command] {
            try {
              return launcher::run_rank_wrapper(*command);
            } catch (const ConfigError& error) {
              return report_usage_error("_rank", error);
            }
          }};
}

}  // namespace colossus::cli
