// HybridParallelPlugin against one process: 20 AdamW steps (warmup + cosine)
// on the same global batch give the same loss curve (fp32, 1e-5 relative) for
// every tp that divides the world (tp x dp on 4 ranks), GPT-2, LLaMA with
// GQA (kv heads < tp at tp 4), Qwen2, Qwen3, Gemma 2/3 and Phi-3, with clipping counted once per element; ZeRO-1/2
// with tp 2 x dp 2 (fp32, clipped, split_gather; bf16 against the
// single-process bf16 run, fp16); a tp=2 checkpoint resumes exactly with tp=1
// and loads in Hugging Face transformers (GPT-2, LLaMA, Phi-3's fused names).
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/booster/tp_clip_optimizer.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/models/lazy_init.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/lr_scheduler.h"
#include "colossus/zero/low_level/low_level_zero_optimizer.h"
#include "tests/booster/booster_testing.h"
#include "tests/testing/command.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>

using namespace colossus;
using namespace colossus::booster::testing;
namespace ct = colossus::testing;

namespace {

// A run through the Booster with HybridParallelPlugin; model seed 7, AdamW and
// schedule as booster_testing's reference_losses.
class HybridRun {
 public:
  // lazy: built on the meta device, each rank reading its tp slices from the
  // same seeded init (Booster param_source).
  // checkpoint: the weights come from this HF directory instead.
  HybridRun(const models::ModelConfig& config, booster::HybridParallelPluginOptions options, bool lazy = false,
            const std::string& checkpoint = "")
      : config_(config) {
    plugin_ = std::make_shared<booster::HybridParallelPlugin>(std::move(options), ct::world());
    booster_ = std::make_unique<booster::Booster>(plugin_);
    auto model = lazy                 ? models::create_lazy_model(config)
                 : checkpoint.empty() ? models::create_model(config, {.seed = 7})
                                      : models::load_pretrained(checkpoint);
    auto optimizer =
        std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01});
    auto scheduler = std::make_shared<optim::CosineWarmupLR>(
        *optimizer, optim::CosineLROptions{.warmup_steps = 4, .total_steps = kSteps});
    models::ParamSource source;
    if (lazy) source = checkpoint.empty() ? models::seeded_source(model, 7) : models::checkpoint_source(*model, checkpoint);
    boosted_ = booster_->boost(model, std::move(optimizer), scheduler, /*dataloader=*/nullptr, source);
  }

  // packed: the rows of booster_testing's packed_layout / packed_labels.
  double train_step(int64_t step, bool packed = false) {
    auto dp = plugin_->dp_group();
    const int64_t rows = kGlobalBatch / dp->size();
    auto ids = global_batch(config_, step).narrow(0, dp->rank() * rows, rows);
    auto& model = *boosted_.model;
    auto loss = packed ? model.loss(model.forward(ids, packed_layout(rows)), packed_labels(ids))
                       : model.loss(model.forward(ids), ids);
    booster_->backward(loss, *boosted_.optimizer);
    boosted_.optimizer->step();
    boosted_.lr_scheduler->step();
    boosted_.optimizer->zero_grad();
    auto total = at::full({1}, loss.item<double>(), at::kDouble);
    dp->all_reduce(total).wait();
    return total.item<double>() / dp->size();
  }
  std::vector<double> train(int64_t first, int64_t end, bool packed = false) {
    std::vector<double> losses;
    for (int64_t step = first; step < end; ++step) losses.push_back(train_step(step, packed));
    return losses;
  }

  booster::Booster& booster() { return *booster_; }
  booster::Boosted& boosted() { return boosted_; }

 private:
  models::ModelConfig config_;
  std::shared_ptr<booster::HybridParallelPlugin> plugin_;
  std::unique_ptr<booster::Booster> booster_;
  booster::Boosted boosted_;
};

double worst_rel_diff(const std::vector<double>& got, const std::vector<double>& reference) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size() && i < reference.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - reference[i]) / std::abs(reference[i]));
  }
  return worst;
}

