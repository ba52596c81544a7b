// MoeHybridParallelPlugin with tensor and pipeline parallelism on 4 MPI ranks:
// tp2 x ep2, tp2 x dp2 (forward + booster.backward), pp2 x ep2 (1f1b and
// zero_bubble through booster.execute_pipeline), tp2 x pp2, and clipping with
// tp and pp, dropless routing, follow one process's fp32 AdamW curve over 20
// steps (<= 1e-5 relative per step), with the router aux and z losses under
// pp too (carried to the last stage), and ZeRO-1/2 with tp and ZeRO-1 with
// pp; what is not supported yet (ZeRO-2 with pp, checkpoints with tp/pp,
// sizes not dividing the world) is a ConfigError naming the values.
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

#include <algorithm>
#include <cmath>

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
    boosted.optimizer->zero_grad();
    at::Tensor loss;
    if (options.pp_size > 1) {
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
    dp->all_reduce(total).wait();
    losses.push_back(total.item<double>() / static_cast<double>(dp->size()));
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
  // Checkpoints with tp.
  {
    auto plugin =
        std::make_shared<MoeHybridParallelPlugin>(MoeHybridParallelPluginOptions{.tp_size = 2, .ep_size = 2}, world);
    booster::Booster booster(plugin);
    auto model = models::create_model(tiny(), {.seed = 7});
    auto boosted = booster.boost(model, adamw(*model));
    const std::string message = error_of([&] { booster.save_model(*boosted.model, "/tmp/colossus_moe_tp_refused"); });
    EXPECT_NE(message.find("save_model('/tmp/colossus_moe_tp_refused') with tp_size = 2"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace colossus::moe
int main(int argc, char** argv) { return colossus::testing::run_all_tests(argc, argv); }
