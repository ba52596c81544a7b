// Loss curves of a whole Mixtral with expert parallelism inside data
// parallelism (ep in {1, 2, 4} over the world, moe_dp = world / ep) against
// one process on the global batch: 20 SGD steps, fp32, dropless routing,
// <= 1e-5 relative per step. Dense gradients are averaged over the world;
// expert gradients (already summed over the ep group by the all-to-all's
// backward) are summed over moe_dp and divided by the world size.
#include "colossus/models/pretrained.h"
#include "colossus/moe/shard_experts.h"
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
constexpr double kLr = 0.1;

models::MixtralConfig tiny() {
  auto c = std::get<models::MixtralConfig>(models::preset("mixtral-tiny"));
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  return c;
}

at::Tensor global_batch(int step, int64_t world, int64_t vocab) {
  // Two batches in turn, so the loss has something to learn.
  return at::randint(vocab, {world * kRowsPerRank, kSeq}, at::make_generator<at::CPUGeneratorImpl>(1000 + step % 2),
                     at::kLong);
}

void sgd(models::CausalLM& model) {
  at::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) p.sub_(p.grad(), kLr);
  }
}

TEST(ExpertParallelTraining, LossCurveMatchesOneProcess) {
  auto world = ct::world();
  const int64_t w = world->size();
  const auto config = tiny();
  // Reference: one process, the global batch.
  std::vector<double> reference;
  {
    auto model = models::create_model(config, {.seed = 3});
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
  for (int64_t ep : {1, 2, 4}) {
    if (ep > w || w % ep != 0) continue;
    const int rank = world->rank();
    auto ep_group = world->split(static_cast<int>(rank / ep), rank, "ep");
    auto moe_dp_group = world->split(static_cast<int>(rank % ep), rank, "moe_dp");
    auto base = models::create_model(config, {.seed = 3});
    auto& model = dynamic_cast<models::MixtralForCausalLM&>(*base);
    shard_experts(model, ep_group);
    model.train();
    int64_t expert_params = 0;
    for (const auto& item : model.named_parameters()) expert_params += is_expert_parameter(item.key());
    EXPECT_EQ(expert_params, config.num_hidden_layers * 3 * config.num_local_experts / ep);
    double max_rel = 0.0;
    for (int step = 0; step < kSteps; ++step) {
      at::Tensor ids = global_batch(step, w, config.vocab_size).narrow(0, rank * kRowsPerRank, kRowsPerRank);
      model.zero_grad();
      at::Tensor loss = model.loss(model.forward(ids), ids);
      loss.backward();
      for (const auto& item : model.named_parameters()) {
        at::Tensor p = item.value();
        if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);  // an expert no token reached
        auto& group = is_expert_parameter(item.key()) ? *moe_dp_group : *world;
        group.all_reduce(p.grad()).wait();
        p.grad().div_(static_cast<double>(w));
      }
      at::Tensor global_loss = loss.detach().clone();
      world->all_reduce(global_loss).wait();
      const double mean_loss = global_loss.item<double>() / static_cast<double>(w);
      const double rel = std::abs(mean_loss - reference[step]) / std::abs(reference[step]);
      max_rel = std::max(max_rel, rel);
      EXPECT_LE(rel, 1e-5)
          << "ep=" << ep << " step " << step << ": " << mean_loss << " vs " << reference[step];
      sgd(model);
    }
    if (rank == 0) {
      std::printf(
          "ep=%lld moe_dp=%lld: loss %.6f -> %.6f over %d steps, max "
          "rel diff to one process %.3g\n",
          static_cast<long long>(ep), static_cast<long long>(w / ep), reference.front(), reference.back(), kSteps,
          max_rel);
    }
    EXPECT_LT(reference.back(), reference.front() - 0.1);
  }
}

}  // namespace
}  // namespace colossus::moe
