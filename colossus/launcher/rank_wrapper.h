// `colossus _rank -- PROGRAM ARGS`: what each mpirun rank runs under
// `colossus run --backend mpi`. It gives the program the same environment as
// env mode (RANK, LOCAL_RANK, WORLD_SIZE, ... from OpenMPI's variables), runs
// it in its own process group, and streams its output and exit status to the
// launcher over the rank channel; it stops the program when asked to, when
// mpirun signals it, or when the launcher goes away.
#pragma once
#include "colossus/core/env.h"
#include "colossus/launcher/environment.h"

#include <string>
#include <vector>

namespace colossus::launcher {

// Where this rank sits, from OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}.
// Throws ConfigError when they are missing (not started by mpirun).
struct MpiRankPlace {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
};
MpiRankPlace read_mpi_rank_place(const EnvLookup& env);

// The program's environment: `base` plus the torchrun-style variables; the
// channel variables are removed (they are the wrapper's, not the program's).
Environment wrapped_program_environment(const Environment& base, const MpiRankPlace& place);

// Runs the wrapper; returns its exit code (0 once the status reached the launcher).
int run_rank_wrapper(const std::vector<std::string>& command);

}  // namespace colossus::launcher
