// CPU jobs through mpirun: the launcher starts one mpirun that runs
// `colossus _rank -- PROGRAM ARGS` per rank, and supervises the ranks through
// their rank-channel connections (rank_channel.h), so output, failure, hang
// and signal handling look exactly as in env mode.
#pragma once
#include "colossus/launcher/child_process.h"
#include "colossus/launcher/fd.h"
#include "colossus/launcher/job_monitor.h"

#include <string>

namespace colossus::launcher {

struct MpiJob {
  SpawnSpec mpirun;  // mpirun with its whole command line and environment
  int world_size = 1;
  Fd listener;        // where the rank wrappers connect
  std::string token;  // what they must say in their hello
  MonitorOptions monitor;
  bool watch_stdin = false;
};

// Returns the job's exit code; the one-line report, if any, goes to stderr.
int supervise_mpi_job(MpiJob job);

}  // namespace colossus::launcher
