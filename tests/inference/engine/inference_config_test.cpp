// InferenceConfig's gpu_memory_utilization check, and kv_pool_bytes: the KV
// pool's bytes under vLLM's gpu_memory_utilization (a share of the device's
// total memory) or kv_cache_memory_fraction (a share of what is free), on
// made-up device figures, so no GPU is needed.
#include "colossus/core/errors.h"
#include "colossus/inference/engine/inference_config.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace colossus::inference {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kBlock = kMiB;        // bytes of one KV block
constexpr int64_t kActivations = kGiB;  // one step's headroom

// An 80 GiB card after loading a 2 GiB model: the allocator holds 3 GiB (1
// GiB of it cached, unused), CUDA's context 0.5 GiB, `others` GiB belong to
// other processes.
metrics::DeviceMemory card(double others = 0) {
  const auto other_bytes = static_cast<int64_t>(others * static_cast<double>(kGiB));
  return {.allocated_bytes = 2 * kGiB,
          .reserved_bytes = 3 * kGiB,
          .free_bytes = 80 * kGiB - 3 * kGiB - kGiB / 2 - other_bytes,
          .total_bytes = 80 * kGiB};
}

InferenceConfig with_utilization(double share) {
  InferenceConfig config;
  config.gpu_memory_utilization = share;
  return config;
}

std::string error_of(const InferenceConfig& config, const metrics::DeviceMemory& memory) {
  try {
    kv_pool_bytes(config, memory, kActivations, kBlock);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(InferenceConfig, GpuMemoryUtilizationMustBeAShareUpToOne) {
  for (const double bad : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    try {
      with_utilization(bad).validate();
      ADD_FAILURE() << "gpu_memory_utilization " << bad << " was accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(fmt::format("gpu_memory_utilization is {};", bad)), std::string::npos) << what;
      EXPECT_NE(what.find("(0, 1]"), std::string::npos) << what;
    }
  }
  EXPECT_NO_THROW(with_utilization(1.0).validate());
  EXPECT_NO_THROW(with_utilization(0.05).validate());
  EXPECT_NO_THROW(InferenceConfig{}.validate());  // unset: kv_cache_memory_fraction sizes the pool
}

TEST(KvPoolBytes, UtilizationIsAShareOfTotalMemoryLessTheModelAndActivations) {
  // 0.75 x 80 GiB = 60 GiB for everything: 2 GiB of weights, 1 GiB of headroom, 57 GiB of KV cache.
  EXPECT_EQ(kv_pool_bytes(with_utilization(0.75), card(), kActivations, kBlock), 57 * kGiB);
  // A quarter more of the card is a quarter of the total more (not of the free memory).
  EXPECT_EQ(kv_pool_bytes(with_utilization(0.5), card(), kActivations, kBlock), 37 * kGiB);
  // Unset: kv_cache_memory_fraction of the reusable memory (free 76.5 + cached 1 GiB), less the headroom.
  InferenceConfig fraction;
  fraction.kv_cache_memory_fraction = 0.5;
  EXPECT_EQ(kv_pool_bytes(fraction, card(), kActivations, kBlock), 151 * kGiB / 4);  // 38.75 - 1 GiB
}

TEST(KvPoolBytes, RefusesAShareThatOtherProcessesHold) {
  // 45 GiB used elsewhere: 31.5 + 1 GiB reusable; 0.9 would want 69 GiB of KV cache.
  const std::string what = error_of(with_utilization(0.9), card(45));
  EXPECT_NE(what.find("gpu_memory_utilization 0.9 asks for"), std::string::npos) << what;
  EXPECT_NE(what.find("at most 0.43"), std::string::npos) << what;  // (32.5 + 2) / 80 = 0.431
  // The share it suggests is accepted, and leaves the free memory less the headroom at most.
  const int64_t bytes = kv_pool_bytes(with_utilization(0.43), card(45), kActivations, kBlock);
  EXPECT_GT(bytes, 30 * kGiB);
  EXPECT_LE(bytes, 32 * kGiB + kGiB / 2 - kActivations);
}

TEST(KvPoolBytes, RefusesAShareThatLeavesNoBlockAndSaysWhatToRaise) {
  // 0.03 x 80 GiB = 2.4 GiB: less than the weights and the headroom.
  const std::string what = error_of(with_utilization(0.03), card());
  EXPECT_NE(what.find("gpu_memory_utilization 0.03 of the GPU's 80.00 GiB leaves no room for the KV cache"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("2.00 GiB of weights"), std::string::npos) << what;
  EXPECT_NE(what.find("raise gpu_memory_utilization to at least 0.04"), std::string::npos) << what;
  EXPECT_GE(kv_pool_bytes(with_utilization(0.04), card(), kActivations, kBlock), kBlock);
  // The kv_cache_memory_fraction path keeps its own message.
  InferenceConfig fraction;
  fraction.kv_cache_memory_fraction = 0.01;
  EXPECT_NE(error_of(fraction, card()).find("no device memory is left for the KV cache"), std::string::npos);
}

}  // namespace
}  // namespace colossus::inference
