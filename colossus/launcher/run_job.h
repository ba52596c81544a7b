// `colossus run` from validated options to the exit code: picks the mode
// (local ranks with the torchrun env, per-node launchers from a hostfile, or
// mpirun), prints the plan with --dry_run, or runs and supervises the job.
#pragma once
#include "colossus/launcher/run_options.h"

#include <optional>
#include <string>

namespace colossus::launcher {

// Throws ConfigError for bad input (the command maps it to exit code 2) and
// LaunchError when the system refuses (fork, sockets).
int run_job(const RunOptions& options);

// MASTER_PORT for a job: the requested port, refused when it is taken and the
// master runs here; else a free port here, or the default when the master is
// another host.
int choose_master_port(const std::optional<int>& requested, bool master_is_here);

}  // namespace colossus::launcher
