// HybridParallelPlugin with sequence parallelism against one process: 20
// AdamW steps on the same global batch give the same loss curve (fp32, 1e-5
// relative) for ring_attn and all_to_all over every sp that divides the world,
// alone and with tp = 2 (GPT-2 and LLaMA with GQA); a length not divisible by
// 2*sp (padded) gives the same loss and gradients; an sp checkpoint resumes
// without sp; bad SP options are refused. split_gather and ring (Megatron SP
// over the tp group) against one process the same way, for tp in {2, 4} and
// tp2 x dp2, padded lengths included. A sliding window shorter than the
// sequence is refused.
#include "colossus/booster/booster.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/parallel/plan/shard_spec.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/lr_scheduler.h"
#include "tests/booster/booster_testing.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

using namespace colossus;
using namespace colossus::booster::testing;
namespace ct = colossus::testing;

namespace {

// A run through the Booster with HybridParallelPlugin; model seed 7, AdamW and
// schedule as booster_testing's reference_losses.
class SpRun {
 public:
  SpRun(const models::ModelConfig& config, booster::HybridParallelPluginOptions options) : config_(config) {
    plugin_ = std::make_shared<booster::HybridParallelPlugin>(std::move(options), ct::world());
    booster_ = std::make_unique<booster::Booster>(plugin_);
    auto model = models::create_model(config, {.seed = 7});
    auto optimizer =
        std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
    auto scheduler = std::make_shared<optim::CosineWarmupLR>(
        *optimizer, optim::CosineLROptions{.warmup_steps = 4, .total_steps = kSteps});
    boosted_ = booster_->boost(model, std::move(optimizer), scheduler);
  }

  // This rank's rows of a global batch (the same rows on every sp rank).
  at::Tensor rows(const at::Tensor& batch) const {
    auto dp = plugin_->dp_group();
    const int64_t n = batch.size(0) / dp->size();
    return batch.narrow(0, dp->rank() * n, n);
  }

