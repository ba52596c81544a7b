// Gemini (ZeRO-3 over chunks) against one process: 20 fp32 steps reproduce
// the single-process loss curve (1e-5 relative) for GPT-2 and LLaMA, with and
// without gradient accumulation and clipping, under the static policy without
// and with full CPU offload (optimizer side and parameter shards), partial
// offload / kept-gathered chunks, and the auto policy (a probe that forces
// part of the chunks off the device). Also: the chunk search and placement
// decisions, that parameters hold no memory between uses, the placement's
// byte accounting, and the checkpoints (HF directory, resharded resume).
// CTest runs it on 1, 2 and 4 MPI ranks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "colossus/checkpoint/safetensors.h"
#include "colossus/cluster/fp8_collectives.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/zero/gemini/chunk_plan.h"
#include "colossus/zero/gemini/placement.h"
#include "tests/testing/testing.h"
#include "tests/zero/zero_testing.h"

using namespace colossus;
using namespace colossus::zero::testing;
namespace ct = colossus::testing;
namespace bt = colossus::booster::testing;
namespace gm = colossus::zero::gemini;

namespace {

const std::vector<double>& cached_reference(const RunSpec& spec) {
  static std::map<std::tuple<std::string, std::string, double>, std::vector<double>> cache;
  auto key = std::make_tuple(spec.model, spec.optimizer, spec.max_norm);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, reference_losses(spec, bt::kSteps)).first;
  return it->second;
}

gm::GeminiDDP& ddp_of(ZeroRun& run) {
  auto* model = dynamic_cast<booster::GeminiModel*>(run.boosted().model.get());
  EXPECT_NE(model, nullptr);
  return model->ddp();
}

gm::GeminiOptimizer& optimizer_of(ZeroRun& run) {
  auto* optimizer = dynamic_cast<gm::GeminiOptimizer*>(run.boosted().optimizer.get());
  EXPECT_NE(optimizer, nullptr);
  return *optimizer;
}

double expect_matches_reference(const RunSpec& spec, const std::string& what, double tolerance = 1e-5) {
  const auto& reference = cached_reference(spec);
  ZeroRun run(spec);
  const auto losses = run.train(0, bt::kSteps);
  EXPECT_EQ(losses.size(), reference.size());
  for (size_t step = 0; step < losses.size() && step < reference.size(); ++step) {
    EXPECT_LE(std::abs(losses[step] - reference[step]) / std::abs(reference[step]), tolerance)
        << what << " step " << step << ": " << losses[step] << " vs " << reference[step];
  }
  EXPECT_LT(losses.back(), losses.front()) << "the run should learn something";
  const double worst = worst_rel_diff(losses, reference);
  if (ct::world()->rank() == 0) {
    std::printf(
        "%s %s, %d micro, max_norm %.1f, %d rank(s), %zu chunks: loss "
        "%.5f -> %.5f, max rel diff %.2e\n",
        spec.model.c_str(), what.c_str(), spec.micro_batches, spec.max_norm, ct::world()->size(),
        ddp_of(run).chunks().size(), losses.front(), losses.back(), worst);
  }
  return worst;
}

// A device-memory probe for CPU ranks: the chunks' device bytes plus a fixed
// non-model amount, out of `capacity`; and a transient amount more that lives
// only between two boundaries of the step (as attention's temporaries or the
// loss's do), seen in the peak since the last reset but never in the bytes
// allocated at a boundary.
struct FakeDevice {
  gm::GeminiDDP* ddp = nullptr;
  int64_t non_model = 0;
  int64_t transient = 0;
  int64_t capacity = 0;
  int64_t peak_base = 0;  // the bytes allocated at the last peak reset
};

int64_t fake_allocated(const FakeDevice& device) { return device.ddp->device_model_bytes() + device.non_model; }

// Puts a probe over `device` and its peak reset into `spec`: at construction
// (no ddp yet) everything fits; then the chunks' device bytes plus the fixed
// non-model amount, and the peak since the last reset plus the transient.
void attach_fake_device(RunSpec& spec, FakeDevice& device) {
  spec.memory_probe = [&device]() -> std::optional<metrics::DeviceMemory> {
    if (!device.ddp) return metrics::DeviceMemory{.total_bytes = int64_t{1} << 40};
    const int64_t allocated = fake_allocated(device);
    return metrics::DeviceMemory{.allocated_bytes = allocated,
                                 .peak_allocated_bytes = std::max(device.peak_base, allocated) + device.transient,
                                 .total_bytes = device.capacity};
  };
  spec.memory_peak_reset = [&device] { device.peak_base = device.ddp ? fake_allocated(device) : 0; };
}

// The non-model bytes the auto policy charges for a traced peak.
int64_t charged(int64_t non_model_peak) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(non_model_peak) * (1.0 + gm::kNonModelHeadroom)));
}

