// Gemini's NVMe offload of optimizer state: with every chunk's optimizer side
// on the host and half of those chunks' moments in files between steps, the
// loss curve is the in-memory offload curve exactly over 20 steps, each
// offloaded chunk has its file with exactly its moments' bytes (the tail
// padded for O_DIRECT), host optimizer memory drops by those bytes, and a
// checkpoint taken mid-run resumes on the same curve. With O_DIRECT and with
// buffered IO the curve is the same and the store allocates no buffer after
// the first steps; the store itself falls back to buffered IO with one
// logged line where O_DIRECT is refused.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <string>
#include <vector>

#include "colossus/cluster/logger.h"
#include "colossus/zero/gemini/gemini_optimizer.h"
#include "colossus/zero/gemini/nvme_store.h"
#include "tests/testing/testing.h"
#include "tests/zero/zero_testing.h"

using namespace colossus;
using namespace colossus::zero::testing;
namespace ct = colossus::testing;
namespace bt = colossus::booster::testing;
namespace fs = std::filesystem;
using colossus::zero::gemini::NvmeStore;

namespace {

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Whether the filesystem of `dir` takes O_DIRECT (tmpfs did not before Linux 6.6).
bool takes_direct_io(const std::string& dir) {
  fs::create_directories(dir);
  const std::string probe = (fs::path(dir) / "direct_io_probe").string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
  fs::remove(probe);
  return fd >= 0;
}

}  // namespace

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
  int64_t moment_bytes = 0;
  for (size_t c : gemini.nvme_chunks()) {
    // AdamW: exp_avg and exp_avg_sq, fp32, of this rank's part, each at a
    // 64-byte offset; the file's tail padded to 4 KiB (O_DIRECT).
    int64_t offset = 0;
    for (size_t k : gemini.ddp().chunks()[c].layout.params) {
      const int64_t bytes = 4 * gemini.ddp().layout().slots[k].own_numel;
      for (int moment = 0; moment < 2; ++moment) offset = round_up(offset, 64) + bytes;
      moment_bytes += 2 * bytes;
    }
    const std::string path = gemini.nvme_file(c);
    ASSERT_TRUE(fs::exists(path)) << path;
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), round_up(offset, 4096)) << path;
  }
  const auto with_files = gemini.memory_bytes(), without = reference.memory_bytes();
  EXPECT_EQ(with_files.optim_nvme, moment_bytes);
  EXPECT_GT(with_files.nvme_buffers_host, 0);
  EXPECT_EQ(with_files.host_total() - with_files.nvme_buffers_host + with_files.optim_nvme, without.host_total());
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

// The IO paths end to end: O_DIRECT (where the scratch filesystem takes it)
// and buffered IO train the in-memory offload curve exactly, and after the
// first steps (which size the pool) the store allocates no buffer: at most
// three, each the largest file, are kept between steps.
TEST(NvmeOffload, DirectAndBufferedIoTrainTheCurveOnBuffersKeptBetweenSteps) {
  bt::SharedScratch scratch("nvme_io");
  const RunSpec host{.model = "gpt2", .plugin = "gemini", .max_norm = 0.5, .offload_optim_frac = 1.0};
  ZeroRun in_memory(host);
  const auto expected = in_memory.train(0, bt::kSteps);
  for (const bool direct : {true, false}) {
    RunSpec nvme = host;
    nvme.nvme_offload_fraction = 1.0;
    nvme.nvme_offload_dir = scratch.path(direct ? "direct" : "buffered");
    nvme.nvme_direct_io = direct;
    const bool direct_expected = direct && takes_direct_io(nvme.nvme_offload_dir);
    ZeroRun run(nvme);
    auto got = run.train(0, 2);
    auto& gemini = dynamic_cast<zero::gemini::GeminiOptimizer&>(*run.boosted().optimizer);
    const NvmeStore* store = gemini.nvme_store();
    ASSERT_NE(store, nullptr);
    const int64_t allocations = store->buffer_allocations();
    EXPECT_GT(allocations, 0);
    const auto tail = run.train(2, bt::kSteps);
    got.insert(got.end(), tail.begin(), tail.end());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << (direct ? "direct" : "buffered") << " step " << i;
    EXPECT_EQ(store->buffer_allocations(), allocations) << "no buffer allocated after step 2";
    int64_t largest_file = 0;
    for (size_t c : gemini.nvme_chunks()) {
      largest_file = std::max(largest_file, static_cast<int64_t>(fs::file_size(gemini.nvme_file(c))));
    }
    EXPECT_LE(store->buffer_bytes(), 3 * largest_file);
    EXPECT_EQ(store->direct_io(), direct_expected) << nvme.nvme_offload_dir;
    if (ct::world()->rank() == 0) {
      std::printf("nvme offload, %s IO (%d rank(s)): %lld buffer allocation(s), %.1f KiB kept between steps\n",
                  store->direct_io() ? "O_DIRECT" : "buffered", ct::world()->size(),
                  static_cast<long long>(allocations), store->buffer_bytes() / 1024.0);
    }
  }
  bt::barrier();
}

