#include "tests/testing/testing.h"

#include "colossus/cluster/mpi_backend.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace colossus::testing {

namespace {

class AbortOnFailure : public ::testing::EmptyTestEventListener {
 public:
  explicit AbortOnFailure(int rank, int size) : rank_(rank), size_(size) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed() || size_ == 1) return;
    std::fprintf(stderr, "[rank %d] FAILED at %s:%d\n%s\n[rank %d] aborting the job so the other ranks do not hang\n",
                 rank_, result.file_name() ? result.file_name() : "?", result.line_number(), result.summary(), rank_);
    std::fflush(stderr);
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  int rank_;
  int size_;
};

}  // namespace

cluster::ProcessGroupPtr world() { return cluster::launch_from_env({.backend = "mpi"}).world; }

int run_all_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto group = world();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (group->rank() != 0) {
    // Only rank 0 prints progress; every rank still reports its own failures.
    delete listeners.Release(listeners.default_result_printer());
  }
  listeners.Append(new AbortOnFailure(group->rank(), group->size()));
  int status = RUN_ALL_TESTS();
  group->barrier().wait();
  return status;
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  auto diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  auto scale = b.to(at::kDouble).abs().max().item<double>();
  return diff / std::max(scale, 1e-30);
}

}  // namespace colossus::testing
