// MoeHybridParallelPlugin with ZeRO, mixed precision and clipping on 4 MPI
// ranks: ep2 x dp2 and ep4 with zero_stage 1 and 2 follow one process's fp32
// AdamW curve over 20 steps (<= 1e-5 relative per step), also with gradient
// accumulation and clipping (the norm counts replicated dense and moe_dp-
// replicated expert elements once); bf16 and fp16 track the fp32 curve; a checkpoint
// resumes onto the same curve (also with another ep_size); bad options are
// ConfigErrors.
#include "colossus/amp/clip_grad.h"
#include "colossus/booster/booster.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/moe/moe_hybrid_parallel_plugin.h"
#include "colossus/optim/adam.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

namespace colossus::moe {
namespace {

namespace ct = colossus::testing;
namespace fs = std::filesystem;

constexpr int kSteps = 20;
constexpr int64_t kRowsPerRank = 2, kSeq = 12;
constexpr double kClipNorm = 0.3;  // below the gradients' norm here, so clipping acts

models::MixtralConfig tiny() { return std::get<models::MixtralConfig>(models::preset("mixtral-tiny")); }

at::Tensor global_batch(int step, int64_t world, int64_t vocab) {
  return at::randint(vocab, {world * kRowsPerRank, kSeq}, at::make_generator<at::CPUGeneratorImpl>(3000 + step % 2),
                     at::kLong);
}

std::unique_ptr<optim::Optimizer> adamw(models::CausalLM& model) {
  return std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
}

// One process on the global batch (fp32), optionally clipped.
std::vector<double> reference_curve(int64_t w, double max_norm) {
  const auto config = tiny();
  auto model = models::create_model(config, {.seed = 7});
  auto optimizer = adamw(*model);
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor ids = global_batch(step, w, config.vocab_size);
    optimizer->zero_grad();
    at::Tensor loss = model->loss(model->forward(ids), ids);
    loss.backward();
    if (max_norm > 0) {
      std::vector<at::Tensor> grads;
      for (const auto& p : model->parameters()) grads.push_back(p.grad());
      amp::clip_grad_norm(grads, max_norm);
    }
    optimizer->step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

struct TrainRun {
  // seed: the model's initial weights.
  TrainRun(const MoeHybridParallelPluginOptions& options, const cluster::ProcessGroupPtr& world, uint64_t seed = 7)
      : booster(std::make_shared<MoeHybridParallelPlugin>(options, world)) {
    auto model = models::create_model(tiny(), {.seed = seed});
    boosted = booster.boost(model, adamw(*model));
  }
  booster::Booster booster;
  booster::Boosted boosted;
};

std::unique_ptr<TrainRun> boost(const MoeHybridParallelPluginOptions& options, const cluster::ProcessGroupPtr& world) {
  return std::make_unique<TrainRun>(options, world);
}

// Steps [first, last) of the curve; each rank's rows in `accumulation`
// microbatches (all but the last under no_sync). Returns the global mean
// losses.
std::vector<double> train(TrainRun& run, const cluster::ProcessGroupPtr& world, int first, int last, int accumulation) {
  const int64_t w = world->size(), rows = kRowsPerRank / accumulation;
  auto& model = *run.boosted.model;
  auto& optimizer = *run.boosted.optimizer;
  std::vector<double> losses;
  for (int step = first; step < last; ++step) {
    at::Tensor ids = global_batch(step, w, tiny().vocab_size).narrow(0, world->rank() * kRowsPerRank, kRowsPerRank);
    optimizer.zero_grad();
    at::Tensor total = at::zeros({1}, at::kDouble);
    for (int mb = 0; mb < accumulation; ++mb) {
      at::Tensor mb_ids = ids.narrow(0, mb * rows, rows);
      at::Tensor loss = model.loss(model.forward(mb_ids), mb_ids) / accumulation;
      if (mb + 1 < accumulation) {
        auto guard = run.booster.no_sync(model);
        run.booster.backward(loss, optimizer);
      } else {
        run.booster.backward(loss, optimizer);
      }
      total += loss.detach().to(at::kDouble);
    }
    optimizer.step();
    world->all_reduce(total).wait();
    losses.push_back(total.item<double>() / static_cast<double>(w));
  }
  return losses;
}

double compare(const std::vector<double>& got, const std::vector<double>& want, int offset, double tolerance,
               const std::string& label) {
  double max_rel = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double rel = std::abs(got[i] - want[offset + i]) / std::abs(want[offset + i]);
    max_rel = std::max(max_rel, rel);
    EXPECT_LE(rel, tolerance) << label << " step " << offset + i << ": " << got[i] << " vs " << want[offset + i];
  }
  return max_rel;
}

std::string label_of(const MoeHybridParallelPluginOptions& o, int accumulation) {
  return fmt::format("ep{}{} zero{} {}{}{}", o.ep_size, o.moe_dp_outside ? "" : " (ep, moe_dp)", o.zero_stage,
                     o.precision, o.max_norm > 0 ? fmt::format(" clip {}", o.max_norm) : "",
                     accumulation > 1 ? fmt::format(" accum {}", accumulation) : "");
}

TEST(MoeZero, Fp32LossCurvesMatchOneProcess) {
  auto world = ct::world();
  if (world->size() != 4) GTEST_SKIP() << "laid out for 4 ranks";
  const auto plain = reference_curve(4, 0.0), clipped = reference_curve(4, kClipNorm);
  struct Case {
    MoeHybridParallelPluginOptions options;
    int accumulation = 1;
  };
  const std::vector<Case> cases = {
      {{.ep_size = 2, .zero_stage = 1}},
      {{.ep_size = 2, .zero_stage = 2}},
      {{.ep_size = 4, .zero_stage = 1}},
      {{.ep_size = 4, .zero_stage = 2}},
      {{.ep_size = 2, .moe_dp_outside = false, .zero_stage = 1}},
      {{.ep_size = 2, .zero_stage = 2, .max_norm = kClipNorm}, 2},
      {{.ep_size = 2, .zero_stage = 0, .max_norm = kClipNorm}},
  };
  for (const auto& c : cases) {
    auto run = boost(c.options, world);
    const auto losses = train(*run, world, 0, kSteps, c.accumulation);
    const std::string label = label_of(c.options, c.accumulation);
    const double max_rel = compare(losses, c.options.max_norm > 0 ? clipped : plain, 0, 1e-5, label);
    if (world->rank() == 0) std::printf("%s: max rel diff to one process %.3g\n", label.c_str(), max_rel);
  }
  // The clipped curve differs from the plain one: clipping acted.
  EXPECT_GT(std::abs(clipped[kSteps - 1] - plain[kSteps - 1]), 1e-4);
  EXPECT_LT(plain.back(), plain.front() - 0.1);
}

TEST(MoeZero, LowPrecisionTracksTheFp32Curve) {
  auto world = ct::world();
  if (world->size() != 4) GTEST_SKIP() << "laid out for 4 ranks";
  const auto reference = reference_curve(4, 0.0);
  for (const auto& [stage, precision] :
       std::vector<std::pair<int, std::string>>{{0, "bf16"}, {2, "bf16"}, {1, "fp16"}}) {
    MoeHybridParallelPluginOptions options{.ep_size = 2, .zero_stage = stage, .precision = precision};
    auto run = boost(options, world);
    const auto losses = train(*run, world, 0, kSteps, 1);
    const double max_rel = compare(losses, reference, 0, 2e-2, label_of(options, 1));
    if (world->rank() == 0) {
      std::printf("%s: max rel diff to the fp32 curve %.3g\n", label_of(options, 1).c_str(), max_rel);
    }
  }
}

TEST(MoeZero, CheckpointResumesOntoTheSameCurve) {
  auto world = ct::world();
  if (world->size() != 4) GTEST_SKIP() << "laid out for 4 ranks";
  // One directory for all ranks, made by rank 0 with mkdtemp.
  const fs::path dir = colossus::testing::job_scratch_dir("moe_zero");
  constexpr int kSaveAt = 3, kEnd = 7;
  const MoeHybridParallelPluginOptions options{.ep_size = 2, .zero_stage = 2};
  auto first = boost(options, world);
  train(*first, world, 0, kSaveAt, 1);
  first->booster.save_model(*first->boosted.model, (dir / "model").string());
  first->booster.save_optimizer(*first->boosted.optimizer, (dir / "optimizer").string());
  const auto expected = train(*first, world, kSaveAt, kEnd, 1);
  // A fresh run (other initial weights) resumes on the same layout but with
  // zero_stage 1: the state format is the unsharded one.
  auto resumed_options = options;
  resumed_options.zero_stage = 1;
  TrainRun second(resumed_options, world, /*seed=*/8);
  second.booster.load_model(*second.boosted.model, (dir / "model").string());
  second.booster.load_optimizer(*second.boosted.optimizer, (dir / "optimizer").string());
  const auto resumed = train(second, world, kSaveAt, kEnd, 1);
  const double max_rel = compare(resumed, expected, 0, 1e-6, "resumed");
  if (world->rank() == 0) std::printf("resumed from step %d: max rel diff %.3g\n", kSaveAt, max_rel);

  // Another ep_size (ep4, zero_stage 0, other initial weights) maps the
  // state by parameter name and continues the same curve.
  auto other = std::make_unique<TrainRun>(MoeHybridParallelPluginOptions{.ep_size = 4, .zero_stage = 0}, world, 9);
  other->booster.load_model(*other->boosted.model, (dir / "model").string());
  other->booster.load_optimizer(*other->boosted.optimizer, (dir / "optimizer").string());
  const double other_rel = compare(train(*other, world, kSaveAt, kEnd, 1), expected, 0, 1e-5, "resumed with ep4");
  if (world->rank() == 0) std::printf("resumed with ep4 zero0 from ep2 zero2: max rel diff %.3g\n", other_rel);
  world->barrier().wait();
  if (world->rank() == 0) fs::remove_all(dir);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

TEST(MoeZero, BadOptionsAreClearConfigErrors) {
  auto world = ct::world();
  const std::vector<std::pair<MoeHybridParallelPluginOptions, std::string>> cases = {
      {{.zero_stage = 3},
       "zero_stage is 3; use 0 (all-reduce), 1 (optimizer state sharded) "
       "or 2"},
      {{.precision = "fp8"}, "precision is 'fp8'; use 'fp32', 'bf16' or 'fp16'"},
      {{.pp_size = 2, .zero_stage = 2}, "zero_stage is 2 with pp_size = 2"},
      {{.max_norm = -1.0}, "max_norm is -1; use 0 (no clipping)"},
  };
  for (const auto& [options, expected] : cases) {
    const std::string message = error_of([&] { MoeHybridParallelPlugin plugin(options, world); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace colossus::moe
int main(int argc, char** argv) { return colossus::testing::run_all_tests(argc, argv); }
