// Expert parallelism on 1, 2 and 4 MPI ranks: ExpertParallelMoeBlock's
// forward, input gradients and parameter gradients equal the single-process
// SparseMoeBlock run over all ranks' tokens (fp32, <= 1e-5 relative), for
// ep in {1, 2, 4} and top-k in {1, 2}; ep not dividing the experts is refused.
#include "colossus/core/errors.h"
#include "colossus/moe/expert_parallel.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace colossus::moe {
namespace {

namespace ct = colossus::testing;

models::MixtralConfig config(int64_t experts, int64_t top_k) {
  models::MixtralConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_attention_heads = 4;
  c.num_local_experts = experts;
  c.num_experts_per_tok = top_k;
  return c;
}

void seeded_init(torch::nn::Module& module, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : module.parameters()) p.copy_(at::randn(p.sizes(), generator) * 0.3);
}

at::Tensor tokens_of(int64_t rank, int64_t width) {
  // Different token counts per rank, so the all-to-all splits are uneven.
  return at::randn({1, 10 + 3 * rank, width}, at::make_generator<at::CPUGeneratorImpl>(100 + rank));
}

at::Tensor cotangent_of(const at::Tensor& y, int64_t rank) {
  return at::randn(y.sizes(), at::make_generator<at::CPUGeneratorImpl>(500 + rank));
}

TEST(ExpertParallel, ForwardAndGradientsEqualTheSingleProcessLayer) {
  auto world = ct::world();
  for (int64_t ep : {1, 2, 4}) {
    if (ep > world->size() || world->size() % ep != 0) continue;
    auto group = world->split(static_cast<int>(world->rank() / ep), world->rank(), "ep" + std::to_string(ep));
    const int64_t me = group->rank();
    for (int64_t k : {1, 2})
      for (double capacity_factor : {0.0, 0.5}) {  // 0: dropless
        auto c = config(8, k);
        if (capacity_factor > 0) c.capacity_factor = capacity_factor;
        // Reference: the full layer over the tokens of every rank in the group.
        models::SparseMoeBlock full(c, at::TensorOptions().dtype(at::kFloat));
        seeded_init(full, 42);
        std::vector<at::Tensor> xs, ys;
        std::vector<int64_t> dropped;
        at::Tensor reference_loss = at::zeros({});
        at::Tensor my_x_ref;
        for (int64_t s = 0; s < ep; ++s) {
          at::Tensor x = tokens_of(s, c.hidden_size).requires_grad_(true);
          at::Tensor y = full.forward(x);
          reference_loss = reference_loss + (y * cotangent_of(y, s)).sum();
          xs.push_back(x);
          ys.push_back(y.detach());
          dropped.push_back(full.last_dropped());
        }
        reference_loss.backward();

        ExpertParallelMoeBlock sharded(c, at::TensorOptions().dtype(at::kFloat), group);
        sharded.load_from(full);
        EXPECT_EQ(sharded.first_expert(), me * (8 / ep));
        at::Tensor x = tokens_of(me, c.hidden_size).requires_grad_(true);
        at::Tensor y = sharded.forward(x);
        (y * cotangent_of(y, me)).sum().backward();

        const std::string where =
            "ep=" + std::to_string(ep) + " k=" + std::to_string(k) + " cf=" + std::to_string(capacity_factor);
        EXPECT_LE(ct::max_rel_diff(y, ys[me]), 1e-5) << where;
        // Capacity applies to each rank's own tokens, before dispatch: the same drops as one process on them.
        EXPECT_EQ(sharded.last_dropped(), dropped[me]) << where;
        if (capacity_factor > 0 && k == 2) {
          EXPECT_GT(dropped[me], 0) << where;
        }
        EXPECT_LE(ct::max_rel_diff(x.grad(), xs[me].grad()), 1e-5) << where;
        auto reference = full.named_parameters();
        size_t experts_checked = 0;
        for (const auto& item : sharded.named_parameters()) {
          at::Tensor grad = item.value().grad();
          const at::Tensor& ref_grad = reference[item.key()].grad();
          if (item.key().starts_with("gate")) {
            // The router is replicated: its gradient is summed over the ranks'
            // tokens (dp's job in a plugin).
            group->all_reduce(grad).wait();
            if (k == 1) {
              // Top-1 weights renormalise to exactly 1: the router's true
              // gradient is 0, both sides hold rounding noise.
              EXPECT_LE((grad - ref_grad).abs().max().item<double>(), 1e-4) << where;
              continue;
            }
          } else {
            ++experts_checked;
          }
          ASSERT_EQ(grad.defined(), ref_grad.defined()) << item.key() << " " << where;
          if (grad.defined()) {
            EXPECT_LE(ct::max_rel_diff(grad, ref_grad), 1e-5) << item.key() << " " << where;
          }
        }
        EXPECT_EQ(experts_checked, static_cast<size_t>(3 * 8 / ep)) << where;
      }
  }
}

TEST(ExpertParallel, EpNotDividingTheExpertsIsRefused) {
  EXPECT_NO_THROW(validate_ep(8, 4));
  try {
    validate_ep(6, 4);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ep_size is 4 but must divide num_local_experts (6)"), std::string::npos)
        << e.what();
  }
  auto world = ct::world();
  if (world->size() == 4) {
    EXPECT_THROW(ExpertParallelMoeBlock(config(6, 2), at::TensorOptions().dtype(at::kFloat), world), ConfigError);
  }
}

}  // namespace
}  // namespace colossus::moe

int main(int argc, char** argv) { return colossus::testing::run_all_tests(argc, argv); }
