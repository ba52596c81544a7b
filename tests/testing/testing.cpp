#include "tests/testing/testing.h"

#include "colossus/cluster/mpi_backend.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>

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

namespace {

struct JobScratchDir {
  std::filesystem::path path;
  bool owner = false;
  ~JobScratchDir() {
    if (!owner || std::getenv("COLOSSUS_KEEP_TEST_FILES") != nullptr) return;
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

const std::filesystem::path& job_scratch_dir(const std::string& area) {
  static std::map<std::string, std::unique_ptr<JobScratchDir>> dirs;
  auto& dir = dirs[area];
  if (dir) return dir->path;
  auto group = world();
  constexpr int64_t kMaxPath = 512;
  at::Tensor name = at::zeros({kMaxPath}, at::kLong);
  if (group->rank() == 0) {
    std::string pattern = (std::filesystem::temp_directory_path() / ("colossus_" + area + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr || static_cast<int64_t>(pattern.size()) >= kMaxPath) {
      throw std::runtime_error("mkdtemp failed for " + pattern);
    }
    int64_t* chars = name.data_ptr<int64_t>();
    for (size_t i = 0; i < pattern.size(); ++i) chars[i] = static_cast<unsigned char>(pattern[i]);
  }
  group->broadcast(name, 0).wait();
  std::string path;
  const int64_t* chars = name.data_ptr<int64_t>();
  for (int64_t i = 0; i < kMaxPath && chars[i] != 0; ++i) path += static_cast<char>(chars[i]);
  dir = std::make_unique<JobScratchDir>(JobScratchDir{.path = path, .owner = group->rank() == 0});
  return dir->path;
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  auto diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  auto scale = b.to(at::kDouble).abs().max().item<double>();
  return diff / std::max(scale, 1e-30);
}

}  // namespace colossus::testing
