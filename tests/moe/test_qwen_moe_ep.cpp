// Qwen2-MoE / Qwen3-MoE with expert parallelism (ep = 2 inside data
// parallelism over the world) against one process on the global batch: 8 SGD
// steps, fp32, <= 1e-5 relative per step. shard_experts splits only the routed
// experts of the sparse layers; dense layers (mlp_only_layers) and Qwen2-MoE's
// shared expert stay replicated and are averaged like attention.
#include "colossus/models/pretrained.h"
#include "colossus/moe/expert_parallel.h"
#include "colossus/moe/shard_experts.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

namespace colossus::moe {
namespace {

namespace ct = colossus::testing;

constexpr int kSteps = 8;
constexpr int64_t kRowsPerRank = 2, kSeq = 12, kEp = 2;
constexpr double kLr = 0.1;

at::Tensor global_batch(int step, int64_t world, int64_t vocab) {
  return at::randint(vocab, {world * kRowsPerRank, kSeq}, at::make_generator<at::CPUGeneratorImpl>(2000 + step % 2),
                     at::kLong);
}

void sgd(models::CausalLM& model) {
  at::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) p.sub_(p.grad(), kLr);
  }
}

TEST(QwenMoeExpertParallel, LossCurveMatchesOneProcessAndTheSharedExpertStaysWhole) {
  auto world = ct::world();
  const int64_t w = world->size();
  if (w % kEp != 0) GTEST_SKIP() << "needs an even number of ranks";
  const int rank = world->rank();
  auto ep_group = world->split(static_cast<int>(rank / kEp), rank, "qwen_ep");
  auto moe_dp_group = world->split(static_cast<int>(rank % kEp), rank, "qwen_moe_dp");
  for (const std::string family : {"qwen3_moe", "qwen2_moe"}) {
    const auto config = std::get<models::MixtralConfig>(models::preset(family + "-tiny"));
    std::vector<double> reference;
    {
      auto model = models::create_model(config, {.seed = 5});
      model->train();
      for (int step = 0; step < kSteps; ++step) {
        at::Tensor ids = global_batch(step, w, config.vocab_size);
        model->zero_grad();
        at::Tensor loss = model->loss(model->forward(ids), ids);
        loss.backward();
        reference.push_back(loss.item<double>());
        sgd(*model);
      }
    }
    auto base = models::create_model(config, {.seed = 5});
    auto& model = dynamic_cast<models::MixtralForCausalLM&>(*base);
    shard_experts(model, ep_group);
    model.train();
    int64_t expert_params = 0, shared_params = 0;
    for (const auto& item : model.named_parameters()) {
      expert_params += is_expert_parameter(item.key());
      shared_params += item.key().find(".shared_expert") != std::string::npos;
    }
    // Two sparse layers (layer 1 is dense), 3 projections per routed expert, E / ep of them here.
    EXPECT_EQ(expert_params, 2 * 3 * config.num_local_experts / kEp) << family;
    EXPECT_EQ(shared_params, family == "qwen2_moe" ? 2 * 4 : 0) << family;  // gate/up/down + sigmoid gate, whole
    for (auto* moe : model.moe_blocks()) {
      EXPECT_NE(dynamic_cast<ExpertParallelMoeBlock*>(moe), nullptr) << family;
    }
    for (int step = 0; step < kSteps; ++step) {
      at::Tensor ids = global_batch(step, w, config.vocab_size).narrow(0, rank * kRowsPerRank, kRowsPerRank);
      model.zero_grad();
      at::Tensor loss = model.loss(model.forward(ids), ids);
      loss.backward();
      for (const auto& item : model.named_parameters()) {
        at::Tensor p = item.value();
        if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
        auto& group = is_expert_parameter(item.key()) ? *moe_dp_group : *world;
        group.all_reduce(p.grad()).wait();
        p.grad().div_(static_cast<double>(w));
      }
      at::Tensor global_loss = loss.detach().clone();
      world->all_reduce(global_loss).wait();
      const double mean_loss = global_loss.item<double>() / static_cast<double>(w);
      EXPECT_LE(std::abs(mean_loss - reference[step]) / std::abs(reference[step]), 1e-5)
          << family << " step " << step << ": " << mean_loss << " vs " << reference[step];
      sgd(model);
    }
    EXPECT_LT(reference.back(), reference.front()) << family;
  }
}

}  // namespace
}  // namespace colossus::moe
