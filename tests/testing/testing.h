// Helpers shared by the tests: the MPI world for multi-rank tests (started by
// CTest through mpirun), and a gtest main that fails fast on any rank so a
// failed assertion never leaves the other ranks hanging in a collective.
#pragma once
#include "colossus/cluster/launch.h"
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <string>

namespace colossus::testing {

// The job's world group over MPI (launch_from_env with backend "mpi").
cluster::ProcessGroupPtr world();

// Runs all tests; on the first failure on any rank prints it with the rank and
// aborts the whole job (non-zero exit), instead of hanging the others.
int run_all_tests(int argc, char** argv);

// One scratch directory for every rank of the job: rank 0 makes it with
// mkdtemp (`<tmp>/colossus_<area>_XXXXXX`, mode 0700) and broadcasts its name,
// so no rank writes under a name another user could predict. Collective the
// first time an area is asked for; removed by rank 0 at exit (unless
// COLOSSUS_KEEP_TEST_FILES is set).
const std::filesystem::path& job_scratch_dir(const std::string& area);

// max |a-b| / max(|b|, tiny): the relative error used by equivalence tests.
double max_rel_diff(const at::Tensor& a, const at::Tensor& b);

}  // namespace colossus::testing
