// ZeRO checkpoints reshard: a ZeRO-2 run saved after 10 of 20 steps resumes
// with the same layout (exactly), with ZeRO-1 on one rank, with ZeRO-2 on
// twice the ranks, and under DDP, and a DDP checkpoint resumes under ZeRO,
// each continuing the uninterrupted loss curve (1e-5 relative where the
// layouts differ, rounding only). The model directory is a plain HF one.
// CTest runs it on 1, 2 and 4 MPI ranks.
#include "colossus/checkpoint/safetensors.h"
#include "tests/testing/testing.h"
#include "tests/zero/zero_testing.h"

#include <gtest/gtest.h>

#include <filesystem>

using namespace colossus;
using namespace colossus::zero::testing;
namespace ct = colossus::testing;
namespace bt = colossus::booster::testing;

namespace {

constexpr int64_t kSaveAt = 10;

void expect_continues(const std::vector<double>& resumed, const std::vector<double>& uninterrupted, double tolerance,
                      const std::string& what) {
  ASSERT_EQ(resumed.size(), static_cast<size_t>(bt::kSteps - kSaveAt));
  std::vector<double> tail(uninterrupted.begin() + kSaveAt, uninterrupted.end());
  const double worst = worst_rel_diff(resumed, tail);
  EXPECT_LE(worst, tolerance) << what;
  if (ct::world()->rank() == 0) {
    std::printf("%s, %d rank(s): max rel diff vs uninterrupted %.2e\n", what.c_str(), ct::world()->size(), worst);
  }
}

}  // namespace

TEST(ZeroCheckpoint, Zero2CheckpointReshardsAcrossRanksAndIntoDdp) {
  bt::SharedScratch scratch("zero_ckpt");
  const RunSpec spec{.model = "llama", .stage = 2, .micro_batches = 2, .max_norm = 0.5};
  const auto uninterrupted = ZeroRun(spec).train(0, bt::kSteps);
  const std::string dir = scratch.path("zero2");
  {
    ZeroRun saver(spec);
    saver.train(0, kSaveAt);
    saver.save(dir);
  }
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dir) / "config.json"));
  // A Hugging Face directory with whole tensors and the optimizer state unsharded.
  const auto model_state = checkpoint::load_state_dict(dir);
  EXPECT_EQ(model_state.at("model.embed_tokens.weight").sizes(), (std::vector<int64_t>{96, 32}));
  const auto optimizer_state = checkpoint::load_state_dict(dir, "optimizer");
  EXPECT_EQ(optimizer_state.at("state.0.exp_avg").sizes(), (std::vector<int64_t>{96, 32}));

  {  // Same layout: bit for bit.
    ZeroRun same(spec);
    same.load(dir);
    const auto resumed = same.train(kSaveAt, bt::kSteps);
    for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], uninterrupted[kSaveAt + i]) << "step " << i;
  }
  {  // ZeRO-1 on each rank alone.
    auto self = ct::world()->split(ct::world()->rank(), 0, "self");
    RunSpec one = spec;
    one.stage = 1;
    ZeroRun alone(one, self);
    alone.load(dir);
    expect_continues(alone.train(kSaveAt, bt::kSteps), uninterrupted, 1e-5, "zero-2 -> zero-1 on 1 rank");
  }
  {  // Plain DDP.
    RunSpec ddp = spec;
    ddp.plugin = "ddp";
    ZeroRun run(ddp);
    run.load(dir);
    expect_continues(run.train(kSaveAt, bt::kSteps), uninterrupted, 1e-5, "zero-2 -> ddp");
  }
  {  // DDP's checkpoint into ZeRO-1.
    RunSpec ddp = spec;
    ddp.plugin = "ddp";
    const std::string ddp_dir = scratch.path("ddp");
    {
      ZeroRun saver(ddp);
      saver.train(0, kSaveAt);
      saver.save(ddp_dir);
    }
    RunSpec zero1 = spec;
    zero1.stage = 1;
    ZeroRun run(zero1);
    run.load(ddp_dir);
    expect_continues(run.train(kSaveAt, bt::kSteps), uninterrupted, 1e-5, "ddp -> zero-1");
  }
}

// Saved by ZeRO-2 on half the ranks, loaded by all of them (N -> 2N).
TEST(ZeroCheckpoint, Zero2OnHalfTheRanksLoadsOnAll) {
  const int world = ct::world()->size();
  if (world < 2) GTEST_SKIP() << "needs 2 ranks or more";
  bt::SharedScratch scratch("zero_half");
  const RunSpec spec{.model = "gpt2", .stage = 2, .optimizer = "lamb"};
  const auto uninterrupted = ZeroRun(spec).train(0, bt::kSteps);
  const int half = ct::world()->rank() / (world / 2);
  auto group = ct::world()->split(half, 0, "half");
  {
    ZeroRun saver(spec, group);
    saver.train(0, kSaveAt);
    saver.save(scratch.path("half" + std::to_string(half)));
  }
  bt::barrier();
  ZeroRun all(spec);
  all.load(scratch.path("half0"));
  expect_continues(all.train(kSaveAt, bt::kSteps), uninterrupted, 1e-5, "zero-2 lamb on half -> all ranks");
}

// bf16: the masters travel in MixedPrecisionOptimizer's format, so DDP bf16 resumes them.
TEST(ZeroCheckpoint, Bf16MastersResumeUnderDdp) {
  bt::SharedScratch scratch("zero_bf16");
  const RunSpec spec{.model = "gpt2", .stage = 2, .precision = "bf16"};
  const auto uninterrupted = ZeroRun(spec).train(0, bt::kSteps);
  {
    ZeroRun saver(spec);
    saver.train(0, kSaveAt);
    saver.save(scratch.path("bf16"));
  }
  const auto optimizer_state = checkpoint::load_state_dict(scratch.path("bf16"), "optimizer");
  EXPECT_EQ(optimizer_state.at("master.0").scalar_type(), at::kFloat);
  RunSpec ddp = spec;
  ddp.plugin = "ddp";
  ZeroRun run(ddp);
  run.load(scratch.path("bf16"));
  expect_continues(run.train(kSaveAt, bt::kSteps), uninterrupted, 2e-2, "zero-2 bf16 -> ddp bf16");
}
