// What `colossus run` starts, worked out before anything starts, so that
// --dry_run prints exactly what a real run would execute: the environment of
// each local rank, the command per node (local or over ssh), or the mpirun
// command line.
#pragma once
#include "colossus/launcher/environment.h"
#include "colossus/launcher/hostfile.h"
#include "colossus/launcher/process_supervisor.h"
#include "colossus/launcher/run_options.h"

#include <map>
#include <string>
#include <vector>

namespace colossus::launcher {

struct JobLayout {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;

  int world_size() const { return nproc_per_node * nnodes; }
  int global_rank(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
};

// Defaults every rank gets in both modes (values the user set are kept):
// COLOSSUS_LAUNCHER=1, multicast off, and OMP_NUM_THREADS=1 when several ranks
// share a node (as torchrun does, so ranks do not oversubscribe the cores).
void add_launcher_defaults(Environment& env, int nproc_per_node);

// The variables set for one local rank: torchrun's (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) plus the launcher defaults, as they will be seen by the rank.
std::map<std::string, std::string> rank_variables(const JobLayout& layout, int local_rank, const Environment& base);

// One unit per local rank of this node, prefixed "[rN] " by global rank.
std::vector<LocalUnit> plan_local_ranks(const JobLayout& layout, const std::string& program_path,
                                        const std::vector<std::string>& command, const Environment& base);

// Where to run the per-node launchers of a hostfile job.
struct NodeLaunch {
  std::string self_path{};  // this colossus binary (assumed at the same path on every host)
  std::string cwd{};        // remote launchers start here too
  std::string ssh_path{};   // only needed when some host is not this one
};
// One unit per host: `colossus run --nnodes M --node_rank i ...` run locally
// for this host, else through `ssh -o BatchMode=yes host 'cd CWD && env ... colossus run ...'`.
std::vector<LocalUnit> plan_nodes(const RunOptions& options, const std::vector<Host>& hosts, const JobLayout& layout,
                                  const NodeLaunch& launch, const Environment& base);
// Variables a remote node launcher needs from ours (PATH, LD_LIBRARY_PATH and
// NCCL_/CUDA_/TORCH_/NVSHMEM_/OMP_/COLOSSUS_ settings); ssh would drop them.
std::map<std::string, std::string> forwarded_variables(const Environment& base);

struct MpiLaunch {
  std::string mpirun_path{};
  std::string self_path{};        // runs `_rank` on every rank
  std::string program_path{};     // PROGRAM, resolved
  std::string hostfile_path{};    // empty: all ranks on this host
  std::string channel_address{};  // host:port of our rank channel
  std::string channel_token{};
};
// mpirun's environment: `base` and the rank token, which mpirun forwards by
// name (-x NAME) so that no command line carries it.
std::vector<std::string> mpirun_environment(const Environment& base, const MpiLaunch& launch);
// mpirun's argv (argv[0] = "mpirun"): CPU-friendly transport flags, the
// launcher variables as -x NAME=VALUE (the token as -x NAME), and
// `colossus _rank -- PROGRAM ARGS`.
std::vector<std::string> mpirun_arguments(const JobLayout& layout, const MpiLaunch& launch,
                                          const std::vector<std::string>& command, const Environment& base);

// POSIX shell quoting, for dry-run output and ssh command lines.
std::string shell_quote(const std::string& word);
std::string shell_join(const std::vector<std::string>& words);

}  // namespace colossus::launcher
