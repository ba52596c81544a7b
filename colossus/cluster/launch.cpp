#include "colossus/cluster/launch.h"

#include "colossus/cluster/logger.h"
#include "colossus/cluster/mpi_backend.h"
#include "colossus/core/errors.h"

#include <ATen/Context.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace colossus::cluster {

namespace {

int parse_int(const std::string& name, const std::string& value) {
  try {
    size_t used = 0;
    int parsed = std::stoi(value, &used);
    if (used != value.size()) throw std::invalid_argument("trailing");
    return parsed;
  } catch (...) {
    throw LaunchError(fmt::format("environment variable {}='{}' is not an integer", name, value));
  }
}

std::optional<int> get_int(const EnvLookup& env, const std::string& name) {
  auto value = env(name);
  if (!value) return std::nullopt;
  return parse_int(name, *value);
}

void check_range(const char* rank_name, int rank, const char* size_name, int size) {
  if (size < 1) throw LaunchError(fmt::format("{}={} must be at least 1", size_name, size));
  if (rank < 0 || rank >= size) {
    throw LaunchError(fmt::format("{}={} is outside 0..{} ({}={})", rank_name, rank, size - 1, size_name, size));
  }
}

std::map<std::string, BackendEntry>& registry() {
  static std::map<std::string, BackendEntry> entries;
  return entries;
}

ProcessGroupPtr create_mpi(const LaunchInfo& info, const ClusterOptions&) {
  if (info.world_size > 1 && !launched_by_mpi()) {
    throw LaunchError(fmt::format(
        "WORLD_SIZE={} but this process was not started by an MPI launcher, which the CPU (mpi) "
        "backend needs; start it with `colossus run --nproc_per_node {} --backend mpi PROGRAM` "
        "or `mpirun -np {} PROGRAM`",
        info.world_size, info.world_size, info.world_size));
  }
  auto world = make_mpi_world_group();
  if (world->size() != info.world_size || world->rank() != info.rank) {
    throw LaunchError(fmt::format("MPI says rank {} of {}, but the launch environment says rank {} of {} ({})",
                                  world->rank(), world->size(), info.rank, info.world_size, info.source));
  }
  return world;
}

const bool mpi_registered = [] {
  register_backend("mpi", {create_mpi, [] { return true; }});
  return true;
}();

std::mutex cluster_mutex;
std::unique_ptr<Cluster> the_cluster;
ClusterOptions the_options;

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // Take the first comma-separated item at bracket depth 0.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  auto open = first.find('[');
  if (open == std::string::npos) return first;
  std::string prefix = first.substr(0, open);
  std::string range = first.substr(open + 1, first.find(']') - open - 1);
  std::string head = range.substr(0, range.find_first_of(",-"));
  return prefix + head;
}

