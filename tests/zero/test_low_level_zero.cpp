// ZeRO-1/2 against one process: 20 steps of fp32 training reproduce the
// single-process loss curve on the same global batch (1e-5 relative) for
// GPT-2 and LLaMA (GQA), with and without gradient accumulation and clipping,
// and with every optimizer (Lamb through its partition reducer); bf16 stays
// near fp32, fp16 trains; the plugin's bad options are ConfigErrors.
// CTest runs it on 1, 2 and 4 MPI ranks.
#include "colossus/core/errors.h"
#include "tests/testing/testing.h"
#include "tests/zero/zero_testing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

using namespace colossus;
using namespace colossus::zero::testing;
namespace ct = colossus::testing;
namespace bt = colossus::booster::testing;

namespace {

const std::vector<double>& cached_reference(const RunSpec& spec) {
  static std::map<std::tuple<std::string, std::string, double>, std::vector<double>> cache;
  auto key = std::make_tuple(spec.model, spec.optimizer, spec.max_norm);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, reference_losses(spec, bt::kSteps)).first;
  return it->second;
}

// Trains `spec` and checks it against the reference; returns the worst rel diff.
double expect_matches_reference(const RunSpec& spec, double tolerance) {
  const auto& reference = cached_reference(spec);
  ZeroRun run(spec);
  const auto losses = run.train(0, bt::kSteps);
  EXPECT_EQ(losses.size(), reference.size());
  for (size_t step = 0; step < losses.size() && step < reference.size(); ++step) {
    EXPECT_LE(std::abs(losses[step] - reference[step]) / std::abs(reference[step]), tolerance)
        << "step " << step << ": " << losses[step] << " vs " << reference[step];
  }
  EXPECT_LT(losses.back(), losses.front()) << "the run should learn something";
  const double worst = worst_rel_diff(losses, reference);
  if (ct::world()->rank() == 0) {
    std::printf("%s zero-%d %s %s, %d micro, max_norm %.1f, %d rank(s): loss %.5f -> %.5f, max rel diff %.2e\n",
                spec.model.c_str(), spec.stage, spec.optimizer.c_str(), spec.precision.c_str(), spec.micro_batches,
                spec.max_norm, ct::world()->size(), losses.front(), losses.back(), worst);
  }
  return worst;
}

}  // namespace

// model, stage, micro-batches, max_norm
class ZeroMatchesSingleProcess : public ::testing::TestWithParam<std::tuple<std::string, int, int, double>> {};

TEST_P(ZeroMatchesSingleProcess, LossCurveFp32AdamW) {
  const auto [model, stage, micro, max_norm] = GetParam();
  expect_matches_reference({.model = model, .stage = stage, .micro_batches = micro, .max_norm = max_norm}, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZeroMatchesSingleProcess,
                         ::testing::Combine(::testing::Values("gpt2", "llama"), ::testing::Values(1, 2),
                                            ::testing::Values(1, 2), ::testing::Values(0.0, 0.5)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_zero" + std::to_string(std::get<1>(info.param)) +
                                  "_micro" + std::to_string(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) > 0 ? "_clip" : "_noclip");
                         });

class ZeroOptimizers : public ::testing::TestWithParam<std::string> {};

// Every optimizer under ZeRO-2 with accumulation and clipping (Lamb's trust
// ratio needs whole-parameter norms over the shards).
TEST_P(ZeroOptimizers, MatchSingleProcess) {
  expect_matches_reference({.model = "llama", .stage = 2, .micro_batches = 2, .max_norm = 0.5, .optimizer = GetParam()},
                           1e-5);
}

INSTANTIATE_TEST_SUITE_P(Each, ZeroOptimizers, ::testing::Values("adam", "sgd", "lamb", "hybrid_adam"));

TEST(LowLevelZero, LambZero1MatchesSingleProcess) {
  expect_matches_reference({.model = "gpt2", .stage = 1, .optimizer = "lamb"}, 1e-5);
}

TEST(LowLevelZero, OverlappedAllGatherAndExtraDpMatch) {
  expect_matches_reference({.model = "gpt2", .stage = 2, .overlap_allgather = true}, 1e-5);
  const int world = ct::world()->size();
  if (world % 2 == 0) expect_matches_reference({.model = "gpt2", .stage = 2, .extra_dp_size = 2}, 1e-5);
}

