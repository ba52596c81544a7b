// HybridParallelPlugin against one process: 20 AdamW steps (warmup + cosine)
// on the same global batch give the same loss curve (fp32, 1e-5 relative) for
// every tp that divides the world (tp x dp on 4 ranks), GPT-2 and LLaMA with
// GQA (kv heads < tp at tp 4), with clipping counted once per element; a tp=2
// checkpoint resumes exactly with tp=1 and loads in Hugging Face transformers.
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/booster/tp_clip_optimizer.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/lr_scheduler.h"
#include "tests/booster/booster_testing.h"
#include "tests/testing/command.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

using namespace colossus;
using namespace colossus::booster::testing;
namespace ct = colossus::testing;

namespace {

// A run through the Booster with HybridParallelPlugin; model seed 7, AdamW and
// schedule as booster_testing's reference_losses.
class HybridRun {
 public:
  HybridRun(const models::ModelConfig& config, booster::HybridParallelPluginOptions options) : config_(config) {
    plugin_ = std::make_shared<booster::HybridParallelPlugin>(std::move(options), ct::world());
    booster_ = std::make_unique<booster::Booster>(plugin_);
    auto model = models::create_model(config, {.seed = 7});
    auto optimizer =
        std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
    auto scheduler = std::make_shared<optim::CosineWarmupLR>(
        *optimizer, optim::CosineLROptions{.warmup_steps = 4, .total_steps = kSteps});
    boosted_ = booster_->boost(model, std::move(optimizer), scheduler);
  }

  double train_step(int64_t step) {
    auto dp = plugin_->dp_group();
    const int64_t rows = kGlobalBatch / dp->size();
    auto ids = global_batch(config_, step).narrow(0, dp->rank() * rows, rows);
    auto& model = *boosted_.model;
    auto loss = model.loss(model.forward(ids), ids);
    booster_->backward(loss, *boosted_.optimizer);
    boosted_.optimizer->step();
    boosted_.lr_scheduler->step();
    boosted_.optimizer->zero_grad();
    auto total = at::full({1}, loss.item<double>(), at::kDouble);
    dp->all_reduce(total).wait();
    return total.item<double>() / dp->size();
  }
  std::vector<double> train(int64_t first, int64_t end) {
    std::vector<double> losses;
    for (int64_t step = first; step < end; ++step) losses.push_back(train_step(step));
    return losses;
  }

  booster::Booster& booster() { return *booster_; }
  booster::Boosted& boosted() { return boosted_; }

 private:
  models::ModelConfig config_;
  std::shared_ptr<booster::HybridParallelPlugin> plugin_;
  std::unique_ptr<booster::Booster> booster_;
  booster::Boosted boosted_;
};

double worst_rel_diff(const std::vector<double>& got, const std::vector<double>& reference) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size() && i < reference.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - reference[i]) / std::abs(reference[i]));
  }
  return worst;
}

void expect_curve(const std::vector<double>& got, const std::vector<double>& reference, const std::string& what) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  const double worst = worst_rel_diff(got, reference);
  EXPECT_LE(worst, 1e-5) << what;
  if (ct::world()->rank() == 0) {
    std::printf("%s on %d rank(s): loss %.6f -> %.6f, max rel diff vs 1 process %.2e\n", what.c_str(),
                ct::world()->size(), got.front(), got.back(), worst);
  }
}

std::vector<int> tp_sizes() {
  std::vector<int> sizes;
  for (int tp : {1, 2, 4}) {
    if (ct::world()->size() % tp == 0) sizes.push_back(tp);
  }
  return sizes;
}

}  // namespace

TEST(HybridParallel, LossCurvesMatchSingleProcess) {
  for (const auto& config : {tiny_gpt2(), tiny_llama()}) {
    const auto reference = reference_losses(config, kSteps);
    for (int tp : tp_sizes()) {
      HybridRun run(config, {.tp_size = tp});
      expect_curve(run.train(0, kSteps), reference,
                   fmt::format("{} tp{} x dp{}", models::model_type(config), tp, ct::world()->size() / tp));
    }
  }
}

// The norm counts replicated parameters (LayerNorms, wpe, row biases) once,
// not tp times, so clipping matches the single process; with dp inside too.
TEST(HybridParallel, ClippedCurveMatchesSingleProcess) {
  const int tp = ct::world()->size() >= 2 ? 2 : 1;
  const auto reference = reference_losses(tiny_gpt2(), kSteps, /*max_norm=*/0.3);
  HybridRun run(tiny_gpt2(), {.tp_size = tp, .max_norm = 0.3, .dp_outside = false});
  auto* clip = dynamic_cast<booster::TPClipOptimizer*>(run.boosted().optimizer.get());
  ASSERT_NE(clip, nullptr);
  const auto losses = run.train(0, kSteps);
  EXPECT_GT(clip->last_grad_norm(), 0.0);
  expect_curve(losses, reference, fmt::format("gpt2 clipped 0.3 tp{} (mesh tp, dp)", tp));
}

