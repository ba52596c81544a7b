// The memory planner's accounting (`colossus plan --memory`): model states
// per setting as the ZeRO paper counts them for bf16 with fp32 masters and
// AdamW, activations with and without checkpointing, and what fits.
#include "colossus/booster/memory_plan.h"
#include "colossus/core/errors.h"

#include <gtest/gtest.h>

#include <string>

namespace colossus::booster {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TEST(MemoryPlan, ZeroAccountingPerSettingAndWhatFits) {
  const MemoryPlanInput in{.parameters = 1'000'000'000, .layers = 16, .hidden = 2048, .seq_len = 2048,
                           .micro_batch = 8, .gpus = 8, .gpu_bytes = 80 * kGiB, .host_bytes = 500 * kGiB};
  const auto rows = plan_memory(in);
  ASSERT_EQ(rows.size(), 8u);
  const double p = 1e9, n = 8;
  EXPECT_EQ(rows[0].setting, "ddp");
  EXPECT_DOUBLE_EQ(rows[0].model_states, 16 * p);
  EXPECT_DOUBLE_EQ(rows[1].model_states, 4 * p + 12 * p / n);   // stage 1: optimizer sharded
  EXPECT_DOUBLE_EQ(rows[2].model_states, 2 * p + 14 * p / n);   // stage 2: gradients too
  EXPECT_DOUBLE_EQ(rows[3].model_states, 2 * p + 2 * p / n);    // + cpu_offload
  EXPECT_DOUBLE_EQ(rows[3].host, 14 * p);                       // masters, moments, bf16 gradient
  EXPECT_DOUBLE_EQ(rows[4].model_states, 18 * p / n);           // gemini: everything in chunks, fp32 gradient shards
  EXPECT_DOUBLE_EQ(rows[5].model_states, 2 * p / n);            // gemini, optimizer on the host
  EXPECT_DOUBLE_EQ(rows[5].host, 14 * p);
  EXPECT_EQ(rows[6].setting, "gemini placement_policy = \"auto\"");
  EXPECT_DOUBLE_EQ(rows[6].model_states, 18 * p / n) << "room for everything: auto keeps it on the GPU";
  EXPECT_DOUBLE_EQ(rows[6].host, 0);
  EXPECT_EQ(rows[7].setting, "gemini offload_optim_frac = 1.0, nvme_offload_fraction = 1.0");
  EXPECT_DOUBLE_EQ(rows[7].model_states, 2 * p / n);
  EXPECT_DOUBLE_EQ(rows[7].host, 8 * p) << "fp32 master and gradient shard; the moments in files";
  const double sbh = 2048.0 * 8 * 2048;
  EXPECT_DOUBLE_EQ(rows[0].activations, 34 * sbh * 16);
  EXPECT_DOUBLE_EQ(rows[0].activations_checkpointed, 2 * sbh * 16 + 34 * sbh);
  for (const auto& r : rows) EXPECT_TRUE(r.fits) << r.setting;

  // A 7B model on one 80 GiB GPU: plain AdamW and ZeRO without offload do
  // not fit; Gemini with the optimizer on the host does, if the host holds it.
  MemoryPlanInput big{.parameters = 7'000'000'000, .layers = 32, .hidden = 4096, .seq_len = 1024, .micro_batch = 1,
                      .gpus = 1, .gpu_bytes = 79.1 * kGiB, .host_bytes = 500 * kGiB};
  auto big_rows = plan_memory(big);
  EXPECT_FALSE(big_rows[0].fits);
  EXPECT_FALSE(big_rows[2].fits);
  EXPECT_TRUE(big_rows[5].fits);
  // auto: part of the optimizer on the GPU, the rest (14 bytes a parameter) on the host.
  EXPECT_GT(big_rows[6].host, 0);
  EXPECT_LT(big_rows[6].host, big_rows[5].host);
  EXPECT_GT(big_rows[6].model_states, big_rows[5].model_states);
  EXPECT_LE(big_rows[6].model_states + big_rows[6].activations, 0.9 * big.gpu_bytes);
  EXPECT_TRUE(big_rows[6].fits);
  // No ratio: the optimizer shards fill what 90% of the GPU leaves after the
  // parameters and the activations with 10% over them.
  EXPECT_NEAR(big_rows[6].model_states + 1.1 * big_rows[6].activations, 0.9 * big.gpu_bytes, 1.0);
  // A smaller host changes nothing: the margin is taken already.
  big.host_bytes = 64 * kGiB;
  const double roomy_auto_device = big_rows[6].model_states;
  big_rows = plan_memory(big);
  EXPECT_FALSE(big_rows[5].fits);
  EXPECT_FALSE(big_rows[5].fits_checkpointed);
  EXPECT_DOUBLE_EQ(big_rows[6].model_states, roomy_auto_device);
  // Gemini's host step sums accumulated gradients on the host in fp32 (the
  // ZeRO rows keep theirs on the GPU).
  MemoryPlanInput accumulating = in;
  accumulating.grad_accum = 4;
  const auto accumulating_rows = plan_memory(accumulating);
  EXPECT_DOUBLE_EQ(accumulating_rows[5].host, 18 * p);
  EXPECT_DOUBLE_EQ(accumulating_rows[3].host, 14 * p);

  // Checkpointing decides for long sequences.
  MemoryPlanInput longer = in;
  longer.seq_len = 32768;
  longer.gpu_bytes = 40 * kGiB;
  const auto long_rows = plan_memory(longer);
  EXPECT_FALSE(long_rows[4].fits);
  EXPECT_TRUE(long_rows[4].fits_checkpointed);
  const std::string table = format_memory_plan(longer, long_rows, "test");
  EXPECT_NE(table.find("| gemini placement_policy = \"static\" |"), std::string::npos) << table;
}

TEST(MemoryPlan, BadInputsAreRefusedByName) {
  MemoryPlanInput in{.parameters = 10, .layers = 1, .hidden = 8, .seq_len = 8, .gpus = 0, .gpu_bytes = 1, .host_bytes = 1};
  try {
    plan_memory(in);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("gpus = 0"), std::string::npos) << e.what();
  }
  in.gpus = 1;
  in.gpu_bytes = 0;
  EXPECT_THROW(plan_memory(in), ConfigError);
}

}  // namespace
}  // namespace colossus::booster