  double train_step(int64_t step) {
    auto dp = plugin_->dp_group();
    auto ids = rows(global_batch(config_, step));
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

  booster::Booster& booster() { return *booster_; }
  booster::Boosted& boosted() { return boosted_; }
  booster::HybridParallelPlugin& plugin() { return *plugin_; }

 private:
  models::ModelConfig config_;
  std::shared_ptr<booster::HybridParallelPlugin> plugin_;
  std::unique_ptr<booster::Booster> booster_;
  booster::Boosted boosted_;
};

booster::HybridParallelPluginOptions sp_options(const std::string& mode, int sp, int tp) {
  return {.tp_size = tp, .sp_size = sp, .enable_sequence_parallelism = true, .sequence_parallelism_mode = mode};
}

}  // namespace

TEST(SequenceParallelTraining, LossCurvesMatchSingleProcess) {
  const int world = ct::world()->size();
  for (const auto& config : {tiny_gpt2(), tiny_llama()}) {
    const auto reference = reference_losses(config, kSteps);
    for (const std::string mode : {"ring_attn", "all_to_all"}) {
      for (int tp : {1, 2}) {
        for (int sp : {1, 2, 4}) {
          if (world % (sp * tp) != 0) continue;
          // Ulysses splits heads over sp after tp did: 4 query heads / tp must divide by sp.
          if (mode == "all_to_all" && (4 / tp) % sp != 0) continue;
          SpRun run(config, sp_options(mode, sp, tp));
          std::vector<double> losses;
          for (int64_t step = 0; step < kSteps; ++step) losses.push_back(run.train_step(step));
          double worst = 0.0;
          for (size_t i = 0; i < losses.size(); ++i)
            worst = std::max(worst, std::abs(losses[i] - reference[i]) / std::abs(reference[i]));
          const std::string what =
              fmt::format("{} {} sp{} x tp{} x dp{}", models::model_type(config), mode, sp, tp, world / (sp * tp));
          EXPECT_LE(worst, 1e-5) << what;
          if (ct::world()->rank() == 0)
            std::printf("%s: loss %.6f -> %.6f, max rel diff vs 1 process %.2e\n", what.c_str(), losses.front(),
                        losses.back(), worst);
        }
      }
    }
  }
}

// T = 13 is not a multiple of 2*sp: the padded tokens change neither the loss
// nor any gradient.
TEST(SequenceParallelTraining, PaddedLengthMatchesSingleProcess) {
  const int sp = ct::world()->size();
  for (const auto& config : {tiny_gpt2(), tiny_llama()}) {
    auto ids = global_batch(config, 0).narrow(1, 0, 13).contiguous();
    auto reference = models::create_model(config, {.seed = 7});
    auto ref_loss = reference->loss(reference->forward(ids), ids);
    ref_loss.backward();
    for (const std::string mode : {"ring_attn", "all_to_all"}) {
      if (mode == "all_to_all" && 4 % sp != 0) continue;
      SpRun run(config, sp_options(mode, sp, 1));
      auto& model = *run.boosted().model;
      auto loss = model.loss(model.forward(ids), ids);
      run.booster().backward(loss, *run.boosted().optimizer);
      const std::string what = fmt::format("{} {} sp{} T=13", models::model_type(config), mode, sp);
      EXPECT_LE(std::abs(loss.item<double>() - ref_loss.item<double>()) / ref_loss.item<double>(), 1e-5) << what;
      auto ref_params = reference->named_parameters(/*recurse=*/true);
      for (const auto& item : model.unwrap().named_parameters(/*recurse=*/true)) {
        const at::Tensor* want = ref_params.find(item.key());
        ASSERT_NE(want, nullptr) << item.key();
        ASSERT_TRUE(item.value().grad().defined()) << item.key() << " " << what;
        // The vocab is padded (make_vocab_size_divisible_by): compare the true rows.
        at::Tensor got = item.value().grad().narrow(0, 0, want->size(0));
        EXPECT_LE(ct::max_rel_diff(got, want->grad()), 1e-5) << item.key() << " " << what;
      }
    }
  }
}

// Saved with sp = the world (ring_attn, then all_to_all), resumed without
// sequence parallelism (dp = world): the continued curve is the uninterrupted
// single-process one (sp ranks hold the same parameters; files are full HF).
TEST(SequenceParallelTraining, SpCheckpointResumesWithoutSp) {
  const int sp = ct::world()->size();
  if (sp < 2) GTEST_SKIP() << "needs 2 ranks for sp = 2";
  const auto config = tiny_llama();
  const auto reference = reference_losses(config, kSteps);
  for (const std::string mode : {"ring_attn", "all_to_all"}) {
    if (mode == "all_to_all" && 4 % sp != 0) continue;
    SharedScratch scratch("sp_" + mode);
    const std::string dir = scratch.path("step10");
    {
      SpRun run(config, sp_options(mode, sp, 1));
      for (int64_t step = 0; step < 10; ++step) run.train_step(step);
      run.booster().save_model(*run.boosted().model, dir);
      run.booster().save_optimizer(*run.boosted().optimizer, dir);
      run.booster().save_lr_scheduler(*run.boosted().lr_scheduler, scratch.path("step10/scheduler.json"));
    }
    SpRun resumed(config, {.tp_size = 1});
    resumed.booster().load_model(*resumed.boosted().model, dir);
    resumed.booster().load_optimizer(*resumed.boosted().optimizer, dir);
    resumed.booster().load_lr_scheduler(*resumed.boosted().lr_scheduler, scratch.path("step10/scheduler.json"));
    for (int64_t step = 10; step < kSteps; ++step) {
      const double loss = resumed.train_step(step);
      EXPECT_LE(std::abs(loss - reference[step]) / reference[step], 1e-5) << mode << " step " << step;
    }
  }
}

// Ring and Ulysses attention are full causal attention: a sliding window
// shorter than the sequence (mistral-tiny's 8 < kSeqLen) is refused, naming it.
TEST(SequenceParallelTraining, RefusesAWindowShorterThanTheSequence) {
  const int sp = ct::world()->size();
  if (sp < 2) GTEST_SKIP() << "needs 2 ranks for sp = 2";
  const auto config = models::preset("mistral-tiny");
  for (const std::string mode : {"ring_attn", "all_to_all"}) {
    if (mode == "all_to_all" && 4 % sp != 0) continue;
    SpRun run(config, sp_options(mode, sp, 1));
    try {
      run.train_step(0);
      ADD_FAILURE() << mode << ": trained over a window it cannot honour";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("sliding_window of 8"), std::string::npos) << e.what();
    }
  }
}

