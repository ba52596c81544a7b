// Runs a set of local child processes as one job: starts them, prefixes and
// forwards their output line by line, and ends the job the way JobMonitor
// decides (failure, hang, signal). The children are ranks (env mode) or
// per-node launchers (hostfile mode, local or over ssh).
#pragma once
#include "colossus/launcher/child_process.h"
#include "colossus/launcher/job_monitor.h"

#include <string>
#include <vector>

namespace colossus::launcher {

struct LocalUnit {
  std::string id{};             // names it in messages: "2" for rank 2, "1 (host-b)" for node 1
  std::string output_prefix{};  // "[r2] " for a rank; "" for a node launcher, whose lines carry rank prefixes
  SpawnSpec spawn{};
  // Node launchers are stopped by closing their stdin: that also reaches a
  // launcher on another host through ssh, where our signals cannot.
  bool stop_by_closing_stdin = false;
};

struct SupervisorOptions {
  MonitorOptions monitor{};
  bool watch_stdin = false;  // stop quietly when our stdin closes (we are a node launcher)
};

// Returns the job's exit code; the one-line report, if any, goes to stderr.
int supervise_local_units(std::vector<LocalUnit> units, const SupervisorOptions& options);

}  // namespace colossus::launcher