TEST(LowLevelZero, CpuOffloadIsExactAndBf16CommunicationStaysClose) {
  expect_matches_reference({.model = "gpt2", .stage = 1, .micro_batches = 2, .cpu_offload = true}, 1e-5);
  const auto& reference = cached_reference({.model = "gpt2"});
  ZeroRun run({.model = "gpt2", .stage = 2, .communication_dtype = "bf16"});
  EXPECT_LE(worst_rel_diff(run.train(0, bt::kSteps), reference), 1e-2);
}

// ZeRO-Offload's bf16 path (bf16 gradient down to pinned host memory, one
// fused CPU pass writing the bf16 parameters over it, norm and overflow check
// on the device) performs the same float operations as the fp32 master
// gradient path, so the curves are equal, with clipping and accumulation.
TEST(LowLevelZero, Bf16CpuOffloadStepsOnTheHostAsTheMasterGradientPathDoes) {
  const RunSpec base{.model = "llama", .stage = 2, .micro_batches = 2, .max_norm = 0.5,
                     .optimizer = "hybrid_adam", .precision = "bf16"};
  ZeroRun on_device(base);
  RunSpec offloaded_spec = base;
  offloaded_spec.cpu_offload = true;
  ZeroRun offloaded(offloaded_spec);
  auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(offloaded.boosted().optimizer.get());
  ASSERT_NE(zero, nullptr);
  EXPECT_TRUE(zero->steps_on_host_in_bf16());
  auto* plain = dynamic_cast<zero::LowLevelZeroOptimizer*>(on_device.boosted().optimizer.get());
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->steps_on_host_in_bf16());
  // 2 bytes of host gradient a parameter instead of 4.
  EXPECT_EQ(zero->memory_bytes().grads * 2, plain->memory_bytes().grads);
  const auto expected = on_device.train(0, bt::kSteps);
  const auto losses = offloaded.train(0, bt::kSteps);
  ASSERT_EQ(losses.size(), expected.size());
  for (size_t step = 0; step < losses.size(); ++step) EXPECT_EQ(losses[step], expected[step]) << "step " << step;
  EXPECT_EQ(zero->last_grad_norm(), plain->last_grad_norm());
  EXPECT_LT(losses.back(), losses.front());
}

TEST(LowLevelZero, Bf16WithoutMasterWeightsTrains) {
  ZeroRun run({.model = "gpt2", .stage = 2, .precision = "bf16", .master_weights = false});
  auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(run.boosted().optimizer.get());
  ASSERT_NE(zero, nullptr);
  const auto bytes = zero->memory_bytes();
  EXPECT_EQ(bytes.masters, 0) << "the parameters' own bf16 chunk is stepped";
  const auto losses = run.train(0, bt::kSteps);
  EXPECT_LT(losses.back(), losses.front());
}