void expect_curve(const std::vector<double>& got, const std::vector<double>& reference, const std::string& what) {
  ASSERT_EQ(got.size(), reference.size()) << what;
  const double worst = worst_rel_diff(got, reference);
  EXPECT_LE(worst, 1e-5) << what;
  if (ct::world()->rank() == 0) {
    std::printf("%s on %d rank(s): loss %.6f -> %.6f, max rel diff vs 1 process %.2e\n", what.c_str(),
                ct::world()->size(), got.front(), got.back(), worst);
  }
}

std::vector<int> tp_sizes() {
  std::vector<int> sizes;
  for (int tp : {1, 2, 4}) {
    if (ct::world()->size() % tp == 0) sizes.push_back(tp);
  }
  return sizes;
}

}  // namespace

TEST(HybridParallel, LossCurvesMatchSingleProcess) {
  // Qwen2's q/k/v biases split with their heads; Qwen3's per-head q/k norms
  // stay whole with their gradients summed over tp; Gemma 2's soft caps (the
  // final one on the vocab-parallel tied head) and its window over layer 0;
  // Gemma 3's (1 + w) q/k norms (head-local like Qwen3's) and two RoPE bases;
  // Phi-3's longrope (long_factor set).
  for (const auto& config : {tiny_gpt2(), tiny_llama(), tiny_family("qwen2-tiny"), tiny_family("qwen3-tiny"),
                             tiny_family("gemma2-tiny"), tiny_family("gemma3-tiny"), tiny_phi3()}) {
    const auto reference = reference_losses(config, kSteps);
    for (int tp : tp_sizes()) {
      HybridRun run(config, {.tp_size = tp});
      expect_curve(run.train(0, kSteps), reference,
                   fmt::format("{} tp{} x dp{}", models::model_type(config), tp, ct::world()->size() / tp));
    }
  }
}

// Packed rows (two documents and padding a row, positions restarting): the
// same curve as one process at every tp, also with the sequence sharded
// between tp regions (split_gather).
TEST(HybridParallel, PackedRowsMatchSingleProcess) {
  // Learned positions (GPT-2) and RoPE (LLaMA); every family's layout
  // against transformers is in tests/models/parity_test.cpp.
  for (const auto& config : {tiny_gpt2(), tiny_llama()}) {
    const auto reference = reference_losses_packed(config, kSteps);
    for (int tp : tp_sizes()) {
      HybridRun run(config, {.tp_size = tp});
      expect_curve(run.train(0, kSteps, /*packed=*/true), reference,
                   fmt::format("{} packed tp{} x dp{}", models::model_type(config), tp, ct::world()->size() / tp));
    }
    if (ct::world()->size() % 2 == 0) {
      HybridRun run(config, {.tp_size = 2, .enable_sequence_parallelism = true, .sequence_parallelism_mode = "split_gather"});
      expect_curve(run.train(0, kSteps, /*packed=*/true), reference,
                   fmt::format("{} packed tp2 split_gather", models::model_type(config)));
    }
  }
}

// The norm counts replicated parameters (LayerNorms, wpe, row biases) once,
// not tp times, so clipping matches the single process; with dp inside too.
TEST(HybridParallel, ClippedCurveMatchesSingleProcess) {
  const int tp = ct::world()->size() >= 2 ? 2 : 1;
  const auto reference = reference_losses(tiny_gpt2(), kSteps, /*max_norm=*/0.3);
  HybridRun run(tiny_gpt2(), {.tp_size = tp, .max_norm = 0.3, .dp_outside = false});
  auto* clip = dynamic_cast<booster::TPClipOptimizer*>(run.boosted().optimizer.get());
  ASSERT_NE(clip, nullptr);
  const auto losses = run.train(0, kSteps);
  EXPECT_GT(clip->last_grad_norm(), 0.0);
  expect_curve(losses, reference, fmt::format("gpt2 clipped 0.3 tp{} (mesh tp, dp)", tp));
}