// Sizes `device` so that, after the auto policy's warm-up (bf16 parameter
// shards, two segments' gathered chunks and their gradients), the optimizer
// sides of half of ddp's chunks fit on it (16 bytes an element each) beside
// its non-model peak (fixed + transient), and attaches the probe to ddp.
void fit_half_the_optimizer_sides(FakeDevice& device, gm::GeminiDDP& ddp) {
  const int64_t n = static_cast<int64_t>(ddp.chunks().size());
  const int64_t shard_numel = ddp.chunk_numel() / ct::world()->size();
  size_t widest = 0;
  for (const auto& segment : ddp.segment_chunks()) widest = std::max(widest, segment.size());
  const int64_t working = static_cast<int64_t>(2 * widest) * ddp.chunk_numel() * 2;
  device.capacity = static_cast<int64_t>(static_cast<double>(working + n * shard_numel * 2 + n / 2 * shard_numel * 16 +
                                                             shard_numel + charged(device.non_model + device.transient)) /
                                         0.9) +
                    1;
  device.ddp = &ddp;
}

// `spec` under the auto policy on a FakeDevice that, after the warm-up, holds
// the optimizer sides of half the chunks (fit_half_the_optimizer_sides).
struct HalfFitAutoRun {
  FakeDevice device{.non_model = 4096};
  std::unique_ptr<ZeroRun> run;

  explicit HalfFitAutoRun(RunSpec spec, int64_t transient = 0) {
    spec.placement_policy = "auto";
    device.transient = transient;
    attach_fake_device(spec, device);  // by reference: not copyable or movable
    run = std::make_unique<ZeroRun>(spec);
    fit_half_the_optimizer_sides(device, ddp());
  }
  HalfFitAutoRun(const HalfFitAutoRun&) = delete;
  HalfFitAutoRun& operator=(const HalfFitAutoRun&) = delete;

  gm::GeminiDDP& ddp() { return ddp_of(*run); }
  int64_t chunks() { return static_cast<int64_t>(ddp().chunks().size()); }
  int64_t device_sides() {
    int64_t n = 0;
    for (const auto& chunk : ddp().chunks()) n += chunk.placement.optim_on_host ? 0 : 1;
    return n;
  }
};

}  // namespace

