// The Booster with DDP against one process: the loss curve of 20 AdamW steps
// with a warmup + cosine schedule equals the single-process curve on the same
// global batch (fp32, 1e-5 relative), with and without gradient accumulation,
// for GPT-2 and LLaMA (GQA); bf16 stays near fp32 with exact fp32 masters;
// precision and device negotiation with the plugin; the sharded dataloader.
// CTest runs it on 1, 2 and 4 MPI ranks.
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/clip_grad_optimizer.h"
#include "colossus/cluster/logger.h"
#include "colossus/core/errors.h"
#include "colossus/data/token_shards.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/sgd.h"
#include "tests/booster/booster_testing.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <set>

using namespace colossus;
using namespace colossus::booster::testing;
namespace ct = colossus::testing;

namespace {

std::string config_name(const models::ModelConfig& config) { return models::model_type(config); }

double worst_rel_diff(const std::vector<double>& got, const std::vector<double>& reference) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size() && i < reference.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - reference[i]) / std::abs(reference[i]));
  }
  return worst;
}

void expect_curves_close(const std::vector<double>& got, const std::vector<double>& reference, double tolerance) {
  ASSERT_EQ(got.size(), reference.size());
  for (size_t step = 0; step < got.size(); ++step) {
    EXPECT_LE(std::abs(got[step] - reference[step]) / std::abs(reference[step]), tolerance)
        << "step " << step << ": " << got[step] << " vs " << reference[step];
  }
}

// Captures log lines for the test's lifetime.
class LogCapture {
 public:
  LogCapture() {
    cluster::Logger::set_sink([this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(line);
    });
  }
  ~LogCapture() { cluster::Logger::set_sink(nullptr); }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

}  // namespace

