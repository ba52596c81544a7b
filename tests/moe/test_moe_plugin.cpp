// MoeHybridParallelPlugin through the Booster on 1, 2 and 4 MPI ranks: a
// Mixtral trained 20 AdamW steps with ep in {1, 2, 4} (moe_dp = world / ep,
// both mesh orders, and with every block checkpointed) matches one process on
// the global batch (fp32, <= 1e-5 relative per step); bad layouts and non-MoE
// models are ConfigErrors.
#include "colossus/booster/booster.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/moe/moe_hybrid_parallel_plugin.h"
#include "colossus/optim/adam.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace colossus::moe {
namespace {

namespace ct = colossus::testing;

constexpr int kSteps = 20;
constexpr int64_t kRowsPerRank = 2, kSeq = 12;

models::MixtralConfig tiny(int64_t experts = 4) {
  auto c = std::get<models::MixtralConfig>(models::preset("mixtral-tiny"));
  c.num_local_experts = experts;
  return c;
}

at::Tensor global_batch(int step, int64_t world, int64_t vocab) {
  return at::randint(vocab, {world * kRowsPerRank, kSeq}, at::make_generator<at::CPUGeneratorImpl>(2000 + step % 2),
                     at::kLong);
}

std::unique_ptr<optim::Optimizer> adamw(models::CausalLM& model) {
  return std::make_unique<optim::AdamW>(model.parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
}

TEST(MoeHybridParallelPlugin, LossCurveMatchesOneProcess) {
  auto world = ct::world();
  const int64_t w = world->size();
  const auto config = tiny();
  std::vector<double> reference;
  {
    auto model = models::create_model(config, {.seed = 5});
    auto optimizer = adamw(*model);
    for (int step = 0; step < kSteps; ++step) {
      at::Tensor ids = global_batch(step, w, config.vocab_size);
      optimizer->zero_grad();
      at::Tensor loss = model->loss(model->forward(ids), ids);
      loss.backward();
      optimizer->step();
      reference.push_back(loss.item<double>());
    }
  }
  for (int64_t ep : {1, 2, 4}) {
    for (int variant = 0; variant < 3; ++variant) {
      // 0, 1: both mesh orders; 2: (moe_dp, ep) with every block checkpointed
      // (the experts' reducer first sees a gradient inside a block's rerun).
      const bool outside = variant != 1;
      const double checkpointing = variant == 2 ? 1.0 : 0.0;
      if (ep > w || w % ep != 0 || (!outside && (ep == 1 || ep == w))) continue;
      auto plugin = std::make_shared<MoeHybridParallelPlugin>(
          MoeHybridParallelPluginOptions{
              .ep_size = ep, .moe_dp_outside = outside, .gradient_checkpointing_ratio = checkpointing},
          world);
      EXPECT_EQ(plugin->ep_group()->size(), ep);
      booster::Booster booster(plugin);
      auto model = models::create_model(config, {.seed = 5});
      auto boosted = booster.boost(model, adamw(*model));
      double max_rel = 0.0;
      for (int step = 0; step < kSteps; ++step) {
        at::Tensor ids = global_batch(step, w, config.vocab_size).narrow(0, world->rank() * kRowsPerRank, kRowsPerRank);
        boosted.optimizer->zero_grad();
        at::Tensor loss = boosted.model->loss(boosted.model->forward(ids), ids);
        booster.backward(loss, *boosted.optimizer);
        boosted.optimizer->step();
        at::Tensor global = loss.detach().clone();
        world->all_reduce(global).wait();
        const double mean = global.item<double>() / static_cast<double>(w);
        const double rel = std::abs(mean - reference[step]) / std::abs(reference[step]);
        max_rel = std::max(max_rel, rel);
        EXPECT_LE(rel, 1e-5) << "ep=" << ep << " step " << step << ": " << mean << " vs " << reference[step];
      }
      if (world->rank() == 0) {
        std::printf("plugin ep=%lld moe_dp=%lld %s%s: loss %.6f -> %.6f, max rel diff to one process %.3g\n",
                    static_cast<long long>(ep), static_cast<long long>(w / ep),
                    outside ? "(moe_dp, ep)" : "(ep, moe_dp)", checkpointing > 0 ? " checkpointed" : "",
                    reference.front(), reference.back(), max_rel);
      }
    }
  }
  EXPECT_LT(reference.back(), reference.front() - 0.1);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

TEST(MoeHybridParallelPlugin, BadLayoutsAreClearConfigErrors) {
  auto world = ct::world();
  const int64_t w = world->size();
  EXPECT_NE(error_of([&] { MoeHybridParallelPlugin({.ep_size = 0}, world); }).find("ep_size is 0"), std::string::npos);
  if (w > 1) {
    const std::string message = error_of([&] { MoeHybridParallelPlugin({.ep_size = w + 1}, world); });
    EXPECT_NE(message.find("must divide the dp size"), std::string::npos) << message;
  }
  if (w == 4) {
    MoeHybridParallelPlugin plugin({.ep_size = 4}, world);
    const std::string message = error_of([&] { plugin.wrap_model(models::create_model(tiny(6), {.seed = 1})); });
    EXPECT_NE(message.find("ep_size is 4 but must divide num_local_experts (6)"), std::string::npos) << message;
  }
  MoeHybridParallelPlugin plugin({.ep_size = 1}, world);
  const std::string message = error_of([&] { plugin.wrap_model(models::create_model(models::preset("llama-tiny"))); });
  EXPECT_NE(message.find("needs a Mixtral model"), std::string::npos) << message;
}

}  // namespace
}  // namespace colossus::moe