LaunchInfo read_launch_info(const EnvLookup& env) {
  LaunchInfo info;
  auto rank = get_int(env, "RANK");
  auto world = get_int(env, "WORLD_SIZE");
  auto ompi_rank = get_int(env, "OMPI_COMM_WORLD_RANK");
  auto ompi_size = get_int(env, "OMPI_COMM_WORLD_SIZE");
  auto slurm_rank = get_int(env, "SLURM_PROCID");
  auto slurm_size = get_int(env, "SLURM_NTASKS");

  if (rank.has_value() != world.has_value()) {
    throw LaunchError(fmt::format("RANK and WORLD_SIZE must be set together (RANK is {}, WORLD_SIZE is {})",
                                  rank ? "set" : "missing", world ? "set" : "missing"));
  }
  if (rank) {
    info.source = "torchrun";
    info.rank = *rank;
    info.world_size = *world;
    info.local_rank = get_int(env, "LOCAL_RANK").value_or(*rank);
    info.local_world_size = get_int(env, "LOCAL_WORLD_SIZE").value_or(*world);
    if (ompi_rank && (*ompi_rank != *rank || ompi_size.value_or(*world) != *world)) {
      throw LaunchError(fmt::format("RANK={} WORLD_SIZE={} contradict OMPI_COMM_WORLD_RANK={} OMPI_COMM_WORLD_SIZE={}",
                                    *rank, *world, *ompi_rank, ompi_size.value_or(-1)));
    }
  } else if (ompi_rank || ompi_size) {
    if (!ompi_rank || !ompi_size) {
      throw LaunchError("OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE must be set together");
    }
    info.source = "openmpi";
    info.rank = *ompi_rank;
    info.world_size = *ompi_size;
    info.local_rank = get_int(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    info.local_world_size = get_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
  } else if (slurm_rank || slurm_size) {
    if (!slurm_rank || !slurm_size) throw LaunchError("SLURM_PROCID and SLURM_NTASKS must be set together");
    info.source = "slurm";
    info.rank = *slurm_rank;
    info.world_size = *slurm_size;
    info.local_rank = get_int(env, "SLURM_LOCALID").value_or(0);
    auto per_node = env("SLURM_NTASKS_PER_NODE");
    info.local_world_size = per_node ? parse_int("SLURM_NTASKS_PER_NODE", per_node->substr(0, per_node->find('('))) : 1;
    if (auto nodes = env("SLURM_NODELIST")) info.master_addr = first_slurm_host(*nodes);
    else if (auto nodes2 = env("SLURM_JOB_NODELIST")) info.master_addr = first_slurm_host(*nodes2);
  }
  check_range("RANK", info.rank, "WORLD_SIZE", info.world_size);
  check_range("LOCAL_RANK", info.local_rank, "LOCAL_WORLD_SIZE", info.local_world_size);
  if (info.local_world_size > info.world_size) {
    throw LaunchError(fmt::format("LOCAL_WORLD_SIZE={} exceeds WORLD_SIZE={}", info.local_world_size, info.world_size));
  }
  if (auto addr = env("MASTER_ADDR")) info.master_addr = *addr;
  if (auto port = get_int(env, "MASTER_PORT")) {
    if (*port < 1 || *port > 65535) throw LaunchError(fmt::format("MASTER_PORT={} is not a port (1..65535)", *port));
    info.master_port = *port;
  } else if (info.source == "torchrun" && info.world_size > 1 && !ompi_rank) {
    // Only NCCL rendezvous needs it; checked there with the backend named.
    info.master_port = 0;
  }
  return info;
}

void register_backend(const std::string& name, BackendEntry entry) { registry()[name] = std::move(entry); }

std::vector<std::string> registered_backends() {
  std::vector<std::string> names;
  for (const auto& [name, entry] : registry()) names.push_back(name);
  return names;
}

bool backend_available(const std::string& name) {
  auto it = registry().find(name);
  return it != registry().end() && it->second.available();
}

std::string resolve_backend(const std::string& requested) {
  // A job that mpirun started is an MPI job, GPU or not.
  if (requested == "auto") return !launched_by_mpi() && backend_available("nccl") ? "nccl" : "mpi";
  auto it = registry().find(requested);
  if (it == registry().end()) {
    throw ConfigError(fmt::format("backend '{}' is not built into this Colossus; available: auto, {}", requested,
                                  fmt::join(registered_backends(), ", ")));
  }
  if (!it->second.available()) {
    throw ConfigError(fmt::format("backend '{}' is built in but cannot run here (no GPU visible?); use --backend mpi",
                                  requested));
  }
  return requested;
}

const Cluster& launch_from_env(const ClusterOptions& options) {
  std::lock_guard<std::mutex> lock(cluster_mutex);
  if (the_cluster) {
    if (options.backend != the_options.backend && options.backend != "auto") {
      throw ConfigError(fmt::format("launch_from_env was already called with backend '{}', now '{}'",
                                    the_options.backend, options.backend));
    }
    return *the_cluster;
  }
  auto cluster = std::make_unique<Cluster>();
  cluster->info = read_launch_info(process_env());
  cluster->backend = resolve_backend(options.backend);
  Logger::set_rank(cluster->info.rank, cluster->info.world_size);
  if (cluster->backend == "nccl") {
    cluster->device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(cluster->info.local_rank));
    c10::impl::VirtualGuardImpl guard(c10::kCUDA);
    if (cluster->info.local_rank >= guard.deviceCount()) {
      throw LaunchError(fmt::format("LOCAL_RANK={} but only {} GPUs are visible on this node",
                                    cluster->info.local_rank, guard.deviceCount()));
    }
    guard.setDevice(cluster->device);
  }
  if (options.seed) at::manual_seed(*options.seed);
  cluster->world = registry().at(cluster->backend).create(cluster->info, options);
  the_options = options;
  the_cluster = std::move(cluster);
  std::atexit(finalize);
  return *the_cluster;
}

void finalize() {
  std::lock_guard<std::mutex> lock(cluster_mutex);
  try {
    shutdown_process_groups();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colossus: warning: shutting the process groups down failed: %s\n", e.what());
  }
  // At exit the CUDA runtime may already be gone, and backend destructors
  // touch it: the cluster is left to the OS rather than destroyed.
  (void)the_cluster.release();
}

const Cluster& current_cluster() {
  std::lock_guard<std::mutex> lock(cluster_mutex);
  if (!the_cluster) throw DistError("no cluster yet: call colossus::cluster::launch_from_env() first");
  return *the_cluster;
}

}  // namespace colossus::cluster