TEST(LowLevelZero, Bf16StaysNearFp32) {
  const auto& reference = cached_reference({.model = "gpt2", .max_norm = 0.5});
  ZeroRun run({.model = "gpt2", .stage = 2, .micro_batches = 2, .max_norm = 0.5, .precision = "bf16"});
  const auto losses = run.train(0, bt::kSteps);
  EXPECT_LE(worst_rel_diff(losses, reference), 3e-2);
  EXPECT_LT(losses.back(), losses.front());
  for (const auto& p : run.boosted().model->unwrap().parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  if (ct::world()->rank() == 0) {
    std::printf("gpt2 zero-2 bf16, %d rank(s): max rel diff vs fp32 %.2e\n", ct::world()->size(),
                worst_rel_diff(losses, reference));
  }
}

// fp8_communication all-gathers the updated parameters in e4m3: every rank
// computes with the same dequantized weights (its own chunk included), within
// e4m3's rounding (2^-4 relative, plus the subnormal spacing of the bucket's
// largest value) of the masters, which stay exact: gathering them in the
// parameters' dtype (what a model save does) gives other values than the
// fp8 working copy, on fp32 parameters too, whose master could alias them.
TEST(LowLevelZero, Fp8ParameterGatherKeepsReplicasEqualAndMastersExact) {
  auto world = ct::world();
  for (const auto& [precision, master_weights] :
       std::vector<std::pair<std::string, bool>>{{"fp32", true}, {"bf16", true}, {"bf16", false}}) {
    ZeroRun run({.model = "gpt2", .stage = 2, .precision = precision, .master_weights = master_weights,
                 .fp8_communication = true});
    auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(run.boosted().optimizer.get());
    ASSERT_NE(zero, nullptr);
    const auto losses = run.train(0, 3);
    const std::string what = precision + (master_weights ? " masters" : " no masters");
    std::vector<at::Tensor> working, exact;
    for (const auto& p : run.boosted().model->unwrap().parameters()) working.push_back(p.detach().clone());
    zero->gather_exact_params();
    for (const auto& p : run.boosted().model->unwrap().parameters()) exact.push_back(p.detach().clone());
    // Bounds every bucket's largest value (and so its subnormal spacing).
    double largest = 0;
    for (const auto& e : exact) largest = std::max(largest, e.abs().max().item<double>());
    const double spacing = largest / 448.0 / 512.0;
    bool rounded_somewhere = false;
    for (size_t k = 0; k < working.size(); ++k) {
      at::Tensor from_zero = working[k].clone();
      world->broadcast(from_zero, 0).wait();
      EXPECT_TRUE(at::equal(from_zero, working[k])) << what << ": ranks hold different weights, parameter " << k;
      const at::Tensor w = working[k].to(at::kFloat), e = exact[k].to(at::kFloat);
      EXPECT_TRUE(((w - e).abs() <= e.abs() * 0.0625 + spacing).all().item<bool>()) << what << ", parameter " << k;
      rounded_somewhere = rounded_somewhere || !at::equal(w, e);
    }
    EXPECT_TRUE(rounded_somewhere) << what << ": the masters were rounded to e4m3 with the gather";
    EXPECT_LT(losses.back(), losses.front()) << what;
  }
}

TEST(LowLevelZero, Fp16ScalesTheLossAndTrains) {
  ZeroRun run({.model = "gpt2", .stage = 1, .precision = "fp16", .initial_scale = 1024.0});
  auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(run.boosted().optimizer.get());
  ASSERT_NE(zero, nullptr);
  EXPECT_EQ(zero->loss_scale(), 1024.0);
  const auto losses = run.train(0, bt::kSteps);
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_FALSE(zero->last_step_skipped());
}

TEST(LowLevelZero, Stage2ShardsGradientsAndOverlapsReduction) {
  ZeroRun run({.model = "gpt2", .stage = 2, .bucket_size_in_m = 0.001});
  auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(run.boosted().optimizer.get());
  ASSERT_NE(zero, nullptr);
  ASSERT_GT(zero->bucket_count(), 2u);
  auto ids = bt::global_batch(bt::tiny_gpt2(), 0).narrow(0, 0, 2);
  auto& model = *run.boosted().model;
  run.booster().backward(model.unwrap().loss(model.forward(ids), ids), *run.boosted().optimizer);
  EXPECT_GT(zero->launched_during_backward(), 0);
  for (const auto& p : model.unwrap().parameters()) EXPECT_FALSE(p.grad().defined()) << "stage 2 keeps no full grad";
  const auto bytes = zero->memory_bytes();
  EXPECT_EQ(bytes.grads * ct::world()->size(), bytes.params) << "fp32 grad chunks: 1/dp of the fp32 params";
}

TEST(LowLevelZero, BadOptionsAreConfigErrors) {
  auto expect_error = [](booster::LowLevelZeroPluginOptions options, const std::string& needle) {
    try {
      options.validate();
      ADD_FAILURE() << "no ConfigError for " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({.stage = 3}, "stage=3");
  expect_error({.precision = "fp8"}, "precision='fp8'");
  expect_error({.reduce_bucket_size_in_m = 0}, "reduce_bucket_size_in_m=0");
  expect_error({.reduce_bucket_size_in_m = -1}, "reduce_bucket_size_in_m=-1");
  expect_error({.communication_dtype = "int8"}, "communication_dtype='int8'");
  expect_error({.max_norm = -1}, "max_norm=-1");
  expect_error({.extra_dp_size = 0}, "extra_dp_size=0");
  expect_error({.loss_scaler = {.initial_scale = 0}}, "initial_scale");
  EXPECT_THROW(booster::LowLevelZeroPlugin({.extra_dp_size = 3 * ct::world()->size()}), ConfigError);
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