class DDPMatchesSingleProcess : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// The headline equivalence: same seed, data and global batch give the same curve.
TEST_P(DDPMatchesSingleProcess, LossCurveFp32) {
  const auto [model_name, micro_batches] = GetParam();
  const auto config = model_name == "gpt2" ? tiny_gpt2() : tiny_llama();
  const auto reference = reference_losses(config, kSteps);
  BoostedRun run(config, {}, micro_batches);
  const auto losses = run.train(0, kSteps);
  expect_curves_close(losses, reference, 1e-5);
  EXPECT_LT(losses.back(), losses.front()) << "the run should learn something";
  if (ct::world()->rank() == 0) {
    std::printf("%s, %d micro-batch(es), %d rank(s): loss %.6f -> %.6f, max rel diff vs 1 process %.2e\n",
                config_name(config).c_str(), micro_batches, ct::world()->size(), losses.front(), losses.back(),
                worst_rel_diff(losses, reference));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DDPMatchesSingleProcess,
                         ::testing::Combine(::testing::Values("gpt2", "llama"), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_micro" + std::to_string(std::get<1>(info.param));
                         });

TEST(Booster, ClippedFp32MatchesSingleProcess) {
  const auto reference = reference_losses(tiny_gpt2(), kSteps, /*max_norm=*/0.5);
  BoostedRun run(tiny_gpt2(), {.max_norm = 0.5}, 2);
  ASSERT_NE(dynamic_cast<booster::ClipGradOptimizer*>(run.boosted().optimizer.get()), nullptr);
  expect_curves_close(run.train(0, kSteps), reference, 1e-5);
}

TEST(Booster, Bf16MastersStartExactAndCurveStaysNearFp32) {
  for (const auto& config : {tiny_gpt2(), tiny_llama()}) {
    BoostedRun run(config, {.mixed_precision = "bf16"}, 2);
    auto* mixed = dynamic_cast<amp::MixedPrecisionOptimizer*>(run.boosted().optimizer.get());
    ASSERT_NE(mixed, nullptr);
    // Masters are the fp32 init itself, not its bf16 rounding.
    auto fp32 = models::create_model(config, {.seed = 7});
    const auto expected = fp32->parameters();
    ASSERT_EQ(mixed->master_params().size(), expected.size());
    size_t differs_from_rounded = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(mixed->master_params()[i].scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(mixed->master_params()[i], expected[i])) << "master " << i;
      if (!at::equal(expected[i].to(at::kBFloat16).to(at::kFloat), expected[i])) ++differs_from_rounded;
    }
    EXPECT_GT(differs_from_rounded, 0u) << "the init should not be bf16-representable, or this checks nothing";
    for (const auto& p : run.boosted().model->unwrap().parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
    const auto losses = run.train(0, kSteps), reference = reference_losses(config, kSteps);
    expect_curves_close(losses, reference, 2e-2);
    if (ct::world()->rank() == 0) {
      std::printf("%s bf16, %d rank(s): max rel diff vs fp32 %.2e\n", config_name(config).c_str(), ct::world()->size(),
                  worst_rel_diff(losses, reference));
    }
  }
}

TEST(Booster, Fp16ScalesTheLossAndTrains) {
  BoostedRun run(tiny_gpt2(), {.mixed_precision = "fp16", .loss_scaler = {.initial_scale = 1024.0}});
  auto* mixed = dynamic_cast<amp::MixedPrecisionOptimizer*>(run.boosted().optimizer.get());
  ASSERT_NE(mixed, nullptr);
  EXPECT_EQ(mixed->loss_scale(), 1024.0);
  const auto losses = run.train(0, kSteps);
  EXPECT_EQ(mixed->skipped_steps(), 0);
  expect_curves_close(losses, reference_losses(tiny_gpt2(), kSteps), 2e-2);
}

TEST(Booster, SchedulerDrivesTheWrappedOptimizer) {
  BoostedRun run(tiny_gpt2(), {.mixed_precision = "bf16"});
  auto& optimizer = *run.boosted().optimizer;
  auto& scheduler = *run.boosted().lr_scheduler;
  EXPECT_EQ(optimizer.param_groups()[0].lr, 0.0) << "warmup starts at 0";
  run.train_step(0);
  EXPECT_EQ(optimizer.param_groups()[0].lr, scheduler.lr_at(1, 3e-3));
  EXPECT_EQ(scheduler.lr(), optimizer.param_groups()[0].lr);
  // Attaching to an optimizer with another group count is refused.
  auto other = at::zeros({2}).requires_grad_(true);
  std::vector<optim::ParamGroup> groups(2);
  groups[0].params = {other};
  groups[1].params = {at::zeros({2}).requires_grad_(true)};
  optim::SGD two_groups(groups);
  EXPECT_THROW(scheduler.attach(two_groups), ConfigError);
}

TEST(Booster, RejectsUnknownPrecisionListingValidOnes) {
  auto plugin = std::make_shared<booster::DDPPlugin>(booster::DDPPluginOptions{}, ct::world());
  try {
    booster::Booster b(plugin, {.mixed_precision = "fp8"});
    FAIL() << "fp8 was accepted";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    for (const char* word : {"fp8", "fp32", "bf16", "fp16"})
      EXPECT_NE(message.find(word), std::string::npos) << message;
  }
  EXPECT_THROW(booster::Booster(plugin, {.max_norm = -1.0}), ConfigError);
  EXPECT_THROW(booster::Booster(nullptr), ConfigError);
}

namespace {

class FakeModel : public booster::ModelWrapper {
 public:
  explicit FakeModel(std::shared_ptr<models::CausalLM> model) : model_(std::move(model)) {}
  at::Tensor forward(const at::Tensor& ids, const models::TokenLayout& layout = {}) override {
    return model_->forward(ids, layout);
  }
  models::CausalLM& unwrap() override { return *model_; }
  void set_grad_sync(bool enabled) override { sync = enabled; }
  bool sync = true;

 private:
  std::shared_ptr<models::CausalLM> model_;
};

struct FakePlugin : booster::Plugin {
  bool precision = false, device = false;
  std::vector<std::string> precisions = {"fp32", "bf16", "fp16"};
  std::string name() const override { return "fake"; }
  std::vector<std::string> supported_precisions() const override { return precisions; }
  bool control_device() const override { return device; }
  bool control_precision() const override { return precision; }
  cluster::ProcessGroupPtr dp_group() const override { return ct::world(); }
  std::shared_ptr<booster::ModelWrapper> wrap_model(std::shared_ptr<models::CausalLM> model) override {
    return std::make_shared<FakeModel>(std::move(model));
  }
};

size_t warnings_in(const std::vector<std::string>& lines) {
  size_t n = 0;
  for (const auto& line : lines) n += line.find("WARN") != std::string::npos ? 1 : 0;
  return n;
}

}  // namespace

TEST(Booster, PluginThatControlsPrecisionGetsOneWarningAndNoMasters) {
  auto plugin = std::make_shared<FakePlugin>();
  plugin->precision = true;
  plugin->device = true;
  const bool rank0 = ct::world()->rank() == 0;
  {
    LogCapture capture;
    booster::Booster b(plugin, {.mixed_precision = "bf16", .device = c10::Device(c10::kCPU)});
    const auto lines = capture.lines();
    ASSERT_EQ(warnings_in(lines), rank0 ? 1u : 0u);
    if (rank0) {
      for (const char* word : {"fake", "bf16", "precision", "device"}) {
        EXPECT_NE(lines[0].find(word), std::string::npos) << lines[0];
      }
    }
    auto model = models::create_model(tiny_gpt2(), {.seed = 7});
    auto boosted = b.boost(model, std::make_unique<optim::AdamW>(model->parameters()));
    EXPECT_EQ(boosted.optimizer->name(), "AdamW") << "the plugin handles precision: no wrapper";
    EXPECT_EQ(model->parameters()[0].scalar_type(), at::kFloat);
    // NoSyncGuard toggles the wrapper's sync.
    auto& fake = dynamic_cast<FakeModel&>(*boosted.model);
    {
      auto guard = b.no_sync(fake);
      EXPECT_FALSE(fake.sync);
    }
    EXPECT_TRUE(fake.sync);
    EXPECT_EQ(warnings_in(capture.lines()), rank0 ? 1u : 0u) << "boost adds no second warning";
  }
  {
    LogCapture capture;
    booster::Booster b(plugin, {});  // nothing ignored, nothing said
    EXPECT_EQ(warnings_in(capture.lines()), 0u);
  }
}

TEST(Booster, PrecisionThePluginDoesNotSupportIsAConfigError) {
  auto plugin = std::make_shared<FakePlugin>();
  plugin->precisions = {"fp32"};
  try {
    booster::Booster b(plugin, {.mixed_precision = "bf16"});
    FAIL() << "bf16 was accepted by a plugin that supports only fp32";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fp32"), std::string::npos) << e.what();
  }
}

TEST(Booster, BoostRejectsAnOptimizerOfAnotherModel) {
  booster::Booster b(std::make_shared<FakePlugin>());
  auto model = models::create_model(tiny_gpt2(), {.seed = 7});
  auto other = models::create_model(tiny_gpt2(), {.seed = 7});
  EXPECT_THROW(b.boost(model, std::make_unique<optim::AdamW>(other->parameters())), ConfigError);
}

TEST(Booster, DataloaderShardsEachEpochOverDpRanks) {
  auto world = ct::world();
  SharedScratch scratch("data");
  constexpr int64_t kSamples = 64, kLen = 4;
  const std::string shard = scratch.path("corpus.tokens");
  if (world->rank() == 0) {
    std::vector<int32_t> tokens(kSamples * kLen);
    for (size_t k = 0; k < tokens.size(); ++k) tokens[k] = static_cast<int32_t>(k / kLen);  // sample i is all i
    data::write_token_shard(shard, tokens, kSamples);
  }
  barrier();
  auto dataset = std::make_shared<const data::TokenDataset>(std::vector<std::string>{shard}, kLen);
  booster::Booster b(std::make_shared<booster::DDPPlugin>(booster::DDPPluginOptions{}, world));
  auto loader = b.prepare_dataloader(dataset, {.batch_size = 2}, /*seed=*/5);
  ASSERT_EQ(loader->batches_per_epoch(), kSamples / world->size() / 2);
  auto seen = at::zeros({kSamples}, at::kLong);
  for (int64_t i = 0; i < loader->batches_per_epoch(); ++i) {
    auto batch = loader->next();
    for (int64_t r = 0; r < batch.size(0); ++r) seen[batch[r][0].item<int64_t>()] += 1;
  }
  world->all_reduce(seen).wait();
  EXPECT_TRUE(at::equal(seen, at::ones({kSamples}, at::kLong))) << "every sample exactly once per epoch over ranks";
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