booster::HybridParallelPluginOptions tp_sp_options(const std::string& mode, int tp) {
  return {.tp_size = tp, .enable_sequence_parallelism = true, .sequence_parallelism_mode = mode};
}

// Megatron-style SP: activations between tp regions are sequence shards,
// norms run on T/tp tokens and their gradients are summed over tp. tiny_llama
// has 4 query / 2 kv heads, so tp = 4 also replicates kv heads.
TEST(SequenceParallelTraining, SplitGatherAndRingMatchSingleProcess) {
  const int world = ct::world()->size();
  if (world < 2) GTEST_SKIP() << "split_gather / ring need tp >= 2";
  for (const auto& config : {tiny_gpt2(), tiny_llama()}) {
    const auto reference = reference_losses(config, kSteps);
    for (const std::string mode : {"split_gather", "ring"}) {
      for (int tp : {2, 4}) {
        if (world % tp != 0) continue;
        SpRun run(config, tp_sp_options(mode, tp));
        std::vector<double> losses;
        for (int64_t step = 0; step < kSteps; ++step) losses.push_back(run.train_step(step));
        double worst = 0.0;
        for (size_t i = 0; i < losses.size(); ++i)
          worst = std::max(worst, std::abs(losses[i] - reference[i]) / std::abs(reference[i]));
        const std::string what = fmt::format("{} {} tp{} x dp{}", models::model_type(config), mode, tp, world / tp);
        EXPECT_LE(worst, 1e-5) << what;
        if (ct::world()->rank() == 0)
          std::printf("%s: loss %.6f -> %.6f, max rel diff vs 1 process %.2e\n", what.c_str(), losses.front(),
                      losses.back(), worst);
      }
    }
  }
}

// ring_attn with two-level rings (inner rings of 2 joined by an outer ring)
// trains as one process.
TEST(SequenceParallelTraining, RingAttnInnerRingMatchesSingleProcess) {
  if (ct::world()->size() != 4) GTEST_SKIP() << "inner rings of 2 inside sp = 4";
  const auto config = tiny_llama();
  const auto reference = reference_losses(config, kSteps);
  auto options = sp_options("ring_attn", 4, 1);
  options.inner_ring_size = 2;
  SpRun run(config, options);
  double worst = 0.0;
  for (int64_t step = 0; step < kSteps; ++step)
    worst = std::max(worst, std::abs(run.train_step(step) - reference[step]) / std::abs(reference[step]));
  EXPECT_LE(worst, 1e-5);
  if (ct::world()->rank() == 0) std::printf("llama ring_attn sp4 inner_ring_size 2: max rel diff %.2e\n", worst);
}