TEST(GeminiChunks, SearchPicksTheLeastWastefulSize) {
  // From max(min, largest) = 400 up by 100: 400 packs [300][300][400] (200
  // wasted), 1000 packs all three with none wasted; within 200 of the start the
  // first of the equally good 400 and 600 wins.
  const auto best = gm::search_chunk_size({300, 300, 400},
                                          {.min_chunk_numel = 0, .search_range_numel = 600, .search_interval = 100}, 1);
  EXPECT_EQ(best.chunk_numel, 1000);
  EXPECT_EQ(best.wasted_numel, 0);
  const auto near = gm::search_chunk_size({300, 300, 400},
                                          {.min_chunk_numel = 0, .search_range_numel = 200, .search_interval = 100}, 1);
  EXPECT_EQ(near.chunk_numel, 400);
  EXPECT_EQ(near.wasted_numel, 200);
  // dp rounds sizes up; a parameter never straddles chunks.
  const auto two =
      gm::search_chunk_size({7, 7}, {.min_chunk_numel = 0, .search_range_numel = 0, .search_interval = 1}, 4);
  EXPECT_EQ(two.chunk_numel, 8);
  zero::NamedParams params;
  for (int64_t n : {5, 3, 6}) params.emplace_back("p", at::zeros({n}).requires_grad_(true));
  const auto layout = gm::plan_chunks(params, 8, 2, 1);  // rank 1 owns [4, 8) of each chunk
  ASSERT_EQ(layout.buckets.size(), 2u);
  EXPECT_EQ(layout.buckets[0].params, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(layout.slots[0].own_numel, 1);  // element 4 of the first parameter
  EXPECT_EQ(layout.slots[1].own_begin, 0);
  EXPECT_EQ(layout.slots[1].own_numel, 3);
  EXPECT_EQ(layout.slots[2].own_begin, 4);
  EXPECT_EQ(layout.slots[2].own_numel, 2);
  EXPECT_THROW(gm::plan_chunks(params, 4, 2, 0), ConfigError);  // 5 > 4
}

TEST(GeminiChunks, StaticAndAutoPlacement) {
  const auto all_off = gm::static_placement(4, 1.0, 1.0, 1.0);
  for (const auto& c : all_off) EXPECT_TRUE(c.param_on_host && c.optim_on_host && !c.keep_gathered);
  const auto half = gm::static_placement(4, 0.5, 0.5, 0.0);
  EXPECT_TRUE(half[2].keep_gathered && half[3].keep_gathered);
  EXPECT_TRUE(half[0].optim_on_host);
  EXPECT_FALSE(half[1].optim_on_host);  // ceil(0.5 * 2 sharded) = 1
  EXPECT_FALSE(half[2].optim_on_host);  // gathered chunks keep theirs on the device
  const auto none = gm::static_placement(3, 1.0, 0.0, 0.0);
  for (const auto& c : none) EXPECT_EQ(c, gm::ChunkPlacement{});
  // auto: 100 bytes of budget, 20 of working set, shards of 30: two fit; margin
  // 20, optimizer side 16 each.
  const auto a = gm::auto_placement(4, {.device_budget_bytes = 100,
                                        .param_shard_bytes = 30,
                                        .optim_shard_bytes = 16,
                                        .working_bytes = 20,
                                        .gpu_margin_mem_ratio = 1.0});
  EXPECT_FALSE(a[0].param_on_host);
  EXPECT_FALSE(a[1].param_on_host);
  EXPECT_TRUE(a[2].param_on_host && a[3].param_on_host);
  EXPECT_FALSE(a[0].optim_on_host);
  EXPECT_TRUE(a[1].optim_on_host && a[3].optim_on_host);
  // No ratio by default: the measured margin is the optimizer sides' (with
  // room for all parameter shards, a margin of 100 holds four sides of 16;
  // Colossal-AI's default 0.0 would have put all on the host).
  EXPECT_FALSE(gm::GeminiOptions{}.gpu_margin_mem_ratio.has_value());
  const auto d = gm::auto_placement(4, {.device_budget_bytes = 240,
                                        .param_shard_bytes = 30,
                                        .optim_shard_bytes = 16,
                                        .working_bytes = 20});
  for (const auto& c : d) EXPECT_FALSE(c.param_on_host || c.optim_on_host);
  // The non-model peak comes off the budget with kNonModelHeadroom (10%) on
  // top: a peak of 50 takes 55, leaving 45 after the parameters, two sides
  // (the bare peak would have left 50, three).
  const auto peaked = gm::auto_placement(4, {.device_budget_bytes = 240,
                                             .non_model_peak_bytes = 50,
                                             .param_shard_bytes = 30,
                                             .optim_shard_bytes = 16,
                                             .working_bytes = 20});
  EXPECT_EQ(std::count_if(peaked.begin(), peaked.end(), [](const gm::ChunkPlacement& c) { return !c.optim_on_host; }),
            2);
  // A ratio takes that share of the margin, as Colossal-AI's: half of 100
  // holds three sides.
  const auto half_margin = gm::auto_placement(4, {.device_budget_bytes = 240,
                                                  .param_shard_bytes = 30,
                                                  .optim_shard_bytes = 16,
                                                  .working_bytes = 20,
                                                  .gpu_margin_mem_ratio = 0.5});
  EXPECT_EQ(std::count_if(half_margin.begin(), half_margin.end(),
                          [](const gm::ChunkPlacement& c) { return !c.optim_on_host; }),
            3);
  // A host that cannot hold the rest: optimizer sides move to the device, in
  // order, into the whole margin (100 after the parameters), until the rest
  // fits the host (14 bytes a side there) or the margin is full.
  const auto on_device = [](const std::vector<gm::ChunkPlacement>& p) {
    std::vector<bool> where;
    for (const auto& c : p) where.push_back(!c.optim_on_host);
    return where;
  };
  const gm::AutoPlacementInput tight{.device_budget_bytes = 200,  // margin 60; half of it holds one side of 16
                                     .param_shard_bytes = 30,
                                     .optim_shard_bytes = 16,
                                     .working_bytes = 20,
                                     .gpu_margin_mem_ratio = 0.5,
                                     .host_optim_shard_bytes = 14};
  EXPECT_EQ(on_device(gm::auto_placement(4, tight)), (std::vector<bool>{true, false, false, false})) << "no host limit";
  auto roomy = tight;
  roomy.host_budget_bytes = 42;  // the three left fit
  EXPECT_EQ(on_device(gm::auto_placement(4, roomy)), (std::vector<bool>{true, false, false, false}));
  auto host_20 = tight;
  host_20.host_budget_bytes = 20;  // one side fits the host: two more move
  EXPECT_EQ(on_device(gm::auto_placement(4, host_20)), (std::vector<bool>{true, true, true, false}));
  auto host_5 = tight;
  host_5.host_budget_bytes = 5;  // nothing fits the host, but the margin holds only three sides
  EXPECT_EQ(on_device(gm::auto_placement(4, host_5)), (std::vector<bool>{true, true, true, false}));
}

// model, micro-batches, max_norm, variant
class GeminiMatchesSingleProcess : public ::testing::TestWithParam<std::tuple<const char*, int, double, const char*>> {
};

TEST_P(GeminiMatchesSingleProcess, LossCurveFp32AdamW) {
  const auto [model_name, micro, max_norm, variant_name] = GetParam();
  const std::string model = model_name, variant = variant_name;
  RunSpec spec{.model = model, .plugin = "gemini", .micro_batches = micro, .max_norm = max_norm};
  if (variant == "offload") {
    spec.offload_optim_frac = 1.0;
    spec.offload_param_frac = 1.0;
  } else if (variant == "partial") {
    spec.shard_param_frac = 0.5;
    spec.offload_optim_frac = 0.5;
    spec.max_prefetch = 2;
  } else if (variant == "auto") {
    // Room for everything while warming up, none after it: every chunk moves to
    // the host.
    spec.placement_policy = "auto";
    spec.gpu_margin_mem_ratio = 1.0;
    spec.memory_probe = [calls = std::make_shared<int>(0)]() -> std::optional<metrics::DeviceMemory> {
      return metrics::DeviceMemory{.total_bytes = (*calls)++ == 0 ? int64_t{1} << 40 : 0};
    };
  }
  expect_matches_reference(spec, "gemini-" + variant);
}

// Each placement once without accumulation or clipping and once with both,
// for both models (pairs, to keep CI fast: every rank count runs all of it).
INSTANTIATE_TEST_SUITE_P(
    Layouts, GeminiMatchesSingleProcess,
    ::testing::Values(std::make_tuple("gpt2", 1, 0.0, "static"), std::make_tuple("gpt2", 2, 0.5, "static"),
                      std::make_tuple("gpt2", 1, 0.0, "offload"), std::make_tuple("gpt2", 2, 0.5, "offload"),
                      std::make_tuple("gpt2", 2, 0.5, "auto"), std::make_tuple("llama", 1, 0.0, "static"),
                      std::make_tuple("llama", 2, 0.5, "static"), std::make_tuple("llama", 2, 0.5, "offload"),
                      std::make_tuple("llama", 1, 0.0, "auto"), std::make_tuple("llama", 2, 0.5, "partial")),
    [](const auto& info) {
      return std::string(std::get<0>(info.param)) + "_micro" + std::to_string(std::get<1>(info.param)) +
             (std::get<2>(info.param) > 0 ? "_clip_" : "_noclip_") + std::get<3>(info.param);
    });

TEST(Gemini, ParametersHoldNoMemoryBetweenUses) {
  ZeroRun run({.model = "llama", .plugin = "gemini", .max_prefetch = 0});
  auto& ddp = ddp_of(run);
  const size_t chunks = ddp.chunks().size();
  ASSERT_GE(chunks, 4u) << "small chunks: several per model";
  auto ids = bt::global_batch(bt::tiny_llama(), 0).narrow(0, 0, 2);
  auto& model = *run.boosted().model;
  auto logits = model.forward(ids);
  // After forward every chunk is released: the parameters' storage is empty.
  for (const auto& chunk : ddp.chunks()) EXPECT_EQ(chunk.state, gm::Chunk::State::Released);
  for (const auto& p : model.unwrap().parameters()) EXPECT_EQ(p.storage().nbytes(), 0u);
  EXPECT_LT(ddp.max_gathered(), static_cast<int64_t>(chunks)) << "never the whole model at once";
  const int64_t forward_gathers = ddp.gathers();
  EXPECT_GE(forward_gathers, static_cast<int64_t>(chunks));
  run.booster().backward(model.unwrap().loss(logits, ids), *run.boosted().optimizer);
  EXPECT_GT(ddp.gathers(), forward_gathers) << "backward gathers again";
  for (const auto& chunk : ddp.chunks()) EXPECT_EQ(chunk.state, gm::Chunk::State::Released);
  for (const auto& p : model.unwrap().parameters()) EXPECT_FALSE(p.grad().defined()) << "no full gradient kept";
  const auto bytes = ddp.memory_bytes();
  const int64_t shard_bytes = ddp.chunk_numel() / ct::world()->size() * 4;
  EXPECT_EQ(bytes.params_device, static_cast<int64_t>(chunks) * shard_bytes) << "only this rank's shards";
  EXPECT_EQ(bytes.grads_device, static_cast<int64_t>(chunks) * shard_bytes) << "fp32 gradient shards";
  EXPECT_EQ(bytes.masters_device, 0) << "fp32 masters are the shards themselves";
}

TEST(Gemini, StaticOffloadAccounting) {
  ZeroRun run({.model = "gpt2", .plugin = "gemini", .offload_optim_frac = 0.5, .offload_param_frac = 0.5});
  auto& ddp = ddp_of(run);
  const int64_t n = static_cast<int64_t>(ddp.chunks().size());
  const int64_t off = (n + 1) / 2;
  for (int64_t c = 0; c < n; ++c) {
    EXPECT_EQ(ddp.chunks()[c].placement.param_on_host, c < off) << "chunk " << c;
    EXPECT_EQ(ddp.chunks()[c].placement.optim_on_host, c < off) << "chunk " << c;
  }
  run.train(0, 2);
  const auto bytes = optimizer_of(run).memory_bytes();
  const int64_t shard = ddp.chunk_numel() / ct::world()->size() * 4;
  EXPECT_EQ(bytes.params_host, off * shard);
  EXPECT_EQ(bytes.params_device, (n - off) * shard);
  EXPECT_EQ(bytes.grads_host, off * shard);
  EXPECT_EQ(bytes.masters_host + bytes.masters_device, 0) << "fp32: master = shard where both sides agree";
  // AdamW: two moments per element of each rank's part of each parameter.
  EXPECT_GT(bytes.optim_host, 0);
  EXPECT_GT(bytes.optim_device, 0);
  EXPECT_LE(bytes.optim_host, off * shard * 2);
  EXPECT_LE(bytes.optim_device, (n - off) * shard * 2);

  ZeroRun full({.model = "gpt2", .plugin = "gemini", .offload_optim_frac = 1.0, .offload_param_frac = 1.0});
  full.train(0, 2);
  const auto all = optimizer_of(full).memory_bytes();
  EXPECT_EQ(all.device_total(), 0) << "full offload: nothing stays on the device between steps";
  EXPECT_GT(all.optim_host, 0);
}

TEST(Gemini, AutoPolicyPlacesByTracedWarmup) {
  // Capacity for half the parameter shards after the working set and a fixed
  // non-model amount; optimizer shards into what is left.
  FakeDevice device{.non_model = 4096};
  RunSpec spec{.model = "llama", .plugin = "gemini", .placement_policy = "auto"};
  attach_fake_device(spec, device);
  ZeroRun run(spec);
  auto& ddp = ddp_of(run);
  const int64_t n = static_cast<int64_t>(ddp.chunks().size());
  const int64_t chunk_bytes = ddp.chunk_numel() * 4, shard = chunk_bytes / ct::world()->size();
  size_t widest = 0;
  for (const auto& s : ddp.segment_chunks()) widest = std::max(widest, s.size());
  const int64_t working = static_cast<int64_t>(2 * widest) * chunk_bytes;
  const int64_t keep = n / 2;
  // budget = 0.9 * capacity - non_model (with its headroom) = working + keep
  // shards (+ half a shard of slack)
  device.capacity =
      static_cast<int64_t>(static_cast<double>(working + keep * shard + shard / 2 + charged(device.non_model)) / 0.9) +
      1;
  device.ddp = &ddp;
  EXPECT_TRUE(ddp.warming_up());
  const auto first = run.train(0, 1);
  EXPECT_FALSE(ddp.warming_up());
  EXPECT_EQ(ddp.peak_non_model_bytes(), device.non_model);
  for (int64_t c = 0; c < n; ++c) EXPECT_EQ(ddp.chunks()[c].placement.param_on_host, c >= keep) << "chunk " << c;
  // The margin (half a shard) holds no optimizer side (16 bytes per element).
  for (const auto& chunk : ddp.chunks()) EXPECT_TRUE(chunk.placement.optim_on_host);
  // And it still trains as one process.
  const auto& reference = cached_reference(spec);
  auto losses = first;
  for (double loss : run.train(1, bt::kSteps)) losses.push_back(loss);
  EXPECT_LE(worst_rel_diff(losses, reference), 1e-5);
}

// The warm-up traces each stretch's peak, not only the bytes at the segment
// boundaries: a transient amount that lives and dies between two boundaries
// (the fake's model of attention's or the loss's temporaries; as large as all
// optimizer sides) counts as non-model memory, and the optimizer sides that
// fit beside it, half of them here, go to the device; sampled at the
// boundaries alone, the trace missed it and the policy put every optimizer
// side there. The run trains as the optimizer on the device does, bit for bit.
TEST(Gemini, AutoPolicyCountsTheTransientPeakBetweenBoundaries) {
  RunSpec spec{.model = "llama", .plugin = "gemini", .max_norm = 0.5, .optimizer = "hybrid_adam",
               .precision = "bf16"};
  ZeroRun on_device(spec);
  const auto expected = on_device.train(0, bt::kSteps);
  HalfFitAutoRun probe_run(spec);  // for the chunk sizes
  const int64_t shard_numel = probe_run.ddp().chunk_numel() / ct::world()->size();
  const int64_t transient = probe_run.chunks() * shard_numel * 16;  // as much as every optimizer side
  HalfFitAutoRun placed(spec, transient);
  const auto losses = placed.run->train(0, bt::kSteps);
  EXPECT_EQ(placed.ddp().peak_non_model_bytes(), placed.device.non_model + transient);
  EXPECT_EQ(placed.device_sides(), placed.chunks() / 2);
  ASSERT_EQ(losses.size(), expected.size());
  for (size_t step = 0; step < losses.size(); ++step) EXPECT_EQ(losses[step], expected[step]) << "step " << step;
}

// The auto policy's host limit end to end: with gpu_margin_mem_ratio 0 every
// optimizer side would stay on the host; a host budget of one byte moves as
// many to the device as its margin holds (half here), a roomy one none, and
// both train as the optimizer on the device does, bit for bit (the host step
// is exact: Bf16HostStepEqualsTheGradientShardPathBitForBit).
TEST(Gemini, AutoPolicyMovesOptimizerSidesOffAFullHost) {
  const RunSpec base{.model = "llama", .plugin = "gemini", .max_norm = 0.5, .optimizer = "hybrid_adam",
                     .precision = "bf16"};
  ZeroRun on_device(base);
  const auto expected = on_device.train(0, bt::kSteps);
  for (const int64_t host_budget : {int64_t{1}, int64_t{1} << 40}) {
    RunSpec spec = base;
    spec.gpu_margin_mem_ratio = 0.0;
    spec.host_budget_probe = [host_budget] { return host_budget; };
    HalfFitAutoRun placed(spec);
    const auto losses = placed.run->train(0, bt::kSteps);
    EXPECT_EQ(placed.device_sides(), host_budget == 1 ? placed.chunks() / 2 : 0) << "host budget " << host_budget;
    ASSERT_EQ(losses.size(), expected.size());
    for (size_t step = 0; step < losses.size(); ++step) {
      EXPECT_EQ(losses[step], expected[step]) << "host budget " << host_budget << ", step " << step;
    }
  }
}

TEST(Gemini, CpuAdamStepsOffloadedChunksAndBf16Trains) {
  expect_matches_reference({.model = "llama",
                            .plugin = "gemini",
                            .micro_batches = 2,
                            .max_norm = 0.5,
                            .optimizer = "hybrid_adam",
                            .offload_optim_frac = 1.0},
                           "gemini-offload hybrid_adam");
  const auto& reference = cached_reference({.model = "gpt2"});
  ZeroRun run({.model = "gpt2", .plugin = "gemini", .precision = "bf16", .offload_optim_frac = 1.0});
  const auto losses = run.train(0, bt::kSteps);
  EXPECT_LE(worst_rel_diff(losses, reference), 3e-2);
  EXPECT_LT(losses.back(), losses.front());
}

// ZeRO-Offload's bf16 host step (HybridAdam, fp32 masters): chunks whose
// optimizer side is on the host keep 2 bytes of gradient a parameter there
// (host_io) instead of a 4-byte fp32 shard, and step through the fused bf16
// CPU kernel with the clip factor from norms taken at the end of backward.
// It must train exactly as the fp32 gradient-shard path does: all chunks on
// the device (the inner step), half of them, and all on the host give the
// same losses and norms, bit for bit, with the CPU Adam overlapping the next
// forward, and so does the auto policy moving
// half the chunks to the device after its warm-up. Gradient accumulation:
// Bf16HostStepAccumulatesOnTheHostBitForBit.
TEST(Gemini, Bf16HostStepEqualsTheGradientShardPathBitForBit) {
  const RunSpec base{.model = "llama", .plugin = "gemini", .max_norm = 0.5, .optimizer = "hybrid_adam",
                     .precision = "bf16"};
  ZeroRun on_device(base);
  const auto expected = on_device.train(0, bt::kSteps);
  const double expected_norm = optimizer_of(on_device).last_grad_norm();
  const int64_t device_grad_bytes = optimizer_of(on_device).memory_bytes().grads_device;
  EXPECT_TRUE(ddp_of(on_device).host_step_enabled());
  // The last step's host updates run on the worker after step() returned: a forward right after it must see them (its
  // gathers wait for them).
  const at::Tensor ids = bt::global_batch(bt::tiny_llama(), 0).narrow(0, 0, 2);
  const auto logits_after = [&](ZeroRun& run) {
    at::NoGradGuard no_grad;
    return run.boosted().model->forward(ids);
  };
  const at::Tensor expected_logits = logits_after(on_device);
  for (double frac : {0.5, 1.0}) {
    RunSpec spec = base;
    spec.offload_optim_frac = frac;
    ZeroRun offloaded(spec);
    auto& ddp = ddp_of(offloaded);
    ASSERT_TRUE(ddp.host_step_enabled());
    int64_t host_chunks = 0;
    for (const auto& chunk : ddp.chunks()) {
      EXPECT_EQ(ddp.host_steps(chunk), chunk.placement.optim_on_host);
      EXPECT_EQ(chunk.host_io.defined(), chunk.placement.optim_on_host);
      EXPECT_NE(chunk.grad_shard.defined(), chunk.placement.optim_on_host);
      host_chunks += chunk.placement.optim_on_host ? 1 : 0;
    }
    EXPECT_GT(host_chunks, 0);
    const auto losses = offloaded.train(0, bt::kSteps);
    ASSERT_EQ(losses.size(), expected.size());
    for (size_t step = 0; step < losses.size(); ++step) {
      EXPECT_EQ(losses[step], expected[step]) << "offload_optim_frac " << frac << ", step " << step;
    }
    EXPECT_EQ(optimizer_of(offloaded).last_grad_norm(), expected_norm) << "offload_optim_frac " << frac;
    EXPECT_TRUE(at::equal(logits_after(offloaded), expected_logits)) << "offload_optim_frac " << frac;
    EXPECT_LT(losses.back(), losses.front());
    if (frac == 1.0) {
      const auto bytes = optimizer_of(offloaded).memory_bytes();
      EXPECT_EQ(bytes.grads_host * 2, device_grad_bytes) << "bf16 host_io in place of fp32 gradient shards";
      EXPECT_EQ(bytes.grads_device, 0);
    }
  }
  // auto: the warm-up steps every chunk on the host; then about half the
  // optimizer sides move to the device, their gradients with them.
  RunSpec auto_spec = base;
  auto_spec.gpu_margin_mem_ratio = 1.0;
  HalfFitAutoRun placed(auto_spec);
  const auto placed_losses = placed.run->train(0, bt::kSteps);
  for (const auto& chunk : placed.ddp().chunks()) EXPECT_EQ(chunk.host_io.defined(), chunk.placement.optim_on_host);
  EXPECT_EQ(placed.device_sides(), placed.chunks() / 2);
  for (size_t step = 0; step < placed_losses.size(); ++step) {
    EXPECT_EQ(placed_losses[step], expected[step]) << "auto, step " << step;
  }
}

// The host step with gradient accumulation: each micro-batch's bf16 gradient
// is summed on the host into an fp32 host_grad by HostWorker's thread,
// the statistics come from those sums and the CPU Adam reads them. It must
// train as the fp32 gradient-shard path does (every chunk on the device),
// bit for bit, with and without clipping, for half and all of the chunks on
// the host, and when the auto policy moves chunks (and their partial sums)
// to the device after the warm-up; the host holds 6 bytes of gradient a
// parameter (bf16 landing buffer + fp32 sum).
TEST(Gemini, Bf16HostStepAccumulatesOnTheHostBitForBit) {
  for (double max_norm : {0.0, 0.5}) {
    const RunSpec base{.model = "llama", .plugin = "gemini", .micro_batches = 3, .max_norm = max_norm,
                       .optimizer = "hybrid_adam", .precision = "bf16"};
    ZeroRun on_device(base);
    const auto expected = on_device.train(0, bt::kSteps);
    const double expected_norm = optimizer_of(on_device).last_grad_norm();
    const int64_t device_grad_bytes = optimizer_of(on_device).memory_bytes().grads_device;
    for (double frac : {0.5, 1.0}) {
      RunSpec spec = base;
      spec.offload_optim_frac = frac;
      ZeroRun offloaded(spec);
      auto& ddp = ddp_of(offloaded);
      ASSERT_TRUE(ddp.host_step_enabled());
      for (const auto& chunk : ddp.chunks()) {
        EXPECT_EQ(chunk.host_grad.defined(), chunk.placement.optim_on_host);
      }
      const auto losses = offloaded.train(0, bt::kSteps);
      ASSERT_EQ(losses.size(), expected.size());
      for (size_t step = 0; step < losses.size(); ++step) {
        EXPECT_EQ(losses[step], expected[step]) << "max_norm " << max_norm << ", frac " << frac << ", step " << step;
      }
      if (max_norm > 0.0) {
        EXPECT_EQ(optimizer_of(offloaded).last_grad_norm(), expected_norm) << "frac " << frac;
      }
      EXPECT_LT(losses.back(), losses.front());
      if (frac == 1.0) {
        const auto bytes = optimizer_of(offloaded).memory_bytes();
        EXPECT_EQ(bytes.grads_host * 4, device_grad_bytes * 6) << "bf16 host_io + fp32 host_grad a parameter";
      }
    }
    RunSpec auto_spec = base;
    auto_spec.gpu_margin_mem_ratio = 1.0;
    HalfFitAutoRun placed(auto_spec);
    const auto placed_losses = placed.run->train(0, bt::kSteps);
    for (const auto& chunk : placed.ddp().chunks()) {
      EXPECT_EQ(chunk.host_grad.defined(), chunk.placement.optim_on_host);
    }
    EXPECT_GT(placed.device_sides(), 0);
    EXPECT_LT(placed.device_sides(), placed.chunks());
    for (size_t step = 0; step < placed_losses.size(); ++step) {
      EXPECT_EQ(placed_losses[step], expected[step]) << "auto, max_norm " << max_norm << ", step " << step;
    }
  }
}

// fp8_communication: the sharded chunks are all-gathered for forward and
// backward, and the gradients reduce-scattered, in e4m3 (one scale a chunk
// and rank). The curve stays near bf16 communication's, the shards (the
// exact values) are untouched by the gathers, every rank computes with the
// same weights, and a forward sends about half the bytes of its bf16 gathers.
// Kept-gathered chunks (shard_param_frac < 1, fp32 shards aliasing their
// masters) still gather in their dtype, so their masters stay exact.
TEST(Gemini, Fp8CommunicationTracksBf16AndLeavesShardsExact) {
  auto world = ct::world();
  const RunSpec plain_spec{.model = "gpt2", .plugin = "gemini", .precision = "bf16"};
  RunSpec fp8_spec = plain_spec;
  fp8_spec.fp8_communication = true;
  ZeroRun plain(plain_spec), fp8(fp8_spec);
  const auto expected = plain.train(0, bt::kSteps);
  const auto losses = fp8.train(0, bt::kSteps);
  const double worst = worst_rel_diff(losses, expected);
  EXPECT_LE(worst, 3e-2);
  EXPECT_GT(worst, 0.0) << "fp8 communication should change the curve a little";
  EXPECT_LT(losses.back(), losses.front());

  auto& ddp = ddp_of(fp8);
  ASSERT_GE(ddp.chunks().size(), 2u);
  std::vector<at::Tensor> shards;
  for (const auto& chunk : ddp.chunks()) shards.push_back(chunk.shard.clone());
  auto ids = bt::global_batch(bt::tiny_gpt2(), 0).narrow(0, 0, 2);
  const auto before = cluster::fp8_wire_bytes_sent();
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = fp8.boosted().model->forward(ids);
  }
  const auto after = cluster::fp8_wire_bytes_sent();
  for (size_t c = 0; c < shards.size(); ++c) EXPECT_TRUE(at::equal(shards[c], ddp.chunks()[c].shard)) << "chunk " << c;
  at::Tensor from_zero = logits.clone();
  world->broadcast(from_zero, 0).wait();
  EXPECT_TRUE(at::equal(from_zero, logits)) << "ranks computed with different weights";
  if (world->size() > 1) {
    const double ratio = static_cast<double>(after.fp8 - before.fp8) / static_cast<double>(after.plain - before.plain);
    EXPECT_NEAR(ratio, 0.5, 0.01);
    if (world->rank() == 0) {
      std::printf("gemini bf16 fp8 communication, %d ranks: max rel diff vs bf16 communication %.2e; a forward sends "
                  "%lld bytes vs %lld in bf16 (%.4f)\n",
                  world->size(), worst, static_cast<long long>(after.fp8 - before.fp8),
                  static_cast<long long>(after.plain - before.plain), ratio);
    }
  }
  RunSpec kept = {.model = "gpt2", .plugin = "gemini", .precision = "fp32", .shard_param_frac = 0.5};
  const auto kept_expected = cached_reference(kept);
  kept.fp8_communication = true;
  ZeroRun kept_run(kept);
  EXPECT_LE(worst_rel_diff(kept_run.train(0, bt::kSteps), kept_expected), 3e-2);
}

