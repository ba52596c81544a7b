// Gemini's NVMe offload of optimizer state: with every chunk's optimizer side
// on the host and half of those chunks' moments in files between steps, the
// loss curve is the in-memory offload curve exactly over 20 steps, each
// offloaded chunk has its file with exactly its moments' bytes, host
// optimizer memory drops by those bytes, and a checkpoint taken mid-run
// resumes on the same curve.
#include <gtest/gtest.h>

#include <filesystem>

#include "colossus/zero/gemini/gemini_optimizer.h"
#include "tests/testing/testing.h"
#include "tests/zero/zero_testing.h"

using namespace colossus;
using namespace colossus::zero::testing;
namespace ct = colossus::testing;
namespace bt = colossus::booster::testing;
namespace fs = std::filesystem;

TEST(NvmeOffload, CurveEqualsInMemoryOffloadAndFilesHoldTheMoments) {
  bt::SharedScratch scratch("nvme");
  const RunSpec host{.model = "gpt2", .plugin = "gemini", .max_norm = 0.5, .offload_optim_frac = 1.0};
  RunSpec nvme = host;
  nvme.nvme_offload_fraction = 0.5;
  nvme.nvme_offload_dir = scratch.path("nvme");

  ZeroRun in_memory(host);
  const auto expected = in_memory.train(0, bt::kSteps);
  ZeroRun run(nvme);
  auto got = run.train(0, 10);
  run.save(scratch.path("step10"));
  const auto tail = run.train(10, bt::kSteps);
  got.insert(got.end(), tail.begin(), tail.end());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "step " << i;

  auto& gemini = dynamic_cast<zero::gemini::GeminiOptimizer&>(*run.boosted().optimizer);
  auto& reference = dynamic_cast<zero::gemini::GeminiOptimizer&>(*in_memory.boosted().optimizer);
  ASSERT_FALSE(gemini.nvme_chunks().empty());
  int64_t file_bytes = 0;
  for (size_t c : gemini.nvme_chunks()) {
    int64_t expected_bytes = 0;  // AdamW: exp_avg and exp_avg_sq, fp32, of this rank's part
    for (size_t k : gemini.ddp().chunks()[c].layout.params) expected_bytes += 2 * 4 * gemini.ddp().layout().slots[k].own_numel;
    const std::string path = gemini.nvme_file(c);
    ASSERT_TRUE(fs::exists(path)) << path;
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), expected_bytes) << path;
    file_bytes += expected_bytes;
  }
  const auto with_files = gemini.memory_bytes(), without = reference.memory_bytes();
  EXPECT_EQ(with_files.optim_nvme, file_bytes);
  EXPECT_EQ(with_files.optim_host + with_files.optim_nvme, without.optim_host);
  EXPECT_LT(with_files.optim_host, without.optim_host);
  if (ct::world()->rank() == 0) {
    std::printf("nvme offload (%d rank(s), %zu of %zu chunks): optimizer state on host %.1f KiB -> %.1f KiB, %.1f KiB in files\n",
                ct::world()->size(), gemini.nvme_chunks().size(), gemini.ddp().chunks().size(),
                without.optim_host / 1024.0, with_files.optim_host / 1024.0, with_files.optim_nvme / 1024.0);
  }

  // Resumed from the step-10 checkpoint into a fresh NVMe run: the same curve.
  ZeroRun resumed(nvme);
  resumed.load(scratch.path("step10"));
  const auto again = resumed.train(10, bt::kSteps);
  for (size_t i = 0; i < again.size(); ++i) EXPECT_EQ(again[i], expected[10 + i]) << "resumed step " << 10 + i;
  bt::barrier();
}