// bf16 / fp16 (dynamic loss scaling) through the plugin: fp32 masters start at
// the exact init, the model runs in low precision, and the curve stays near
// fp32 (the DDP tests' tolerance); fp16 with clipping exercises the scaled path.
TEST(HybridParallel, Bf16AndFp16StayNearFp32) {
  const int tp = ct::world()->size() >= 2 ? 2 : 1;
  const auto reference = reference_losses(tiny_llama(), kSteps);
  for (const std::string precision : {"bf16", "fp16"}) {
    HybridRun run(tiny_llama(), {.tp_size = tp, .precision = precision, .max_norm = precision == "fp16" ? 10.0 : 0.0});
    auto* mixed = dynamic_cast<amp::MixedPrecisionOptimizer*>(run.boosted().optimizer.get());
    ASSERT_NE(mixed, nullptr);
    for (const auto& p : run.boosted().model->unwrap().parameters()) EXPECT_NE(p.scalar_type(), at::kFloat);
    for (const auto& m : mixed->master_params()) EXPECT_EQ(m.scalar_type(), at::kFloat);
    const auto losses = run.train(0, kSteps);
    ASSERT_EQ(losses.size(), reference.size());
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], reference[i], 2e-2 * reference[i]) << precision << " step " << i;
    if (ct::world()->rank() == 0) {
      std::printf("llama %s tp%d: loss %.4f -> %.4f, max rel diff vs fp32 %.2e\n", precision.c_str(), tp,
                  losses.front(), losses.back(), worst_rel_diff(losses, reference));
    }
  }
}

// Saved with tp = 2, resumed with tp = 1 (dp = world): the continued curve is
// the uninterrupted single-process one; the model directory keeps the true
// vocab and transformers computes our loss on it.
TEST(HybridParallel, Tp2CheckpointResumesWithTp1AndLoadsInTransformers) {
  auto world = ct::world();
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks for tp = 2";
  for (const auto& config : {tiny_gpt2(), tiny_llama()}) {
    const std::string kind = models::model_type(config);
    const auto reference = reference_losses(config, kSteps);
    SharedScratch scratch("tp_" + kind);
    const std::string dir = scratch.path("step10");
    {
      HybridRun run(config, {.tp_size = 2});
      run.train(0, 10);
      run.booster().save_model(*run.boosted().model, dir);
      run.booster().save_optimizer(*run.boosted().optimizer, dir);
      run.booster().save_lr_scheduler(*run.boosted().lr_scheduler, scratch.path("step10/scheduler.json"));
    }
    HybridRun resumed(config, {.tp_size = 1});
    resumed.booster().load_model(*resumed.boosted().model, dir);
    resumed.booster().load_optimizer(*resumed.boosted().optimizer, dir);
    resumed.booster().load_lr_scheduler(*resumed.boosted().lr_scheduler, scratch.path("step10/scheduler.json"));
    const auto tail = resumed.train(10, kSteps);
    expect_curve(tail, std::vector<double>(reference.begin() + 10, reference.end()), kind + " tp2 save -> tp1 resume");

    if (world->rank() == 0) {
      // The true vocab on disk: padding trimmed.
      const auto state = checkpoint::load_state_dict(dir);
      const std::string embed = kind == "gpt2" ? "transformer.wte.weight" : "model.embed_tokens.weight";
      EXPECT_EQ(state.at(embed).size(0), 96);
      // transformers' loss on our weights equals ours (the step-10 model, loaded whole).
      auto loaded = models::load_pretrained(dir);
      auto ids = global_batch(config, 0);
      const double ours = loaded->loss(loaded->forward(ids), ids).item<double>();
      nlohmann::json rows = nlohmann::json::array();
      for (int64_t r = 0; r < ids.size(0); ++r) {
        std::vector<int64_t> row(ids[r].data_ptr<int64_t>(), ids[r].data_ptr<int64_t>() + ids.size(1));
        rows.push_back(row);
      }
      const std::string command =
          fmt::format("{} {} {} '{}' 2>&1", COLOSSUS_PYTHON, COLOSSUS_HF_LOSS_CHECK, dir, rows.dump());
      const auto result = ct::run_command(command);
      ASSERT_EQ(result.exit_code, 0) << result.output;
      const std::string& output = result.output;
      const double theirs = nlohmann::json::parse(output.substr(output.rfind('{')))["loss"].get<double>();
      EXPECT_NEAR(theirs, ours, 1e-4 * std::abs(ours)) << kind;
      std::printf("%s: transformers loss %.6f, ours %.6f\n", kind.c_str(), theirs, ours);
    }
    barrier();
  }
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