// bf16 / fp16 (dynamic loss scaling) through the plugin: fp32 masters start at
// the exact init, the model runs in low precision, and the curve stays near
// fp32 (the DDP tests' tolerance); fp16 with clipping exercises the scaled path.
TEST(HybridParallel, Bf16AndFp16StayNearFp32) {
  const int tp = ct::world()->size() >= 2 ? 2 : 1;
  const auto reference = reference_losses(tiny_llama(), kSteps);
  for (const std::string precision : {"bf16", "fp16"}) {
    HybridRun run(tiny_llama(), {.tp_size = tp, .precision = precision, .max_norm = precision == "fp16" ? 10.0 : 0.0});
    auto* mixed = dynamic_cast<amp::MixedPrecisionOptimizer*>(run.boosted().optimizer.get());
    ASSERT_NE(mixed, nullptr);
    for (const auto& p : run.boosted().model->unwrap().parameters()) EXPECT_NE(p.scalar_type(), at::kFloat);
    for (const auto& m : mixed->master_params()) EXPECT_EQ(m.scalar_type(), at::kFloat);
    const auto losses = run.train(0, kSteps);
    ASSERT_EQ(losses.size(), reference.size());
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], reference[i], 2e-2 * reference[i]) << precision << " step " << i;
    if (ct::world()->rank() == 0) {
      std::printf("llama %s tp%d: loss %.4f -> %.4f, max rel diff vs fp32 %.2e\n", precision.c_str(), tp,
                  losses.front(), losses.back(), worst_rel_diff(losses, reference));
    }
  }
}