TEST(Gemini, BadOptionsAreConfigErrors) {
  auto expect_error = [](booster::GeminiPluginOptions options, const std::string& needle) {
    try {
      options.validate();
      ADD_FAILURE() << "no ConfigError for " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({.gemini = {.placement_policy = "cuda"}}, "placement_policy='cuda'");
  expect_error({.gemini = {.shard_param_frac = 1.5}}, "shard_param_frac=1.5");
  expect_error({.gemini = {.offload_optim_frac = -0.1}}, "offload_optim_frac=-0.1");
  expect_error({.gemini = {.placement_policy = "auto", .offload_optim_frac = 1.0}}, "only apply to placement_policy='static'");
  // Under static, anything but the default margin ratio would do nothing.
  expect_error({.gemini = {.gpu_margin_mem_ratio = 0.0}}, "only applies to placement_policy='auto'");
  expect_error({.gemini = {.gpu_margin_mem_ratio = 0.9}}, "only applies to placement_policy='auto'");
  expect_error({.gemini = {.shard_param_frac = 0.5, .offload_param_frac = 0.5}}, "needs shard_param_frac=1.0");
  expect_error({.gemini = {.steady_cuda_cap_ratio = 0.0}}, "steady_cuda_cap_ratio=0");
  expect_error({.gemini = {.precision = "fp8"}}, "precision='fp8'");
  expect_error({.gemini = {.max_prefetch = -1}}, "max_prefetch=-1");
  expect_error({.gemini = {.precision = "fp16", .master_weights = false}}, "master_weights=false");
  expect_error({.gemini = {.loss_scaler = {.initial_scale = 0}}}, "initial_scale");
  expect_error({.gemini = {.precision = "fp16", .fp8_communication = true}}, "fp8_communication with precision 'fp16'");
  // Accumulating without the option is refused, not silently wrong.
  ZeroRun run({.model = "gpt2", .plugin = "gemini"});
  EXPECT_THROW(run.booster().no_sync(*run.boosted().model), ConfigError);
}

TEST(Gemini, CheckpointIsHfAndReshards) {
  constexpr int64_t kSaveAt = 10;
  bt::SharedScratch scratch("gemini_ckpt");
  const RunSpec spec{
      .model = "llama", .plugin = "gemini", .micro_batches = 2, .max_norm = 0.5, .offload_optim_frac = 0.5};
  const auto uninterrupted = ZeroRun(spec).train(0, bt::kSteps);
  const std::string dir = scratch.path("gemini");
  {
    ZeroRun saver(spec);
    saver.train(0, kSaveAt);
    saver.save(dir);
  }
  const auto model_state = checkpoint::load_state_dict(dir);
  EXPECT_EQ(model_state.at("model.embed_tokens.weight").sizes(), (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(checkpoint::load_state_dict(dir, "optimizer").at("state.0.exp_avg").sizes(),
            (std::vector<int64_t>{96, 32}));
  {  // Same layout: bit for bit.
    ZeroRun same(spec);
    same.load(dir);
    const auto resumed = same.train(kSaveAt, bt::kSteps);
    for (size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], uninterrupted[kSaveAt + i]) << "step " << i;
  }
  {  // Gemini on each rank alone, fully offloaded.
    auto self = ct::world()->split(ct::world()->rank(), 0, "self");
    RunSpec one = spec;
    one.offload_optim_frac = 1.0;
    one.offload_param_frac = 1.0;
    ZeroRun alone(one, self);
    alone.load(dir);
    const auto resumed = alone.train(kSaveAt, bt::kSteps);
    const std::vector<double> tail(uninterrupted.begin() + kSaveAt, uninterrupted.end());
    EXPECT_LE(worst_rel_diff(resumed, tail), 1e-5);
  }
  {  // ZeRO-2 and the plain model read it too.
    RunSpec zero = spec;
    zero.plugin = "zero";
    ZeroRun run(zero);
    run.load(dir);
    const auto resumed = run.train(kSaveAt, bt::kSteps);
    const std::vector<double> tail(uninterrupted.begin() + kSaveAt, uninterrupted.end());
    EXPECT_LE(worst_rel_diff(resumed, tail), 1e-5);
  }
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
