// MoeHybridParallelPlugin with tensor and pipeline parallelism on 4 MPI ranks:
// tp2 x ep2, tp2 x dp2 (forward + booster.backward), pp2 x ep2 (1f1b and
// zero_bubble through booster.execute_pipeline), tp2 x pp2, and clipping with
// tp and pp, dropless routing, follow one process's fp32 AdamW curve over 20
// steps (<= 1e-5 relative per step), with the router aux and z losses under
// pp too (carried to the last stage), and ZeRO-1/2 with tp and ZeRO-1 with
// pp; checkpoints move between tp x pp x ep x zero layouts (a resumed run
// continues the uninterrupted curve) and load into transformers
// (mixtral_oracle.py check); what is refused (ZeRO-2 with pp, sizes not
// dividing the world) is a ConfigError naming the values.
#include "colossus/amp/clip_grad.h"
#include "colossus/booster/booster.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/moe/moe_hybrid_parallel_plugin.h"
#include "colossus/optim/adam.h"
#include "colossus/checkpoint/safetensors.h"
#include "tests/testing/command.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

namespace colossus::moe {
namespace {

namespace ct = colossus::testing;

constexpr int kSteps = 20;
constexpr int64_t kRowsPerDpRank = 2, kSeq = 12;

models::MixtralConfig tiny(bool router_losses = false) {
  auto c = std::get<models::MixtralConfig>(models::preset("mixtral-tiny"));
  if (router_losses) {
    // Large enough to move the curve: the losses must reach every stage's router.
    c.output_router_logits = true;
    c.router_aux_loss_coef = 0.05;
    c.router_z_loss_coef = 0.01;
  }
  return c;
}

// (dp * kRowsPerDpRank, kSeq): the same global batch for every layout.
at::Tensor global_batch(int step, int64_t dp, int64_t vocab) {
  return at::randint(vocab, {dp * kRowsPerDpRank, kSeq}, at::make_generator<at::CPUGeneratorImpl>(4000 + step % 3),
                     at::kLong);
}

std::unique_ptr<optim::Optimizer> adamw(models::CausalLM& model) {
  return std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
}

// router_rows > 0: the model's router losses on, computed per group of that
// many rows (each rank's microbatch: the load-balancing loss is not a mean
// over tokens), the step's loss the mean over groups (gradient accumulation).
std::vector<double> reference_curve(int64_t dp, double max_norm = 0.0, int64_t router_rows = 0) {
  auto model = models::create_model(tiny(router_rows > 0), {.seed = 7});
  auto& mixtral = dynamic_cast<models::MixtralForCausalLM&>(*model);
  auto optimizer = adamw(*model);
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor ids = global_batch(step, dp, tiny().vocab_size);
    optimizer->zero_grad();
    at::Tensor loss;
    if (router_rows > 0) {
      loss = at::zeros({});
      const int64_t groups = ids.size(0) / router_rows;
      for (int64_t g = 0; g < groups; ++g) {
        const at::Tensor rows = ids.narrow(0, g * router_rows, router_rows);
        loss = loss + mixtral.moe_loss(model->forward(rows), rows) / static_cast<double>(groups);
      }
    } else {
      loss = model->loss(model->forward(ids), ids);
    }
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

// One optimizer step on this dp rank's rows `ids` (a pipeline schedule with
// pp > 1); returns the loss averaged over dp.
double train_step(booster::Booster& booster, booster::Boosted& boosted, int64_t pp_size, const at::Tensor& ids,
                  cluster::ProcessGroup& dp) {
  boosted.optimizer->zero_grad();
  at::Tensor loss;
  if (pp_size > 1) {
    loss = booster
               .execute_pipeline([&] { return booster::PipelineBatch{.input_ids = ids}; }, *boosted.model, {},
                                 *boosted.optimizer)
               .loss;
  } else {
    loss = boosted.model->loss(boosted.model->forward(ids), ids);
    booster.backward(loss, *boosted.optimizer);
  }
  boosted.optimizer->step();
  at::Tensor total = loss.detach().to(at::kDouble).reshape({1});
  dp.all_reduce(total).wait();
  return total.item<double>() / static_cast<double>(dp.size());
}

// Each dp rank trains on its rows of the global batch; returns the mean over
// dp of the step losses.
std::vector<double> train(const MoeHybridParallelPluginOptions& options, const cluster::ProcessGroupPtr& world,
                          bool router_losses = false) {
  auto plugin = std::make_shared<MoeHybridParallelPlugin>(options, world);
  booster::Booster booster(plugin);
  auto model = models::create_model(tiny(router_losses), {.seed = 7});
  auto boosted = booster.boost(model, adamw(*model));
  auto dp = plugin->dp_group();
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    at::Tensor ids = global_batch(step, dp->size(), tiny().vocab_size)
                         .narrow(0, dp->rank() * kRowsPerDpRank, kRowsPerDpRank)
                         .contiguous();
    losses.push_back(train_step(booster, boosted, options.pp_size, ids, *dp));
  }
  return losses;
}

double max_rel_diff(const std::vector<double>& got, const std::vector<double>& want, const std::string& label) {
  double max_rel = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double rel = std::abs(got[i] - want[i]) / std::abs(want[i]);
    max_rel = std::max(max_rel, rel);
    EXPECT_LE(rel, 1e-5) << label << " step " << i << ": " << got[i] << " vs " << want[i];
  }
  return max_rel;
}

TEST(MoeTpPp, Fp32LossCurvesMatchOneProcess) {
  auto world = ct::world();
  if (world->size() != 4) GTEST_SKIP() << "laid out for 4 ranks";
  constexpr double kClip = 0.3;  // below the gradients' norm here, so clipping acts
  struct Case {
    MoeHybridParallelPluginOptions options;
    std::string label;
    int64_t router_rows = 0;  // > 0: router aux + z losses on, per group of this many rows
  };
  const std::vector<Case> cases = {
      {{.tp_size = 2, .ep_size = 2}, "tp2 x ep2"},
      {{.pp_size = 2, .ep_size = 2, .num_microbatches = 2}, "pp2 x ep2 (1f1b, 2 microbatches)"},
      {{.tp_size = 2, .ep_size = 1}, "tp2 x dp2 (ep1)"},
      {{.tp_size = 2, .ep_size = 2, .max_norm = kClip}, "tp2 x ep2 clip 0.3"},
      {{.pp_size = 2, .ep_size = 2, .num_microbatches = 2, .max_norm = kClip}, "pp2 x ep2 clip 0.3"},
      {{.tp_size = 2, .pp_size = 2, .ep_size = 1, .num_microbatches = 2}, "tp2 x pp2 (dp1)"},
      {{.pp_size = 2, .ep_size = 2, .pp_style = "zero_bubble", .num_microbatches = 2}, "pp2 x ep2 zero_bubble"},
      // ZeRO: optimizer state sharded (dense over dp, experts over moe_dp),
      // the norm over tp x pp too.
      {{.tp_size = 2, .ep_size = 2, .zero_stage = 1, .max_norm = kClip}, "tp2 x ep2 zero1 clip 0.3"},
      {{.tp_size = 2, .ep_size = 1, .zero_stage = 2}, "tp2 x dp2 zero2"},
      {{.pp_size = 2, .ep_size = 2, .num_microbatches = 2, .zero_stage = 1, .max_norm = kClip},
       "pp2 x ep2 zero1 clip 0.3"},
      // Router losses carried to the last stage (each microbatch one row).
      {{.pp_size = 2, .ep_size = 2, .num_microbatches = 2}, "pp2 x ep2 router aux + z losses", 1},
      {{.tp_size = 2, .pp_size = 2, .ep_size = 1, .pp_style = "zero_bubble", .num_microbatches = 2},
       "tp2 x pp2 zero_bubble router aux + z losses",
       1},
      // Activation checkpointing, wrapped after the expert and tp sharding:
      // the experts' reducer first sees a gradient inside a block's rerun.
      {{.tp_size = 2, .ep_size = 2, .gradient_checkpointing_ratio = 1.0}, "tp2 x ep2 checkpointed"},
      {{.pp_size = 2, .ep_size = 2, .num_microbatches = 2, .gradient_checkpointing_ratio = 1.0},
       "pp2 x ep2 checkpointed"},
      {{.tp_size = 2, .ep_size = 2, .zero_stage = 1, .max_norm = kClip, .gradient_checkpointing_ratio = 1.0},
       "tp2 x ep2 zero1 clip 0.3 checkpointed"},
  };
  for (const auto& c : cases) {
    const int64_t dp = world->size() / (c.options.tp_size * c.options.pp_size);
    const auto want = reference_curve(dp, c.options.max_norm, c.router_rows);
    const double rel = max_rel_diff(train(c.options, world, c.router_rows > 0), want, c.label);
    if (world->rank() == 0) std::printf("[moe tp/pp] %s: max rel diff %.3g over %d steps\n", c.label.c_str(), rel, kSteps);
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

TEST(MoeTpPp, UnsupportedCombinationsAreClearConfigErrors) {
  auto world = ct::world();
  if (world->size() != 4) GTEST_SKIP() << "laid out for 4 ranks";
  const std::vector<std::pair<MoeHybridParallelPluginOptions, std::string>> cases = {
      {{.pp_size = 2, .ep_size = 2, .zero_stage = 2}, "use zero_stage = 1 with pp_size > 1"},
      {{.tp_size = 3}, "tp_size = 3 x pp_size = 1 does not divide the 4 ranks"},
      {{.tp_size = 2, .ep_size = 4}, "ep_size is 4 but must divide the dp size 2"},
      {{.tp_size = 0}, "tp_size is 0 but must be >= 1"},
  };
  for (const auto& [options, expected] : cases) {
    const std::string message = error_of([&] { MoeHybridParallelPlugin plugin(options, world); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

// A run on a fixed global batch of 4 rows (each dp rank its share), so
// layouts with other dp sizes continue the same curve.
struct LayoutRun {
  LayoutRun(const MoeHybridParallelPluginOptions& options, const cluster::ProcessGroupPtr& world, uint64_t seed)
      : options(options), booster(std::make_shared<MoeHybridParallelPlugin>(options, world)) {
    auto model = models::create_model(tiny(), {.seed = seed});
    boosted = booster.boost(model, adamw(*model));
  }
  // Steps [first, last): the global mean losses.
  std::vector<double> train(int first, int last) {
    auto dp = booster.plugin().dp_group();
    const int64_t rows = 4 / dp->size();
    std::vector<double> losses;
    for (int step = first; step < last; ++step) {
      at::Tensor ids = global_batch(step, 2, tiny().vocab_size).narrow(0, dp->rank() * rows, rows).contiguous();
      losses.push_back(train_step(booster, boosted, options.pp_size, ids, *dp));
    }
    return losses;
  }
  void save(const std::filesystem::path& dir) {
    booster.save_model(*boosted.model, (dir / "model").string());
    booster.save_optimizer(*boosted.optimizer, (dir / "optimizer").string());
  }
  void load(const std::filesystem::path& dir) {
    booster.load_model(*boosted.model, (dir / "model").string());
    booster.load_optimizer(*boosted.optimizer, (dir / "optimizer").string());
  }
  MoeHybridParallelPluginOptions options;
  booster::Booster booster;
  booster::Boosted boosted;
};

TEST(MoeTpPp, CheckpointsMoveBetweenLayoutsAndIntoTransformers) {
  auto world = ct::world();
  if (world->size() != 4) GTEST_SKIP() << "laid out for 4 ranks";
  namespace fs = std::filesystem;
  const fs::path dir = ct::job_scratch_dir("moe_tp_pp_ckpt");
  constexpr int kFirstSave = 3, kSecondSave = 6, kEnd = 9;
  // The uninterrupted run: tp2 x ep2 with ZeRO-1, saved at step 3.
  LayoutRun a({.tp_size = 2, .ep_size = 2, .zero_stage = 1}, world, 7);
  const auto head = a.train(0, kFirstSave);
  a.save(dir / "tp2_ep2_zero1");
  const auto want = a.train(kFirstSave, kEnd);
  EXPECT_LT(want.back(), head.front() - 0.05) << "the curve should fall";

  auto check = [&](const std::vector<double>& got, int offset, const std::string& label) {
    double max_rel = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double expected = want[static_cast<size_t>(offset - kFirstSave) + i];
      max_rel = std::max(max_rel, std::abs(got[i] - expected) / std::abs(expected));
    }
    EXPECT_LE(max_rel, 1e-5) << label;
    if (world->rank() == 0) std::printf("[moe checkpoint] %s: max rel diff %.3g\n", label.c_str(), max_rel);
  };
  // pp2 x ep2 (other initial weights) resumes it, then saves at step 6 from
  // its pipeline stages.
  LayoutRun b({.pp_size = 2, .ep_size = 2, .num_microbatches = 2}, world, 8);
  b.load(dir / "tp2_ep2_zero1");
  check(b.train(kFirstSave, kSecondSave), kFirstSave, "tp2 x ep2 zero1 -> pp2 x ep2");
  b.save(dir / "pp2_ep2");
  // ...which ep4 without tp/pp (ZeRO-2: the state maps by name) and
  // tp2 x pp2 x ep1 with ZeRO-1 each resume.
  for (const auto& [options, label] : std::vector<std::pair<MoeHybridParallelPluginOptions, std::string>>{
           {{.ep_size = 4, .zero_stage = 2}, "pp2 x ep2 -> ep4 zero2"},
           {{.tp_size = 2, .pp_size = 2, .ep_size = 1, .num_microbatches = 2, .zero_stage = 1},
            "pp2 x ep2 -> tp2 x pp2 zero1"}}) {
    LayoutRun c(options, world, 9);
    c.load(dir / "pp2_ep2");
    check(c.train(kSecondSave, kEnd), kSecondSave, label);
  }
  world->barrier().wait();
  // transformers loads the pipeline-saved model cleanly with the logits of
  // our one-process load.
  if (world->rank() == 0) {
    const fs::path model_dir = dir / "pp2_ep2" / "model";
    auto full = models::load_pretrained(model_dir.string());
    full->eval();
    at::Tensor ids = at::randint(tiny().vocab_size, {2, kSeq}, at::make_generator<at::CPUGeneratorImpl>(5), at::kLong);
    at::Tensor logits, aux;
    {
      at::NoGradGuard no_grad;
      logits = full->forward(ids);
      aux = dynamic_cast<models::MixtralForCausalLM&>(*full).aux_loss().reshape({1});
    }
    checkpoint::save_safetensors((model_dir / "cpp_logits.safetensors").string(),
                                 {{"input_ids", ids}, {"logits", logits}, {"aux_loss", aux}});
    auto result = ct::run_command(
        fmt::format("'{}' '{}' check '{}' 2>&1", COLOSSUS_PYTHON, COLOSSUS_MIXTRAL_ORACLE, model_dir.string()));
    std::cout << result.output;
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("-> ok"), std::string::npos) << result.output;
    fs::remove_all(dir);
  }
  world->barrier().wait();
}

}  // namespace
}  // namespace colossus::moe
int main(int argc, char** argv) { return colossus::testing::run_all_tests(argc, argv); }
