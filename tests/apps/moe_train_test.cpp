// `colossus train` with plugin.name = "moe_hybrid_parallel": a tiny Mixtral
// (router aux and z losses on) trained by 2 MPI ranks with ep 2 gives the loss
// and eval curve of one process on the same global batch (fp32, 1e-5
// relative), and a 2-rank run stopped at a checkpoint resumes onto its own
// curve exactly (and a tp 2 checkpoint resumes as 2 pipeline stages on the
// one-process curve); bad layouts and non-MoE models stop before anything is
// allocated, naming the values and an alternative. Every run is a `colossus
// train` child process (the ranks under mpirun).
#include "colossus/apps/trainer/config_schema.h"
#include "colossus/apps/trainer/train_config.h"
#include "colossus/apps/trainer/trainer.h"
#include "colossus/core/errors.h"
#include "colossus/metrics/jsonl_writer.h"
#include "tests/testing/command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace ct = colossus::testing;

// Each rank reads one row a micro-batch: the load-balancing loss is not a
// mean over tokens, so a rank's rows must be one micro-batch of the
// reference (there: batch_size 1, grad_accum = the ranks' dp), as the
// sampler deals rows round-robin over dp.
constexpr const char* kConfig = R"(
[model]
preset = "mixtral-tiny"
[model.config]
output_router_logits = true
router_aux_loss_coef = 0.05
router_z_loss_coef = 0.01
[data]
source = "builtin"
tokenizer = "byte"
builtin_bytes = 60000
seq_len = 32
batch_size = 1
eval_fraction = 0.05
[optimizer]
name = "adamw"
lr = 3e-3
[lr_scheduler]
warmup_steps = 2
total_steps = 6
[plugin]
name = "moe_hybrid_parallel"
[train]
steps = 6
log_every = 1
eval_every = 3
save_every = 3
tensorboard = false
sample_tokens = 0
)";

struct Curve {
  std::vector<double> losses, eval_losses;
};