// The store alone, on each rank's own directory: groups of odd sizes go out
// and come back bit for bit over several rounds, each file padded to 4 KiB,
// with O_DIRECT where the filesystem takes it; where O_DIRECT is refused
// (forced here: EINVAL at every O_DIRECT open, as on a filesystem without
// it) the store goes on with buffered IO after one logged line.
TEST(NvmeOffload, StoreRoundTripsAndFallsBackToBufferedIoWithOneLine) {
  bt::SharedScratch scratch("nvme_store");
  for (const bool refused : {false, true}) {
    const std::string dir = scratch.path(fmt::format("rank{}_{}", ct::world()->rank(), refused ? "refused" : "direct"));
    const bool direct_expected = !refused && takes_direct_io(dir);
    std::vector<std::string> lines;
    cluster::Logger::set_sink([&lines](const std::string& line) { lines.push_back(line); });
    {
      NvmeStore store(dir, "test", {.refuse_direct_io_for_testing = refused});
      std::vector<std::vector<at::Tensor>> groups, originals;
      for (int64_t g = 0; g < 3; ++g) {  // 8, 12 and 20 KiB files
        groups.push_back({at::randn({1000 + 1500 * g}), at::arange(77 + g, at::kDouble), at::empty({0})});
        originals.push_back({groups.back()[0].clone(), groups.back()[1].clone(), groups.back()[2]});
      }
      int64_t allocations = 0;
      for (int round = 0; round < 4; ++round) {
        for (size_t g = 0; g < groups.size(); ++g) store.write_async(g, groups[g]);
        store.wait_all();
        for (const auto& group : groups) {
          for (const auto& t : group) EXPECT_EQ(t.storage().nbytes(), 0u) << "emptied in place";
        }
        for (size_t g = 0; g < groups.size(); ++g) {
          EXPECT_EQ(static_cast<int64_t>(fs::file_size(store.path(g))), NvmeStore::file_bytes(groups[g]));
          EXPECT_EQ(NvmeStore::file_bytes(groups[g]) % NvmeStore::kIoAlignment, 0);
          store.read_async(g, groups[g]);  // all three in memory at once: the pool's size
        }
        store.wait_all();
        for (size_t g = 0; g < groups.size(); ++g) {
          for (size_t i = 0; i < groups[g].size(); ++i) {
            EXPECT_TRUE(at::equal(groups[g][i], originals[g][i])) << "round " << round << " group " << g;
          }
          groups[g][0].add_(1.0);  // the optimizer's update in place
          originals[g][0].add_(1.0);
        }
        if (round == 1) allocations = store.buffer_allocations();
      }
      EXPECT_EQ(store.buffer_allocations(), allocations) << "the buffers are kept between rounds";
      // State made anew for a parameter that had none: groups grow between
      // their read and their write. A tensor in front shifts the others
      // inside their buffer; one past the largest file takes a larger buffer.
      groups[1].insert(groups[1].begin(), at::randn({16}));
      originals[1].insert(originals[1].begin(), groups[1].front().clone());
      groups[0].push_back(at::randn({6000}));
      originals[0].push_back(groups[0].back().clone());
      for (size_t g = 0; g < groups.size(); ++g) store.write_async(g, groups[g]);
      store.wait_all();
      for (size_t g = 0; g < groups.size(); ++g) store.read_async(g, groups[g]);
      store.wait_all();
      for (size_t g = 0; g < groups.size(); ++g) {
        for (size_t i = 0; i < groups[g].size(); ++i) {
          EXPECT_TRUE(at::equal(groups[g][i], originals[g][i])) << "grown group " << g << " tensor " << i;
        }
      }
      EXPECT_EQ(store.direct_io(), direct_expected);
    }
    cluster::Logger::set_sink(nullptr);
    const auto fallbacks = std::count_if(lines.begin(), lines.end(), [](const std::string& line) {
      return line.find("O_DIRECT") != std::string::npos;
    });
    EXPECT_EQ(fallbacks, refused ? 1 : 0) << "one line for the fallback";
  }
  bt::barrier();
}