// ZeRO with tensor parallelism and no pipeline (tp 2 x dp 2): the optimizer
// state and fp32 masters are sharded over dp, the zero optimizer
// reduce-scatters the gradients from its hooks (the model's dp reducers are
// gone) and all-gathers the parameters; the curve is the single process's.
// So with ZeRO-2, and with split_gather, whose tp-replicated gradients (GPT-2's
// wpe, LayerNorms) the zero optimizer sums over tp.
TEST(HybridParallel, ZeroWithTpMatchesSingleProcess) {
  if (ct::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks (tp 2 x dp 2)";
  for (const auto& config : {tiny_gpt2(), tiny_llama()}) {
    const auto reference = reference_losses(config, kSteps);
    HybridRun run(config, {.tp_size = 2, .zero_stage = 1});
    ASSERT_NE(dynamic_cast<zero::LowLevelZeroOptimizer*>(run.boosted().optimizer.get()), nullptr);
    expect_curve(run.train(0, kSteps), reference, models::model_type(config) + " zero1 tp2 x dp2");
  }
  HybridRun zero2(tiny_llama(), {.tp_size = 2, .zero_stage = 2});
  expect_curve(zero2.train(0, kSteps), reference_losses(tiny_llama(), kSteps), "llama zero2 tp2 x dp2");
  HybridRun qwen3_zero2(tiny_family("qwen3-tiny"), {.tp_size = 2, .zero_stage = 2});
  expect_curve(qwen3_zero2.train(0, kSteps), reference_losses(tiny_family("qwen3-tiny"), kSteps),
               "qwen3 zero2 tp2 x dp2");
  HybridRun split(tiny_gpt2(), {.tp_size = 2,
                                .enable_sequence_parallelism = true,
                                .sequence_parallelism_mode = "split_gather",
                                .zero_stage = 1});
  expect_curve(split.train(0, kSteps), reference_losses(tiny_gpt2(), kSteps), "gpt2 zero1 tp2 x dp2 split_gather");
}

// Lazy init: each rank reads its tp slices from the source instead of slicing
// a whole model: the eager curves bit for bit (tp over the world; on 4 ranks
// also tp 2 x dp 2 with ZeRO-1 in bf16). From a bf16 checkpoint, bf16 training
// reads the parameters in bf16 directly (no fp32 copy) with the masters at
// the file's values, as eager loading gives.
TEST(HybridParallel, LazyInitTrainsTheEagerCurve) {
  const int world = ct::world()->size();
  std::vector<std::pair<models::ModelConfig, booster::HybridParallelPluginOptions>> layouts = {
      {tiny_llama(), {.tp_size = world}}, {tiny_gpt2(), {.tp_size = world}}};
  if (world == 4) layouts.push_back({tiny_llama(), {.tp_size = 2, .zero_stage = 1, .precision = "bf16"}});
  auto expect_same = [](const std::vector<double>& got, const std::vector<double>& expected, const std::string& what) {
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << what << " step " << i;
  };
  for (const auto& [config, options] : layouts) {
    const auto eager = HybridRun(config, options).train(0, kSteps);
    expect_same(HybridRun(config, options, /*lazy=*/true).train(0, kSteps), eager,
                fmt::format("{} tp {} zero {} {}", models::model_type(config), options.tp_size, options.zero_stage,
                            options.precision));
  }
  SharedScratch scratch("tp_lazy_bf16");
  if (ct::world()->rank() == 0) {
    auto model = models::create_model(tiny_llama(), {.seed = 7, .dtype = at::kBFloat16});
    models::save_pretrained(*model, scratch.path("model"));
  }
  barrier();
  const booster::HybridParallelPluginOptions bf16{.tp_size = world, .precision = "bf16"};
  const auto eager = HybridRun(tiny_llama(), bf16, /*lazy=*/false, scratch.path("model")).train(0, kSteps);
  HybridRun lazy(tiny_llama(), bf16, /*lazy=*/true, scratch.path("model"));
  for (const auto& p : lazy.boosted().model->unwrap().parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  expect_same(lazy.train(0, kSteps), eager, "llama bf16 checkpoint, tp over the world");
  barrier();
}

// The zero optimizer's norm is the whole model's: squares summed over the dp
// shards and the tp slices, tp-replicated parameters counted once; a tight
// clip gives the single-process clipped curve.
TEST(HybridParallel, ZeroClippedCurveMatchesSingleProcess) {
  if (ct::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks (tp 2 x dp 2)";
  constexpr double kMaxNorm = 1.0;
  const auto reference = reference_losses(tiny_gpt2(), kSteps, kMaxNorm);
  HybridRun run(tiny_gpt2(), {.tp_size = 2, .zero_stage = 1, .max_norm = kMaxNorm});
  auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(run.boosted().optimizer.get());
  ASSERT_NE(zero, nullptr);
  std::vector<double> losses;
  int clipped_steps = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    losses.push_back(run.train_step(step));
    clipped_steps += zero->last_grad_norm() > kMaxNorm;
  }
  EXPECT_GT(clipped_steps, 0) << "the clip should be active";
  expect_curve(losses, reference,
               fmt::format("gpt2 zero1 tp2 x dp2 clipped {} ({} of {} steps clipped)", kMaxNorm, clipped_steps,
                           kSteps));
}

// bf16 under ZeRO with tp: fp32 masters in the shards starting at the exact
// init, so the curve tracks the single-process bf16 mixed-precision run; fp16
// (dynamic loss scaling, clipped) stays near fp32 and every rank of the mesh
// ends with the same loss scale (overflowing steps skipped everywhere).
TEST(HybridParallel, ZeroMixedPrecisionWithTp) {
  if (ct::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks (tp 2 x dp 2)";
  const auto bf16_reference = reference_losses_bf16(tiny_llama(), kSteps);
  HybridRun bf16(tiny_llama(), {.tp_size = 2, .zero_stage = 1, .precision = "bf16"});
  for (const auto& p : bf16.boosted().model->unwrap().parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  const auto losses = bf16.train(0, kSteps);
  ASSERT_EQ(losses.size(), bf16_reference.size());
  for (size_t i = 0; i < losses.size(); ++i)
    EXPECT_NEAR(losses[i], bf16_reference[i], 2e-3 * bf16_reference[i]) << "bf16 step " << i;
  if (ct::world()->rank() == 0) {
    std::printf("llama bf16 zero1 tp2 x dp2: loss %.4f -> %.4f, max rel diff vs 1-process bf16 %.2e\n",
                losses.front(), losses.back(), worst_rel_diff(losses, bf16_reference));
  }
  const auto reference = reference_losses(tiny_llama(), kSteps);
  HybridRun fp16(tiny_llama(), {.tp_size = 2, .zero_stage = 1, .precision = "fp16", .max_norm = 10.0});
  auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(fp16.boosted().optimizer.get());
  ASSERT_NE(zero, nullptr);
  const auto fp16_losses = fp16.train(0, kSteps);
  for (size_t i = 0; i < fp16_losses.size(); ++i)
    EXPECT_NEAR(fp16_losses[i], reference[i], 2e-2 * reference[i]) << "fp16 step " << i;
  at::Tensor scale = at::full({2}, zero->loss_scale(), at::kDouble);
  scale[1].mul_(-1.0);
  ct::world()->all_reduce(scale, cluster::ReduceOp::Max).wait();
  EXPECT_EQ(scale[0].item<double>(), -scale[1].item<double>()) << "the loss scale differs between ranks";
}

// Saved with tp = 2, resumed with tp = 1 (dp = world): the continued curve is
// the uninterrupted single-process one; the model directory keeps the true
// vocab and transformers computes our loss on it.
TEST(HybridParallel, Tp2CheckpointResumesWithTp1AndLoadsInTransformers) {
  auto world = ct::world();
  if (world->size() < 2) GTEST_SKIP() << "needs 2 ranks for tp = 2";
  // Phi-3: the tp shards of q/k/v and gate/up are gathered, then fused into
  // the qkv_proj / gate_up_proj that transformers loads (and split on resume).
  for (const auto& config : {tiny_gpt2(), tiny_llama(), tiny_phi3()}) {
    const std::string kind = models::model_type(config);
    const auto reference = reference_losses(config, kSteps);
    SharedScratch scratch("tp_" + kind);
    const std::string dir = scratch.path("step10");
    {
      HybridRun run(config, {.tp_size = 2});
      run.train(0, 10);
      run.booster().save_model(*run.boosted().model, dir);
      run.booster().save_optimizer(*run.boosted().optimizer, dir);
      run.booster().save_lr_scheduler(*run.boosted().lr_scheduler, scratch.path("step10/scheduler.json"));
    }
    HybridRun resumed(config, {.tp_size = 1});
    resumed.booster().load_model(*resumed.boosted().model, dir);
    resumed.booster().load_optimizer(*resumed.boosted().optimizer, dir);
    resumed.booster().load_lr_scheduler(*resumed.boosted().lr_scheduler, scratch.path("step10/scheduler.json"));
    const auto tail = resumed.train(10, kSteps);
    expect_curve(tail, std::vector<double>(reference.begin() + 10, reference.end()), kind + " tp2 save -> tp1 resume");

    if (world->rank() == 0) {
      // The true vocab on disk: padding trimmed.
      const auto state = checkpoint::load_state_dict(dir);
      const std::string embed = kind == "gpt2" ? "transformer.wte.weight" : "model.embed_tokens.weight";
      EXPECT_EQ(state.at(embed).size(0), 96);
      if (kind == "phi3") {
        EXPECT_TRUE(state.contains("model.layers.0.self_attn.qkv_proj.weight"));
        EXPECT_TRUE(state.contains("model.layers.1.mlp.gate_up_proj.weight"));
        EXPECT_FALSE(state.contains("model.layers.0.self_attn.q_proj.weight"));
      }
      // transformers' loss on our weights equals ours (the step-10 model, loaded whole).
      auto loaded = models::load_pretrained(dir);
      auto ids = global_batch(config, 0);
      const double ours = loaded->loss(loaded->forward(ids), ids).item<double>();
      nlohmann::json rows = nlohmann::json::array();
      for (int64_t r = 0; r < ids.size(0); ++r) {
        std::vector<int64_t> row(ids[r].data_ptr<int64_t>(), ids[r].data_ptr<int64_t>() + ids.size(1));
        rows.push_back(row);
      }
      const std::string command =
          fmt::format("{} {} {} '{}' 2>&1", COLOSSUS_PYTHON, COLOSSUS_HF_LOSS_CHECK, dir, rows.dump());
      const auto result = ct::run_command(command);
      ASSERT_EQ(result.exit_code, 0) << result.output;
      const std::string& output = result.output;
      const double theirs = nlohmann::json::parse(output.substr(output.rfind('{')))["loss"].get<double>();
      EXPECT_NEAR(theirs, ours, 1e-4 * std::abs(ours)) << kind;
      std::printf("%s: transformers loss %.6f, ours %.6f\n", kind.c_str(), theirs, ours);
    }
    barrier();
  }
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
