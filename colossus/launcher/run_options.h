// What `colossus run` was asked to do, checked in one place: every problem is
// a ConfigError naming the bad value and what would be valid (the command
// turns it into one line and exit code 2).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace colossus::launcher {

inline constexpr int kDefaultMasterPort = 29500;

struct RunOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr{};         // empty: 127.0.0.1, or the first host of the hostfile
  std::optional<int> master_port{};  // empty: a free port when node 0 runs here
  std::string hostfile{};
  std::vector<std::string> include{};  // host names; only with hostfile
  std::vector<std::string> exclude{};
  std::string backend = "auto";  // auto | nccl | mpi
  double exit_timeout_s = 300;   // hang detection after the first clean exit; 0 disables
  bool dry_run = false;
  bool watch_stdin = false;            // internal: stop when stdin closes (node launchers)
  std::vector<std::string> command{};  // PROGRAM ARGS...

  void validate() const;
};

// "--nnodes" "abc" -> ConfigError "--nnodes 'abc' is not an integer; expected <expected>".
int parse_int_flag(const std::string& flag, const std::string& text, const std::string& expected);
double parse_seconds_flag(const std::string& flag, const std::string& text);

// True when this host has an NVIDIA GPU the ranks could use: /dev/nvidia0
// exists or `nvidia-smi -L` succeeds, unless CUDA_VISIBLE_DEVICES hides all.
// Cheap on purpose: the launcher does not load CUDA.
bool gpu_visible();
// "auto" -> "nccl" with a GPU, else "mpi"; "nccl"/"mpi" as given.
std::string choose_backend(const std::string& requested);

}  // namespace colossus::launcher