Curve curve_of(const fs::path& run) {
  Curve c;
  for (const auto& record : colossus::metrics::read_metrics_jsonl(run / "metrics.jsonl")) {
    if (record.contains("loss") && !record["loss"].is_null()) c.losses.push_back(record["loss"].get<double>());
    if (record.contains("eval_loss")) c.eval_losses.push_back(record["eval_loss"].get<double>());
  }
  return c;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = ct::scratch_dir("moe_train") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

fs::path config_file() {
  const fs::path path = ct::scratch_dir("moe_train") / "moe.toml";
  std::ofstream(path) << kConfig;
  return path;
}

// `colossus train` on `ranks` MPI ranks (as CTest runs the multi-rank tests).
ct::CommandResult train_on_ranks(int ranks, const fs::path& output_dir, const std::string& flags) {
  return ct::run_command(fmt::format("'{}' {} '{}' train '{}' --train.output_dir='{}' {} 2>&1", COLOSSUS_MPIRUN, ranks,
                                     COLOSSUS_BIN, config_file().string(), output_dir.string(), flags));
}

colossus::apps::TrainResult train_here(const fs::path& output_dir, std::vector<std::string> overrides,
                                       const colossus::apps::TrainOptions& options = {}) {
  overrides.push_back(fmt::format("train.output_dir=\"{}\"", output_dir.string()));
  return colossus::apps::train(colossus::apps::parse_train_config(kConfig, overrides), options);
}

void expect_near_curve(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << what << " " << i;
}

std::string config_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const colossus::ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

TEST(MoeTrain, ExpertParallelRanksTrainTheOneProcessCurveAndResume) {
  // One process: the 2 ranks' rows as 2 micro-batches of one row. Through the
  // CLI too: once this test process has initialised MPI (apps::train does), an
  // mpirun started from it fails, so every run of this test is a child process.
  const fs::path one = scratch("one");
  const auto single = ct::run_command(fmt::format("'{}' train '{}' --train.output_dir='{}' --train.grad_accum=2 "
                                                  "--train.eval_batches=2 2>&1",
                                                  COLOSSUS_BIN, config_file().string(), one.string()));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const Curve reference = curve_of(one);
  ASSERT_EQ(reference.losses.size(), 6u);
  ASSERT_EQ(reference.eval_losses.size(), 2u);
  EXPECT_LT(reference.losses.back(), reference.losses.front());

  const std::string ep2 = "--plugin.ep_size=2 --train.eval_batches=1";
  const fs::path full = scratch("ep2");
  const auto run = train_on_ranks(2, full, ep2);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("moe_dp 1 x ep 2"), std::string::npos) << run.output;
  const Curve got = curve_of(full);
  expect_near_curve(got.losses, reference.losses, "ep 2 step");
  expect_near_curve(got.eval_losses, reference.eval_losses, "ep 2 eval");

  // Stopped at the step-3 checkpoint (model gathered over ep, optimizer per
  // ep rank), then resumed: the same curve bit for bit.
  const fs::path split = scratch("ep2_split");
  const auto first = train_on_ranks(2, split, ep2 + " --train.steps=3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto second = train_on_ranks(2, split, ep2 + " --resume");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(curve_of(split).losses, got.losses);
  EXPECT_TRUE(fs::exists(split / "checkpoints" / "step-00000006" / "model" / "config.json"));

  // Stopped at step 3 under tp 2 (dp 1: the two rows as two micro-batches;
  // tp slices gathered into the checkpoint), resumed as two pipeline stages:
  // the one-process curve.
  const fs::path moved = scratch("tp2_to_pp2");
  const std::string dp1 = " --train.grad_accum=2 --train.eval_batches=2";
  const auto tp2 = train_on_ranks(2, moved, "--plugin.tp_size=2 --train.steps=3" + dp1);
  ASSERT_EQ(tp2.exit_code, 0) << tp2.output;
  const auto resumed = train_on_ranks(2, moved, "--plugin.pp_size=2 --resume" + dp1);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_near_curve(curve_of(moved).losses, reference.losses, "tp 2 -> pp 2 step");
}

TEST(MoeTrain, BadLayoutsAndDenseModelsAreRefusedUpFront) {
  const fs::path dir = scratch("errors");
  std::string message = config_error_of([&] { train_here(dir, {"plugin.ep_size=2"}); });
  EXPECT_NE(message.find("ep_size is 2 but must divide the dp size"), std::string::npos) << message;
  message = config_error_of([&] { train_here(dir, {"model.preset=\"llama-tiny\"", "model.config={}"}); });
  EXPECT_NE(message.find("needs a mixture-of-experts model"), std::string::npos) << message;
  EXPECT_NE(message.find("'llama'"), std::string::npos) << message;
  message = config_error_of([&] { train_here(dir, {"model.preset=\"deepseek_v2-tiny\"", "model.config={}"}); });
  EXPECT_NE(message.find("does not take DeepSeek models yet (model type 'deepseek_v2'"), std::string::npos) << message;
  EXPECT_NE(message.find("plugin.name = \"ddp\""), std::string::npos) << message;
  message = config_error_of(
      [&] { colossus::apps::parse_train_config(kConfig, {"model.gradient_checkpointing_ratio=1.0"}); });
  EXPECT_NE(message.find("gradient_checkpointing_ratio = 1 with plugin moe_hybrid_parallel: set "
                         "plugin.gradient_checkpointing_ratio instead"),
            std::string::npos)
      << message;
  message = config_error_of(
      [&] { colossus::apps::parse_train_config(kConfig, {"plugin.gradient_checkpointing_ratio=1.5"}); });
  EXPECT_NE(message.find("gradient_checkpointing_ratio = 1.5 must be in [0, 1]"), std::string::npos) << message;
  message = config_error_of([&] { colossus::apps::parse_train_config(kConfig, {"plugin.zero_stage=3"}); });
  EXPECT_NE(message.find("zero_stage is 3"), std::string::npos) << message;
  message = config_error_of([&] { colossus::apps::parse_train_config(kConfig, {"plugin.ep_size=0"}); });
  EXPECT_NE(message.find("ep_size is 0"), std::string::npos) << message;
  message = config_error_of([&] { colossus::apps::parse_train_config(kConfig, {"booster.max_norm=1.0"}); });
  EXPECT_NE(message.find("set plugin.precision and plugin.max_norm"), std::string::npos) << message;
  message = config_error_of(
      [&] { colossus::apps::parse_train_config(kConfig, {"train.task=\"sft\"", "data.source=\"x.jsonl\""}); });
  EXPECT_NE(message.find("train.task = \"sft\" with plugin moe_hybrid_parallel"), std::string::npos) << message;
  // Every key of the plugin is read from the file and printed back.
  const auto config = colossus::apps::parse_train_config(
      kConfig, {"plugin.pp_size=2", "plugin.num_layers_per_stage=[1, 1]", "plugin.moe_dp_outside=false",
                "train.save=false"});
  EXPECT_EQ(config.plugin.moe_hybrid_parallel.num_layers_per_stage, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(config.plugin.moe_hybrid_parallel.microbatch_size, 1) << "pp: each loader batch a microbatch";
  const auto printed = colossus::apps::effective_config_toml(config);
  EXPECT_NE(printed.find("num_layers_per_stage = [ 1, 1 ]"), std::string::npos) << printed;
  EXPECT_NE(printed.find("moe_dp_outside = false"), std::string::npos) << printed;
}

}  // namespace