// T = 13 does not divide by tp: the model pads to a multiple of tp and trims
// the logits; loss and every gradient (sharded ones gathered over tp, the
// tp-replicated ones summed over their sequence shards) equal one process.
TEST(SequenceParallelTraining, SplitGatherPaddedLengthMatchesSingleProcess) {
  const int tp = ct::world()->size();
  if (tp < 2) GTEST_SKIP() << "split_gather / ring need tp >= 2";
  for (const auto& config : {tiny_gpt2(), tiny_llama()}) {
    auto ids = global_batch(config, 0).narrow(1, 0, 13).contiguous();
    auto reference = models::create_model(config, {.seed = 7});
    auto ref_loss = reference->loss(reference->forward(ids), ids);
    ref_loss.backward();
    auto ref_params = reference->named_parameters(/*recurse=*/true);
    for (const std::string mode : {"split_gather", "ring"}) {
      SpRun run(config, tp_sp_options(mode, tp));
      auto& model = *run.boosted().model;
      auto logits = model.forward(ids);
      EXPECT_EQ(logits.size(1), 13);
      auto loss = model.loss(logits, ids);
      run.booster().backward(loss, *run.boosted().optimizer);
      const std::string what = fmt::format("{} {} tp{} T=13", models::model_type(config), mode, tp);
      EXPECT_LE(std::abs(loss.item<double>() - ref_loss.item<double>()) / ref_loss.item<double>(), 1e-5) << what;
      const auto& sharded = dynamic_cast<booster::HybridParallelModel&>(model).sharded();
      for (const auto& item : model.unwrap().named_parameters(/*recurse=*/true)) {
        const at::Tensor* want = ref_params.find(item.key());
        ASSERT_NE(want, nullptr) << item.key();
        ASSERT_TRUE(item.value().grad().defined()) << item.key() << " " << what;
        auto spec = sharded.specs.find(item.key());
        at::Tensor got = spec == sharded.specs.end()
                             ? item.value().grad()
                             : parallel::plan::gather_full(item.value().grad(), spec->second, *sharded.tp_group);
        EXPECT_LE(ct::max_rel_diff(got, want->grad()), 1e-5) << item.key() << " " << what;
      }
    }
  }
}

TEST(SequenceParallelTraining, RefusesBadOptions) {
  auto world = ct::world();
  EXPECT_THROW(booster::HybridParallelPlugin({.sp_size = 2}, world), ConfigError);
  EXPECT_THROW(
      booster::HybridParallelPlugin(
          {.sp_size = 0, .enable_sequence_parallelism = true, .sequence_parallelism_mode = "ring_attn"}, world),
      ConfigError);
  for (const std::string mode : {"ulysses", ""}) {
    try {
      booster::HybridParallelPlugin({.enable_sequence_parallelism = true, .sequence_parallelism_mode = mode}, world);
      ADD_FAILURE() << "expected ConfigError for mode '" << mode << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("split_gather"), std::string::npos) << e.what();
    }
  }
  // split_gather / ring shard over the tp group: tp_size 1 has none, and an
  // sp_size other than 1 or tp_size names a group they do not use.
  for (const std::string mode : {"split_gather", "ring"}) {
    try {
      booster::HybridParallelPlugin(tp_sp_options(mode, 1), world);
      ADD_FAILURE() << "expected ConfigError for mode '" << mode << "' with tp_size 1";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("tp_size > 1"), std::string::npos) << e.what();
    }
    auto options = tp_sp_options(mode, 2);
    options.sp_size = 4;
    EXPECT_THROW(booster::HybridParallelPlugin(options, world), ConfigError) << mode;
  }
  EXPECT_THROW(booster::HybridParallelPlugin(sp_options("ring_attn", world->size() + 1, 1), world), ConfigError);
  // inner_ring_size must divide sp and belongs to ring_attn only.
  auto inner = sp_options("ring_attn", 4, 1);
  inner.inner_ring_size = 3;
  try {
    booster::HybridParallelPlugin(inner, world);
    ADD_FAILURE() << "expected ConfigError for inner_ring_size 3 with sp 4";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide sp_size = 4"), std::string::npos) << e.what();
  }
  inner = sp_options("all_to_all", 1, 1);
  inner.inner_ring_size = 1;
  EXPECT_THROW(booster::HybridParallelPlugin(inner, world), ConfigError);
}
