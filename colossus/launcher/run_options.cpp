#include "colossus/launcher/run_options.h"

#include "colossus/core/errors.h"
#include "colossus/launcher/child_process.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace colossus::launcher {

int parse_int_flag(const std::string& flag, const std::string& text, const std::string& expected) {
  try {
    size_t used = 0;
    int value = std::stoi(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw ConfigError(fmt::format("{} '{}' is not an integer; expected {}", flag, text, expected));
}

double parse_seconds_flag(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    double value = std::stod(text, &used);
    if (used == text.size() && std::isfinite(value)) return value;
  } catch (const std::exception&) {
  }
  throw ConfigError(fmt::format("{} '{}' is not a number of seconds; expected e.g. 300 (0 disables it)", flag, text));
}

void RunOptions::validate() const {
  if (nproc_per_node < 1) {
    throw ConfigError(
        fmt::format("--nproc_per_node {} is invalid; give the number of ranks per node (at least 1)", nproc_per_node));
  }
  // Each rank is a process with its own threads and memory: past this a typo
  // (-n 100000) would fork until the host cannot, not run a job.
  constexpr int64_t kMaxRanksPerNode = 1024;
  if (nproc_per_node > kMaxRanksPerNode) {
    throw ConfigError(fmt::format("--nproc_per_node {} is more than {} ranks on one node; give one rank per GPU "
                                  "(or a few per CPU core), and more nodes for more ranks",
                                  nproc_per_node, kMaxRanksPerNode));
  }
  if (nnodes < 1)
    throw ConfigError(fmt::format("--nnodes {} is invalid; give the number of nodes (at least 1)", nnodes));
  if (node_rank < 0 || node_rank >= nnodes) {
    throw ConfigError(fmt::format("--node_rank {} is outside 0..{} (--nnodes {})", node_rank, nnodes - 1, nnodes));
  }
  if (master_port && (*master_port < 1 || *master_port > 65535)) {
    throw ConfigError(
        fmt::format("--master_port {} is not a TCP port; give 1..65535 or omit it to get a free one", *master_port));
  }
  if (backend != "auto" && backend != "nccl" && backend != "mpi") {
    throw ConfigError(fmt::format("--backend '{}' is not supported; use auto, nccl or mpi", backend));
  }
  if (exit_timeout_s < 0) {
    throw ConfigError(
        fmt::format("--exit_timeout {:g} is negative; give seconds (0 disables hang detection)", exit_timeout_s));
  }
  if (!hostfile.empty() && (nnodes != 1 || node_rank != 0 || !master_addr.empty())) {
    throw ConfigError(
        fmt::format("--hostfile {} decides the nodes, their ranks and the master; drop "
                    "--nnodes/--node_rank/--master_addr",
                    hostfile));
  }
  if (hostfile.empty() && (!include.empty() || !exclude.empty())) {
    throw ConfigError(
        fmt::format("--{} picks hosts from a hostfile; give --hostfile too", include.empty() ? "exclude" : "include"));
  }
  if (hostfile.empty() && nnodes > 1) {
    if (master_addr.empty()) {
      throw ConfigError(
          fmt::format("--nnodes {} needs --master_addr (the address of node 0, the same on every node)", nnodes));
    }
    if (!master_port) {
      throw ConfigError(fmt::format("--nnodes {} needs --master_port (the same on every node)", nnodes));
    }
  }
  if (command.empty()) {
    throw ConfigError("no program given; usage: colossus run [OPTIONS] PROGRAM [ARGS...]");
  }
}

bool gpu_visible() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string devices = visible;
    if (devices.empty() || devices == "-1") return false;
  }
  if (::access("/dev/nvidia0", F_OK) == 0) return true;
  std::string nvidia_smi;
  try {
    nvidia_smi = resolve_program("nvidia-smi");
  } catch (const ConfigError&) {
    return false;
  }
  return runs_successfully(nvidia_smi, {"nvidia-smi", "-L"});
}

std::string choose_backend(const std::string& requested) {
  if (requested != "auto") return requested;
  return gpu_visible() ? "nccl" : "mpi";
}

}  // namespace colossus::launcher
