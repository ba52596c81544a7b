// DDP against a single-process reference on the same global batch: gradients
// after one backward, accumulation with no_sync, bucketing and overlap, the
// initial parameter broadcast, and unused parameters. CTest runs this on 1-4
// MPI ranks; the global batch (12 rows) divides by each.
#include "colossus/booster/ddp_plugin.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using namespace colossus;
namespace ct = colossus::testing;

namespace {

constexpr int64_t kGlobalBatch = 12;
constexpr int64_t kSeqLen = 16;

models::ModelConfig tiny_gpt2() {
  models::GPT2Config c;
  c.vocab_size = 96;
  c.n_positions = 32;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0.0;
  return c;
}

at::Tensor global_batch(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(96, {kGlobalBatch, kSeqLen}, gen, at::kLong);
}

at::Tensor local_rows(const at::Tensor& batch, int rank, int world) {
  int64_t per = batch.size(0) / world;
  return batch.narrow(0, rank * per, per);
}

std::map<std::string, at::Tensor> grads_of(models::CausalLM& model) {
  std::map<std::string, at::Tensor> grads;
  for (const auto& item : model.named_parameters()) grads[item.key()] = item.value().grad().clone();
  return grads;
}

void expect_grads_match(models::CausalLM& model, const std::map<std::string, at::Tensor>& reference) {
  for (const auto& item : model.named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    double rel = ct::max_rel_diff(item.value().grad(), reference.at(item.key()));
    EXPECT_LE(rel, 1e-5) << item.key();
  }
}

// Reference: the whole global batch in one process, mean loss over it.
std::map<std::string, at::Tensor> reference_grads(const std::vector<at::Tensor>& micro_batches) {
  auto model = models::create_model(tiny_gpt2(), {.seed = 7});
  for (const auto& ids : micro_batches) {
    auto loss = model->loss(model->forward(ids), ids) / static_cast<double>(micro_batches.size());
    loss.backward();
  }
  return grads_of(*model);
}

}  // namespace

class DDPGradients : public ::testing::TestWithParam<std::tuple<bool, double>> {};

TEST_P(DDPGradients, MatchSingleProcess) {
  auto [as_view, bucket_mb] = GetParam();
  auto world = ct::world();
  auto batch = global_batch(3);
  auto reference = reference_grads({batch});

  booster::DDPPlugin plugin({.bucket_cap_mb = bucket_mb, .gradient_as_bucket_view = as_view}, world);
  auto ddp = plugin.wrap_model(models::create_model(tiny_gpt2(), {.seed = 7}));
  auto ids = local_rows(batch, world->rank(), world->size());
  auto& model = ddp->unwrap();
  // Two steps, zeroing in between, so bucket views survive zero_grad.
  for (int step = 0; step < 2; ++step) {
    for (auto& p : model.parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    auto loss = model.loss(ddp->forward(ids), ids);
    loss.backward();
    expect_grads_match(model, reference);
  }
}

INSTANTIATE_TEST_SUITE_P(BucketModes, DDPGradients,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(25.0, 0.01)));

TEST(DDP, SmallBucketsOverlapWithBackward) {
  auto world = ct::world();
  booster::DDPPlugin plugin({.bucket_cap_mb = 0.01}, world);
  auto ddp = std::dynamic_pointer_cast<booster::DDPModel>(plugin.wrap_model(models::create_model(tiny_gpt2(), {.seed = 7})));
  ASSERT_TRUE(ddp);
  auto ids = local_rows(global_batch(5), world->rank(), world->size());
  ddp->unwrap().loss(ddp->forward(ids), ids).backward();
  const auto& reducer = ddp->reducer();
  ASSERT_GT(reducer.bucket_count(), 4u);
  // Buckets started while backward was still producing gradients.
  EXPECT_GT(reducer.launched_during_backward(), 0);
  // The first bucket holds the last parameters: backward reaches them first.
  EXPECT_EQ(reducer.bucket_layout().front().front(), "transformer.ln_f.bias");
}

TEST(DDP, NoSyncAccumulatesThenAverages) {
  auto world = ct::world();
  auto first = global_batch(11), second = global_batch(12);
  auto reference = reference_grads({first, second});
  for (bool as_view : {false, true}) {
    booster::DDPPlugin plugin({.gradient_as_bucket_view = as_view}, world);
    auto ddp = plugin.wrap_model(models::create_model(tiny_gpt2(), {.seed = 7}));
    auto& model = ddp->unwrap();
    ddp->set_grad_sync(false);
    auto ids = local_rows(first, world->rank(), world->size());
    (model.loss(ddp->forward(ids), ids) / 2.0).backward();
    ddp->set_grad_sync(true);
    ids = local_rows(second, world->rank(), world->size());
    (model.loss(ddp->forward(ids), ids) / 2.0).backward();
    expect_grads_match(model, reference);
  }
}

TEST(DDP, BroadcastsRankZeroParameters) {
  auto world = ct::world();
  // Every rank builds a different model; after wrapping all hold rank 0's.
  booster::DDPPlugin plugin({}, world);
  auto ddp = plugin.wrap_model(models::create_model(tiny_gpt2(), {.seed = 100 + static_cast<uint64_t>(world->rank())}));
  auto rank0 = models::create_model(tiny_gpt2(), {.seed = 100});
  auto expected = rank0->named_parameters();
  for (const auto& item : ddp->unwrap().named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
  }
}

TEST(DDP, UnusedParameters) {
  auto world = ct::world();
  auto used = at::ones({4}).requires_grad_(true);
  auto unused = at::ones({4}).requires_grad_(true);
  {
    booster::GradReducer reducer({{"used", used}, {"unused", unused}}, world, {});
    try {
      (used * 2).sum().backward();
      FAIL() << "an unused parameter was accepted silently";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("unused"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos) << e.what();
    }
  }
  used.mutable_grad().reset();
  // Rank 0 uses `sometimes`, the others do not: its average still counts them as zeros.
  auto sometimes = at::ones({4}).requires_grad_(true);
  booster::GradReducer reducer({{"used", used}, {"sometimes", sometimes}, {"unused", unused}}, world,
                               {.find_unused_parameters = true});
  auto loss = (used * 2).sum();
  if (world->rank() == 0) loss = loss + (sometimes * 3).sum();
  loss.backward();
  EXPECT_TRUE(at::allclose(used.grad(), at::full({4}, 2.0f)));
  ASSERT_TRUE(sometimes.grad().defined());
  EXPECT_TRUE(at::allclose(sometimes.grad(), at::full({4}, 3.0f / world->size())));
  EXPECT_FALSE(unused.grad().defined()) << "a parameter no rank used keeps no gradient, as in torch";
}

TEST(DDP, RejectsBadOptions) {
  EXPECT_THROW(booster::DDPPlugin({.bucket_cap_mb = 0}, ct::world()), ConfigError);
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
