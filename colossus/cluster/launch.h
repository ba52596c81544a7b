// launch_from_env: reads where this process sits in the job (torchrun /
// colossus run, SLURM, or OpenMPI variables), creates the default process
// group on the right backend, and sets the device and the seed.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/core/env.h"

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace colossus::cluster {

struct LaunchInfo {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // torchrun | slurm | openmpi | single
};

// Throws LaunchError naming missing or contradictory variables.
LaunchInfo read_launch_info(const EnvLookup& env);
// First host of a SLURM node list: "gpu[03-05,9],cpu1" -> "gpu03".
std::string first_slurm_host(const std::string& nodelist);

struct ClusterOptions {
  std::string backend = "auto";  // auto | nccl | mpi
  std::optional<uint64_t> seed = 1024;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
};

struct Cluster {
  LaunchInfo info;
  std::string backend;
  c10::Device device = c10::Device(c10::kCPU);
  ProcessGroupPtr world;
};

// Idempotent: the first call sets the job up, later calls return the same
// Cluster (and refuse different options).
const Cluster& launch_from_env(const ClusterOptions& options = {});
// The Cluster made by launch_from_env; throws if it has not run.
const Cluster& current_cluster();

// Ends the job's communication: shuts every backend down (NCCL communicators
// are destroyed while CUDA is still up). Call it at the end of main, as
// torch's destroy_process_group; it also runs at exit. Idempotent.
void finalize();

// Backends register themselves (MPI here, NCCL from the CUDA library).
using BackendFactory = std::function<ProcessGroupPtr(const LaunchInfo&, const ClusterOptions&)>;
struct BackendEntry {
  BackendFactory create;
  std::function<bool()> available;
};
void register_backend(const std::string& name, BackendEntry entry);
std::vector<std::string> registered_backends();
bool backend_available(const std::string& name);
// "auto" -> nccl when it is available (GPU present), else mpi.
std::string resolve_backend(const std::string& requested);

}  // namespace colossus::cluster
