// The trainer end to end, on 1 and 2 MPI ranks: a run interrupted at step 10
// and resumed continues the loss curve of an uninterrupted run bit for bit
// (fp32, dropout on, gradient accumulation on); the checkpoint layout, the
// `latest` pointer and pruning; a resume under another data layout is refused;
// transformers loads the saved model and tokenizer; the split_gather / ring
// sequence-parallel keys train as plain tensor parallelism.
#include "colossus/apps/trainer/checkpoint_dirs.h"
#include "colossus/apps/trainer/train_config.h"
#include "colossus/apps/trainer/train_state.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/checkpoint/file_io.h"
#include "colossus/apps/trainer/trainer.h"
#include "colossus/core/errors.h"
#include "colossus/metrics/jsonl_writer.h"
#include "colossus/models/deepseek.h"
#include "colossus/models/deepseek_moe.h"
#include "colossus/models/pretrained.h"
#include "tests/testing/command.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

using namespace colossus;
namespace ct = colossus::testing;
namespace fs = std::filesystem;

namespace {

// One directory for the whole job (ct::job_scratch_dir), a fresh subfolder per name.
fs::path job_dir(const std::string& name) {
  auto world = ct::world();
  auto dir = ct::job_scratch_dir("trainer_test") / name;
  if (world->rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world->barrier().wait();
  return dir;
}

// A tiny GPT-2 with dropout on (so the generator state must be restored), on
// a small slice of the built-in corpus, with gradient accumulation.
apps::TrainConfig tiny_config(const fs::path& output_dir, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> overrides{"train.output_dir=\"" + output_dir.string() + "\"",
                                     "train.log_every=1",
                                     "train.steps=20",
                                     "train.grad_accum=2",
                                     "train.tensorboard=false",
                                     "train.eval_batches=2",
                                     "data.builtin_bytes=200000",
                                     "data.seq_len=32",
                                     "data.batch_size=2",
                                     "data.eval_fraction=0.05",
                                     "model.config.resid_pdrop=0.1",
                                     "model.config.embd_pdrop=0.1",
                                     "model.config.attn_pdrop=0.0",
                                     "optimizer.lr=3e-3",
                                     "lr_scheduler.warmup_steps=3",
                                     "lr_scheduler.total_steps=20"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return apps::parse_train_config("[model]\npreset = \"gpt2-tiny\"\n", overrides);
}

nlohmann::json read_config_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::vector<double> losses_of(const apps::TrainResult& r) {
  std::vector<double> out;
  for (const auto& s : r.steps) out.push_back(s.loss);
  return out;
}

}  // namespace

TEST(Trainer, ResumeContinuesTheExactLossCurve) {
  auto world = ct::world();
  auto full_dir = job_dir("full"), split_dir = job_dir("split");
  auto full = apps::train(tiny_config(full_dir));
  ASSERT_EQ(full.steps.size(), 20u);
  EXPECT_LT(full.steps.back().loss, full.steps.front().loss) << "the loss should fall over 20 steps";

  auto first = apps::train(tiny_config(split_dir, {"train.steps=10"}));
  ASSERT_EQ(first.final_step, 10);
  auto second = apps::train(tiny_config(split_dir), {.resume = "auto"});
  EXPECT_EQ(second.first_step, 10);
  auto resumed = losses_of(first);
  auto rest = losses_of(second);
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  auto expected = losses_of(full);
  ASSERT_EQ(resumed.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(resumed[i], expected[i]) << "step " << i + 1;
  ASSERT_FALSE(full.eval_losses.empty());
  ASSERT_FALSE(second.eval_losses.empty());
  EXPECT_EQ(second.eval_losses.back(), full.eval_losses.back());

  if (world->rank() == 0) {
    // metrics.jsonl of the resumed run holds each step once, with the same losses.
    std::vector<double> logged;
    for (const auto& record : metrics::read_metrics_jsonl(split_dir / "metrics.jsonl")) {
      if (record.contains("loss") && !record["loss"].is_null()) logged.push_back(record["loss"].get<double>());
    }
    EXPECT_EQ(logged, expected);
    EXPECT_TRUE(fs::exists(split_dir / "loss.svg"));
    EXPECT_TRUE(fs::exists(split_dir / "config.toml"));
  }
  world->barrier().wait();
}

// DeepSeek-V3's aux-loss-free balancing runs in training: after every
// optimizer step each router bias moves by +-gamma against its experts' load
// summed over the data-parallel ranks, the biases reach the checkpoint, and a
// run resumed from it continues the loss curve exactly.
TEST(Trainer, DeepseekV3RouterBiasesMoveEveryStepAndResume) {
  auto world = ct::world();
  auto config = [](const fs::path& dir, std::vector<std::string> extra) {
    std::vector<std::string> overrides{"train.output_dir=\"" + dir.string() + "\"",
                                       "train.log_every=1",
                                       "train.steps=6",
                                       "train.save_every=3",
                                       "train.tensorboard=false",
                                       "train.eval_batches=1",
                                       "data.builtin_bytes=100000",
                                       "data.seq_len=32",
                                       "data.batch_size=2",
                                       "data.eval_fraction=0.05",
                                       "optimizer.lr=3e-3",
                                       "lr_scheduler.total_steps=6",  // the same schedule in the split run
                                       "model.config.router_bias_update_speed=0.01"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return apps::parse_train_config("[model]\npreset = \"deepseek_v3-tiny\"\n", overrides);
  };
  auto full_dir = job_dir("deepseek_full"), split_dir = job_dir("deepseek_split");
  const auto full = apps::train(config(full_dir, {}));
  ASSERT_EQ(full.steps.size(), 6u);
  apps::train(config(split_dir, {"train.steps=3"}));
  const auto second = apps::train(config(split_dir, {}), {.resume = "auto"});
  ASSERT_EQ(second.first_step, 3);
  for (size_t i = 0; i < second.steps.size(); ++i) {
    EXPECT_EQ(second.steps[i].loss, full.steps[3 + i].loss) << "step " << 4 + i;
  }
  const auto model = models::load_pretrained((full_dir / "checkpoints" / "step-00000006" / "model").string());
  auto* deepseek = dynamic_cast<models::DeepseekForCausalLM*>(model.get());
  ASSERT_NE(deepseek, nullptr);
  ASSERT_EQ(deepseek->moe_blocks().size(), 2u) << "deepseek_v3-tiny: one dense layer, then two MoE layers";
  for (const models::DeepseekMoe* block : deepseek->moe_blocks()) {
    const at::Tensor bias = block->gate().e_score_correction_bias;
    ASSERT_TRUE(bias.defined());
    // Six moves of +-0.01 (or 0 for an expert exactly at the mean): a multiple of 0.01, |bias| <= 0.06, not all 0.
    EXPECT_GT(bias.abs().max().item<double>(), 0.0) << bias;
    EXPECT_LE(bias.abs().max().item<double>(), 0.06 + 1e-6) << bias;
    const at::Tensor steps = bias / 0.01;
    EXPECT_LE((steps - steps.round()).abs().max().item<double>(), 1e-3) << bias;
  }
  world->barrier().wait();
}

TEST(Trainer, CheckpointLayoutLatestAndPruning) {
  auto world = ct::world();
  auto dir = job_dir("layout");
  apps::train(tiny_config(dir, {"train.steps=6", "train.save_every=2", "train.keep_last=2", "train.tensorboard=true"}));
  if (world->rank() == 0) {
    apps::CheckpointDirs dirs(dir.string());
    ASSERT_TRUE(dirs.latest().has_value());
    EXPECT_EQ(fs::path(*dirs.latest()).filename(), "step-00000006");
    EXPECT_FALSE(fs::exists(dirs.step_dir(2))) << "keep_last=2 prunes the oldest";
    EXPECT_TRUE(fs::exists(dirs.step_dir(4)));
    const auto step = fs::path(dirs.step_dir(6));
    for (const char* f : {"model/config.json", "model/model.safetensors", "model/tokenizer.json", "lr_scheduler.json",
                          "train_state.json", "rng/rank-00000.safetensors"}) {
      EXPECT_TRUE(fs::exists(step / f)) << f;
    }
    EXPECT_TRUE(fs::exists(step / "optimizer"));
    EXPECT_FALSE(fs::exists(dirs.partial_dir(6)));
    bool has_events = false;
    for (const auto& e : fs::directory_iterator(dir / "tensorboard")) {
      has_events |= e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
    }
    EXPECT_TRUE(has_events);
    // The saved model loads as a Hugging Face directory.
    auto model = models::load_pretrained((step / "model").string());
    EXPECT_EQ(models::model_type(model->config()), "gpt2");
  }
  world->barrier().wait();
}

TEST(Trainer, SaveFalseWritesNoCheckpoint) {
  auto world = ct::world();
  auto dir = job_dir("nosave");
  const auto result = apps::train(tiny_config(dir, {"train.steps=2", "train.save_every=1", "train.save=false"}));
  EXPECT_TRUE(result.final_checkpoint.empty());
  if (world->rank() == 0) {
    EXPECT_FALSE(apps::CheckpointDirs(dir.string()).latest().has_value());
    EXPECT_TRUE(fs::exists(dir / "metrics.jsonl")) << "the run itself still reports";
  }
  world->barrier().wait();
}

// Each logged step carries the run metrics: gradient norm before clipping,
// fp16's loss scale, step and data-wait time, peak host (and, on a GPU,
// device) memory, in metrics.jsonl and TensorBoard under train/.
TEST(Trainer, RunMetricsReachMetricsJsonlAndTensorBoard) {
  auto world = ct::world();
  auto dir = job_dir("run_metrics");
  const auto result = apps::train(tiny_config(
      dir, {"train.steps=3", "train.save=false", "train.tensorboard=true", "plugin.name=\"low_level_zero\"",
            "plugin.precision=\"fp16\"", "plugin.max_norm=1.0", "plugin.initial_scale=1024"}));
  ASSERT_EQ(result.steps.size(), 3u);
  for (const auto& step : result.steps) {
    EXPECT_TRUE(std::isfinite(step.grad_norm) && step.grad_norm > 0.0) << step.grad_norm;
    EXPECT_GT(step.loss_scale, 0.0);
    EXPECT_GT(step.step_time_s, 0.0);
    EXPECT_GE(step.data_wait_s, 0.0);
    EXPECT_LE(step.data_wait_s, step.step_time_s);
    EXPECT_GT(step.peak_host_mib, 1.0);
  }
  if (world->rank() == 0) {
    const auto records = metrics::read_metrics_jsonl(dir / "metrics.jsonl");
    int steps = 0;
    for (const auto& record : records) {
      if (!record.contains("loss")) continue;
      ++steps;
      for (const char* key : {"grad_norm", "loss_scale", "step_time_s", "data_wait_s", "peak_host_mib", "lr", "tokens"})
        EXPECT_TRUE(record.contains(key)) << key << " missing from " << record.dump();
      EXPECT_DOUBLE_EQ(record["loss_scale"].get<double>(), result.steps[steps - 1].loss_scale);
    }
    EXPECT_EQ(steps, 3);
    std::string events;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      if (entry.path().filename().string().starts_with("events.out.tfevents")) {
        std::ifstream in(entry.path(), std::ios::binary);
        events.assign(std::istreambuf_iterator<char>(in), {});
      }
    }
    for (const char* tag : {"train/grad_norm", "train/loss_scale", "train/step_time_s", "train/data_wait_s",
                            "train/peak_host_mib", "train/loss"})
      EXPECT_NE(events.find(tag), std::string::npos) << tag << " not in the TensorBoard events";
    // What `wandb sync OUTPUT_DIR/tensorboard` imports: tensorboard's own event
    // loader reads every field of metrics.jsonl at its step, to float32.
    const auto read = ct::run_command(fmt::format("'{}' '{}' '{}' 2>/dev/null", COLOSSUS_PYTHON,
                                                  COLOSSUS_TENSORBOARD_READER, (dir / "tensorboard").string()));
    ASSERT_EQ(read.exit_code, 0) << read.output;
    const auto scalars = nlohmann::json::parse(read.output);
    int compared = 0;
    for (const auto& record : records) {
      if (!record.contains("loss")) continue;
      const int64_t step = record["step"].get<int64_t>();
      for (const auto& [key, value] : record.items()) {
        if (key == "step" || !value.is_number()) continue;
        const std::string tag = "train/" + key;
        ASSERT_TRUE(scalars.contains(tag)) << tag << " not read back from TensorBoard";
        bool found = false;
        for (const auto& point : scalars[tag]) {
          if (point[0].get<int64_t>() != step) continue;
          found = true;
          const double want = value.get<double>();
          EXPECT_NEAR(point[1].get<double>(), want, 1e-6 * std::max(1.0, std::abs(want))) << tag << " at " << step;
          ++compared;
        }
        EXPECT_TRUE(found) << tag << " has no point at step " << step;
      }
    }
    EXPECT_GE(compared, 3 * 9) << "loss, lr, tokens/s, tokens, grad norm, loss scale, step and wait time, host memory";
  }
  world->barrier().wait();
  // Without clipping no norm is computed, and bf16 keeps no loss scale: neither is written.
  auto plain_dir = job_dir("run_metrics_plain");
  const auto plain = apps::train(tiny_config(plain_dir, {"train.steps=2", "train.save=false"}));
  ASSERT_FALSE(plain.steps.empty());
  EXPECT_TRUE(std::isnan(plain.steps.back().grad_norm));
  EXPECT_TRUE(std::isnan(plain.steps.back().loss_scale));
  if (world->rank() == 0) {
    for (const auto& record : metrics::read_metrics_jsonl(plain_dir / "metrics.jsonl")) {
      EXPECT_FALSE(record.contains("grad_norm"));
      EXPECT_FALSE(record.contains("loss_scale"));
    }
  }
  world->barrier().wait();
}

TEST(Trainer, AsyncSaveResumesExactlyToo) {
  auto dir = job_dir("async");
  auto full = apps::train(tiny_config(job_dir("async_full"), {"train.steps=8", "lr_scheduler.total_steps=8"}));
  apps::train(tiny_config(dir, {"train.steps=4", "lr_scheduler.total_steps=8", "train.async_save=true"}));
  auto rest = apps::train(tiny_config(dir, {"train.steps=8", "lr_scheduler.total_steps=8", "train.async_save=true"}),
                          {.resume = (dir / "checkpoints" / "step-00000004").string()});
  ASSERT_EQ(rest.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rest.steps[i].loss, full.steps[4 + i].loss) << "step " << 5 + i;
}

TEST(Trainer, ResumeUnderAnotherLayoutIsRefused) {
  auto dir = job_dir("layout_change");
  apps::train(tiny_config(dir, {"train.steps=2"}));
  try {
    apps::train(tiny_config(dir, {"train.steps=4", "data.batch_size=4"}), {.resume = "auto"});
    FAIL() << "resuming with another batch size must be refused";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("batch_size=2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(apps::train(tiny_config(dir), {.resume = (dir / "nowhere").string()}), CheckpointError);
}

// Megatron-style sequence parallelism from the TOML keys: on 2 ranks,
// hybrid_parallel tp = 2 with sequence_parallelism_mode split_gather or ring
// trains the loss curve of plain tp = 2 (dropout off: sequence shards draw
// their own masks), eval and checkpoint included.
TEST(Trainer, SequenceParallelModesTrainAsPlainTensorParallel) {
  if (ct::world()->size() != 2) GTEST_SKIP() << "tp = 2 needs 2 ranks";
  auto run = [](const std::string& name, const std::vector<std::string>& sp) {
    std::vector<std::string> extra{"train.steps=6",
                                   "model.config.resid_pdrop=0.0",
                                   "model.config.embd_pdrop=0.0",
                                   "plugin.name=\"hybrid_parallel\"",
                                   "plugin.tp_size=2"};
    extra.insert(extra.end(), sp.begin(), sp.end());
    return losses_of(apps::train(tiny_config(job_dir(name), extra)));
  };
  const auto plain = run("tp2", {});
  ASSERT_EQ(plain.size(), 6u);
  for (const std::string mode : {"split_gather", "ring"}) {
    const auto got = run("tp2_" + mode, {"plugin.enable_sequence_parallelism=true",
                                         "plugin.sequence_parallelism_mode=\"" + mode + "\""});
    ASSERT_EQ(got.size(), plain.size()) << mode;
    for (size_t i = 0; i < plain.size(); ++i)
      EXPECT_NEAR(got[i], plain[i], 1e-5 * std::abs(plain[i])) << mode << " step " << i + 1;
  }
}

// The gemini plugin from the TOML keys: ZeRO-3 chunks with the optimizer side
// offloaded train DDP's loss curve (fp32, accumulation 2, dropout off), and a
// run stopped at step 4 resumes from its checkpoint onto the same curve exactly.
// hybrid_parallel without tp, sp or pp runs the whole model on each rank and
// takes the model's fused head + loss, as ddp does (no logits tensor). The
// first losses are the same bits; its step rounds unlike ddp's in the last
// place from step 2, so the curve is held to 1e-5.
TEST(Trainer, HybridParallelWithoutTpTrainsTheDdpCurve) {
  const std::vector<std::string> base{"train.steps=6", "model.config.resid_pdrop=0.0", "model.config.embd_pdrop=0.0"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return extra;
  };
  const auto ddp = losses_of(apps::train(tiny_config(job_dir("hybrid_ddp"), with({}))));
  const auto hybrid = losses_of(apps::train(
      tiny_config(job_dir("hybrid_tp1"), with({"plugin.name=\"hybrid_parallel\"", "plugin.precision=\"fp32\""}))));
  ASSERT_EQ(hybrid.size(), ddp.size());
  EXPECT_EQ(hybrid[0], ddp[0]);
  for (size_t i = 0; i < ddp.size(); ++i) EXPECT_NEAR(hybrid[i], ddp[i], 1e-5 * std::abs(ddp[i])) << "step " << i + 1;
}

// train.deterministic turns on ATen's deterministic algorithms for the run
// (on the GPU it is what makes two runs, or two layouts, comparable bit for
// bit); on CPU ranks the curve is the one without it, exactly.
TEST(Trainer, DeterministicKeyTrainsTheSameCurveWithDeterministicKernels) {
  auto& context = at::globalContext();
  context.setDeterministicAlgorithms(false, /*warn_only=*/false);
  const auto plain = losses_of(apps::train(tiny_config(job_dir("plain"), {"train.steps=3"})));
  EXPECT_FALSE(context.deterministicAlgorithms());
  const auto fixed = losses_of(
      apps::train(tiny_config(job_dir("deterministic"), {"train.steps=3", "train.deterministic=true"})));
  EXPECT_TRUE(context.deterministicAlgorithms());
  EXPECT_FALSE(context.deterministicAlgorithmsWarnOnly());
  context.setDeterministicAlgorithms(false, /*warn_only=*/false);
  ASSERT_EQ(fixed.size(), 3u);
  EXPECT_EQ(fixed, plain);
}

TEST(Trainer, GeminiTrainsTheDdpCurveAndResumes) {
  const std::vector<std::string> base{"train.steps=8", "model.config.resid_pdrop=0.0", "model.config.embd_pdrop=0.0"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return extra;
  };
  const std::vector<std::string> gemini{"plugin.name=\"gemini\"",
                                        "plugin.precision=\"fp32\"",
                                        "plugin.enable_gradient_accumulation=true",
                                        "plugin.offload_optim_frac=1.0",
                                        "plugin.min_chunk_size_m=0.01",
                                        "plugin.search_range_m=0.02"};
  const auto ddp = losses_of(apps::train(tiny_config(job_dir("gemini_ddp"), with({}))));
  const auto full = losses_of(apps::train(tiny_config(job_dir("gemini_full"), with(gemini))));
  ASSERT_EQ(full.size(), ddp.size());
  // On one rank bit for bit: Gemini's forward ends in the same fused head +
  // loss as DDP's. On more, Gemini reduces each micro-batch and sums the
  // reduced shards where DDP reduces the summed gradients: another rounding
  // order, so a tolerance.
  const bool one_rank = ct::world()->size() == 1;
  for (size_t i = 0; i < ddp.size(); ++i) {
    if (one_rank) EXPECT_EQ(full[i], ddp[i]) << "step " << i + 1;
    else EXPECT_NEAR(full[i], ddp[i], 1e-5 * std::abs(ddp[i])) << "step " << i + 1;
  }
  const auto split_dir = job_dir("gemini_split");
  auto first_steps = gemini;
  first_steps.push_back("train.steps=4");
  auto resumed = losses_of(apps::train(tiny_config(split_dir, with(first_steps))));
  const auto rest = losses_of(apps::train(tiny_config(split_dir, with(gemini)), {.resume = "auto"}));
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  ASSERT_EQ(resumed.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(resumed[i], full[i]) << "step " << i + 1;
  // Lazy init (each rank materialises its shards from model.init_seed) with
  // half the host chunks' moments in NVMe files: the same curve exactly.
  auto lazy_nvme = gemini;
  lazy_nvme.insert(lazy_nvme.end(), {"plugin.lazy_init=true", "plugin.nvme_offload_fraction=0.5",
                                     "plugin.nvme_offload_dir=\"" + job_dir("gemini_nvme_files").string() + "\""});
  const auto lazy = losses_of(apps::train(tiny_config(job_dir("gemini_lazy_nvme"), with(lazy_nvme))));
  ASSERT_EQ(lazy.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(lazy[i], full[i]) << "lazy + nvme, step " << i + 1;
}

// The offloaded host steps from the TOML keys (bf16, hybrid_adam): Gemini
// with its optimizer side offloaded (with and without gradient accumulation)
// and ZeRO-2 with cpu_offload learn, and a
// run stopped at step 3 resumes from its checkpoint onto the same curve
// exactly (on 2 ranks, a rank holding none of a parameter still counts its
// steps).
TEST(Trainer, OffloadedHostStepsTrainAndResume) {
  const std::vector<std::string> base{"train.steps=6",          "train.grad_accum=1",
                                      "model.config.resid_pdrop=0.0", "model.config.embd_pdrop=0.0",
                                      "optimizer.name=\"hybrid_adam\""};
  const std::vector<std::pair<std::string, std::vector<std::string>>> plugins = {
      {"gemini",
       {"plugin.name=\"gemini\"", "plugin.precision=\"bf16\"", "plugin.offload_optim_frac=1.0", "plugin.max_norm=1.0",
        "plugin.min_chunk_size_m=0.01", "plugin.search_range_m=0.02"}},
      // Gradient accumulation: the micro-batches' gradients summed on the
      // host; the CPU Adam overlaps the next forward, so checkpoints are
      // taken with host updates still queued.
      {"gemini_accumulating",
       {"plugin.name=\"gemini\"", "plugin.precision=\"bf16\"", "plugin.offload_optim_frac=1.0", "plugin.max_norm=1.0",
        "plugin.min_chunk_size_m=0.01", "plugin.search_range_m=0.02", "plugin.enable_gradient_accumulation=true",
        "train.grad_accum=2"}},
      {"zero", {"plugin.name=\"low_level_zero\"", "plugin.stage=2", "plugin.precision=\"bf16\"", "plugin.cpu_offload=true",
                "plugin.max_norm=1.0"}}};
  for (const auto& [name, options] : plugins) {
    auto host_step = base;
    host_step.insert(host_step.end(), options.begin(), options.end());
    const auto full = losses_of(apps::train(tiny_config(job_dir("host_step_" + name), host_step)));
    ASSERT_EQ(full.size(), 6u) << name;
    EXPECT_LT(full.back(), full.front()) << name;
    const auto split_dir = job_dir("host_step_split_" + name);
    auto first_steps = host_step;
    first_steps.push_back("train.steps=3");
    auto resumed = losses_of(apps::train(tiny_config(split_dir, first_steps)));
    const auto rest = losses_of(apps::train(tiny_config(split_dir, host_step), {.resume = "auto"}));
    resumed.insert(resumed.end(), rest.begin(), rest.end());
    ASSERT_EQ(resumed.size(), full.size()) << name;
    for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(resumed[i], full[i]) << name << ", step " << i + 1;
  }
}

TEST(Trainer, ActivationCheckpointingKeepsEveryPluginsCurve) {
  // Dropout on (tiny_config): the rerun forward replays its RNG, so the
  // curve is the plain one for ddp, ZeRO-2, Gemini and hybrid_parallel (whose
  // keys are its plugin's) alike, for every block or half of them.
  struct Row {
    std::string name;
    std::vector<std::string> options;
    std::string keys = "model.";  // where the plugin takes the checkpointing keys
    std::string ratio = "1.0";
  };
  const std::vector<Row> plugins = {
      {"ddp", {}},
      {"ddp_half", {}, "model.", "0.5"},
      {"low_level_zero", {"plugin.name=\"low_level_zero\"", "plugin.stage=2"}},
      {"gemini", {"plugin.name=\"gemini\"", "plugin.precision=\"fp32\"", "plugin.enable_gradient_accumulation=true",
                  "plugin.min_chunk_size_m=0.01", "plugin.search_range_m=0.02"}},
      {"hybrid_parallel", {"plugin.name=\"hybrid_parallel\""}, "plugin.", "0.5"}};
  for (const Row& row : plugins) {
    auto plain_options = row.options;
    plain_options.push_back("train.steps=6");
    const auto plain = losses_of(apps::train(tiny_config(job_dir("ckpt_plain_" + row.name), plain_options)));
    // Whole blocks, and (selective) only their MLPs.
    for (const std::string granularity : {"full", "mlp"}) {
      auto checkpointed = row.options;
      checkpointed.insert(checkpointed.end(),
                          {"train.steps=6", row.keys + "gradient_checkpointing_ratio=" + row.ratio,
                           row.keys + "gradient_checkpointing_granularity=\"" + granularity + "\""});
      const auto rerun =
          losses_of(apps::train(tiny_config(job_dir("ckpt_rerun_" + row.name + "_" + granularity), checkpointed)));
      ASSERT_EQ(rerun.size(), plain.size()) << row.name << " " << granularity;
      for (size_t i = 0; i < plain.size(); ++i) {
        EXPECT_NEAR(rerun[i], plain[i], 1e-6 * std::abs(plain[i])) << row.name << " " << granularity << " step " << i + 1;
      }
    }
  }
  try {
    tiny_config(job_dir("ckpt_bad_granularity"), {"model.gradient_checkpointing_granularity=\"selective\""});
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'selective'"), std::string::npos) << e.what();
  }
  try {
    tiny_config(job_dir("ckpt_refused"), {"plugin.name=\"hybrid_parallel\"", "model.gradient_checkpointing_ratio=0.5"});
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("set plugin.gradient_checkpointing_ratio instead"), std::string::npos) << e.what();
  }
}

TEST(Trainer, Fp8LinearLayersTrackTheFullPrecisionCurve) {
  // model.use_fp8: every Conv1D of the tiny GPT-2's blocks multiplies in
  // FP8 (e4m3 forward, e5m2 gradients); 20 steps stay within 3% of the fp32
  // run at every step, are not equal to it, and still learn.
  const std::vector<std::string> base{"train.steps=20", "lr_scheduler.total_steps=20", "model.config.resid_pdrop=0.0",
                                      "model.config.embd_pdrop=0.0", "model.config.attn_pdrop=0.0"};
  auto fp8_options = base;
  fp8_options.insert(fp8_options.end(), {"model.use_fp8=true", "model.fp8_scaling=\"rowwise\""});
  const auto plain = losses_of(apps::train(tiny_config(job_dir("fp8_linear_plain"), base)));
  const auto fp8 = losses_of(apps::train(tiny_config(job_dir("fp8_linear"), fp8_options)));
  ASSERT_EQ(fp8.size(), plain.size());
  double max_rel = 0;
  for (size_t i = 0; i < plain.size(); ++i) max_rel = std::max(max_rel, std::abs(fp8[i] - plain[i]) / std::abs(plain[i]));
  EXPECT_LE(max_rel, 3e-2);
  EXPECT_GT(max_rel, 0.0) << "FP8 changed nothing: the layers were not replaced";
  EXPECT_LT(fp8.back(), fp8.front()) << "the FP8 run does not learn";
  // hybrid_parallel takes use_fp8 too (its tensor-parallel layers keep the
  // FP8 recipe: test_tensor_parallel's Fp8LayersAndShardedModels on 1, 2 and
  // 4 ranks); on one rank it follows the ddp FP8 curve.
  auto hybrid_options = fp8_options;
  hybrid_options.push_back("plugin.name=\"hybrid_parallel\"");
  const auto hybrid = losses_of(apps::train(tiny_config(job_dir("fp8_linear_hybrid"), hybrid_options)));
  ASSERT_EQ(hybrid.size(), fp8.size());
  for (size_t i = 0; i < fp8.size(); ++i) EXPECT_NEAR(hybrid[i], fp8[i], 1e-3 * std::abs(fp8[i])) << "step " << i + 1;
  // So do ZeRO-2 and Gemini (which re-quantises the weight gathered again
  // for backward instead of keeping its FP8 copy), fp32 masters as ddp's.
  for (const auto& [name, plugin] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"zero2", {"plugin.name=\"low_level_zero\"", "plugin.stage=2", "plugin.precision=\"fp32\""}},
           {"gemini", {"plugin.name=\"gemini\"", "plugin.precision=\"fp32\"", "plugin.enable_gradient_accumulation=true", "plugin.min_chunk_size_m=0.02",
                       "plugin.search_range_m=0.02"}}}) {
    auto options = fp8_options;
    options.insert(options.end(), plugin.begin(), plugin.end());
    const auto sharded = losses_of(apps::train(tiny_config(job_dir("fp8_linear_" + name), options)));
    ASSERT_EQ(sharded.size(), fp8.size()) << name;
    for (size_t i = 0; i < fp8.size(); ++i) {
      EXPECT_NEAR(sharded[i], fp8[i], 1e-3 * std::abs(fp8[i])) << name << " step " << i + 1;
    }
  }
  // Delayed scaling (per tensor, 16 past maxima) tracks the fp32 curve too.
  auto delayed_options = base;
  delayed_options.insert(delayed_options.end(), {"model.use_fp8=true", "model.fp8_amax_history_len=16"});
  const auto delayed = losses_of(apps::train(tiny_config(job_dir("fp8_linear_delayed"), delayed_options)));
  ASSERT_EQ(delayed.size(), plain.size());
  double delayed_rel = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    delayed_rel = std::max(delayed_rel, std::abs(delayed[i] - plain[i]) / std::abs(plain[i]));
  }
  EXPECT_LE(delayed_rel, 3e-2);
  EXPECT_GT(delayed_rel, 0.0);
  EXPECT_LT(delayed.back(), delayed.front());
  for (const auto& [overrides, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"model.use_fp8=true", "model.fp8_scaling=\"blockwise\""}, "model.fp8_scaling is \"blockwise\""},
           {{"model.use_fp8=true", "model.fp8_grad_format=\"e3m4\""}, "grad_format is \"e3m4\""},
           {{"model.use_fp8=true", "model.fp8_scaling=\"rowwise\"", "model.fp8_amax_history_len=8"},
            "needs tensorwise scaling"},
           {{"model.use_fp8=true", "model.fp8_amax_history_len=8", "model.gradient_checkpointing_ratio=0.5"},
            "with activation checkpointing"},
           {{"model.use_fp8=true", "plugin.name=\"moe_hybrid_parallel\""}, "use_fp8 with plugin moe_hybrid_parallel"},
           {{"model.use_fp8=true", "plugin.name=\"hybrid_parallel\"", "plugin.enable_sequence_parallelism=true",
             "plugin.sequence_parallelism_mode=\"ring\""},
            "sequence_parallelism_mode \"ring\""}}) {
    try {
      tiny_config(job_dir("fp8_refused"), overrides);
      ADD_FAILURE() << "expected a ConfigError for " << expected;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

TEST(Trainer, DdpFp8CommunicationTracksTheFullPrecisionCurve) {
  // 50 steps, the gradients all-reduced in FP8 e4m3 (per-bucket scales)
  // against the same run communicating in fp32: within 2% at every step,
  // not equal (the fp8 rounding acts), and still learning.
  const std::vector<std::string> base{"train.steps=50", "lr_scheduler.total_steps=50", "model.config.resid_pdrop=0.0",
                                      "model.config.embd_pdrop=0.0"};
  auto fp8_options = base;
  fp8_options.push_back("plugin.fp8_communication=true");
  const auto plain = losses_of(apps::train(tiny_config(job_dir("fp8_plain"), base)));
  const auto fp8 = losses_of(apps::train(tiny_config(job_dir("fp8_comm"), fp8_options)));
  ASSERT_EQ(fp8.size(), plain.size());
  double max_rel = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double rel = std::abs(fp8[i] - plain[i]) / std::abs(plain[i]);
    max_rel = std::max(max_rel, rel);
    EXPECT_LE(rel, 2e-2) << "step " << i + 1;
  }
  EXPECT_GT(max_rel, 0.0) << "fp8 communication should change the curve a little";
  EXPECT_LT(fp8.back(), fp8.front() - 0.3);
  std::printf("[ddp fp8 communication] 50 steps: max rel diff to fp32 communication %.3g, final loss %.4f vs %.4f\n",
              max_rel, fp8.back(), plain.back());

  // ZeRO-2 in bf16: gradients reduce-scattered and parameters all-gathered in
  // FP8 against bf16 communication.
  const std::vector<std::string> zero{"plugin.name=\"low_level_zero\"", "plugin.stage=2", "plugin.precision=\"bf16\""};
  auto zero_plain = base, zero_fp8 = base;
  zero_plain.insert(zero_plain.end(), zero.begin(), zero.end());
  zero_fp8.insert(zero_fp8.end(), zero.begin(), zero.end());
  zero_fp8.push_back("plugin.fp8_communication=true");
  const auto z_plain = losses_of(apps::train(tiny_config(job_dir("fp8_zero_plain"), zero_plain)));
  const auto z_fp8 = losses_of(apps::train(tiny_config(job_dir("fp8_zero_comm"), zero_fp8)));
  ASSERT_EQ(z_fp8.size(), z_plain.size());
  // bf16 rounding alone moves single steps of two such runs by up to ~2% (a
  // full trainer_test run measured 2.0% at one step, 0.5% filtered), and on
  // an AVX512-BF16 machine (oneDNN's bf16 kernels) one step of the fp8 run
  // left the bf16 one by 6.4% while the mean stayed 0.36% and the final loss
  // 0.6%: the bound is per step 10%, 1% on the mean and on the final loss.
  double z_max = 0, z_sum = 0;
  for (size_t i = 0; i < z_plain.size(); ++i) {
    const double rel = std::abs(z_fp8[i] - z_plain[i]) / std::abs(z_plain[i]);
    z_max = std::max(z_max, rel);
    z_sum += rel;
  }
  EXPECT_LE(z_max, 1e-1);
  EXPECT_LE(z_sum / static_cast<double>(z_plain.size()), 1e-2);
  EXPECT_NEAR(z_fp8.back(), z_plain.back(), 1e-2 * z_plain.back());
  EXPECT_GT(z_max, 0.0);
  EXPECT_LT(z_fp8.back(), z_fp8.front() - 0.3);
  std::printf("[zero-2 fp8 communication] 50 steps, bf16: rel diff to bf16 communication max %.3g mean %.3g, "
              "final loss %.4f vs %.4f\n",
              z_max, z_sum / static_cast<double>(z_plain.size()), z_fp8.back(), z_plain.back());
}

// The relative differences of two loss curves, step by step.
struct CurveGap {
  double max = 0, mean = 0;
};
CurveGap curve_gap(const std::vector<double>& a, const std::vector<double>& b) {
  CurveGap gap;
  for (size_t i = 0; i < a.size(); ++i) {
    const double rel = std::abs(a[i] - b[i]) / std::abs(b[i]);
    gap.max = std::max(gap.max, rel);
    gap.mean += rel / static_cast<double>(a.size());
  }
  return gap;
}

TEST(Trainer, ZeroAndGeminiFp8CommunicationTrackTheBf16Curve) {
  // 50 bf16 steps with gradients reduce-scattered and parameters all-gathered
  // in FP8 (ZeRO-2: updated buckets after the step; Gemini: every sharded
  // chunk before the segments that use it, forward and backward) against the
  // same run communicating in bf16. Bounds as the ZeRO-2 gradient check
  // above: 10% at any step, 1% on the mean and the final loss (bf16 rounding
  // alone moves single steps by up to ~2%; on an AVX512-BF16 machine ZeRO-2
  // on 2 ranks measured one step 5.7% off). The first step's fp8 collectives
  // send about half the bytes of the same collectives in bf16.
  auto world = ct::world();
  const std::vector<std::string> base{"train.steps=50", "lr_scheduler.total_steps=50", "train.grad_accum=1",
                                      "model.config.resid_pdrop=0.0", "model.config.embd_pdrop=0.0",
                                      "plugin.precision=\"bf16\""};
  const std::vector<std::pair<std::string, std::vector<std::string>>> plugins{
      {"zero2", {"plugin.name=\"low_level_zero\"", "plugin.stage=2", "plugin.reduce_bucket_size_in_m=0.02"}},
      {"gemini", {"plugin.name=\"gemini\"", "plugin.min_chunk_size_m=0.02", "plugin.search_range_m=0.02"}}};
  for (const auto& [name, options] : plugins) {
    auto plain_options = base, fp8_options = base;
    plain_options.insert(plain_options.end(), options.begin(), options.end());
    fp8_options.insert(fp8_options.end(), options.begin(), options.end());
    fp8_options.push_back("plugin.fp8_communication=true");
    const auto plain_run = apps::train(tiny_config(job_dir("fp8_all_" + name + "_plain"), plain_options));
    const auto fp8_run = apps::train(tiny_config(job_dir("fp8_all_" + name), fp8_options));
    const auto plain = losses_of(plain_run), fp8 = losses_of(fp8_run);
    ASSERT_EQ(fp8.size(), plain.size()) << name;
    const CurveGap gap = curve_gap(fp8, plain);
    EXPECT_LE(gap.max, 1e-1) << name;
    EXPECT_LE(gap.mean, 1e-2) << name;
    EXPECT_NEAR(fp8.back(), plain.back(), 1e-2 * plain.back()) << name;
    EXPECT_GT(gap.max, 0.0) << name << ": fp8 communication should change the curve a little";
    EXPECT_LT(fp8.back(), fp8.front() - 0.3) << name;
    EXPECT_EQ(plain_run.fp8_wire_bytes_per_step, 0) << name;
    const double ratio = static_cast<double>(fp8_run.fp8_wire_bytes_per_step) /
                         static_cast<double>(fp8_run.plain_wire_bytes_per_step);
    if (world->size() > 1) {
      EXPECT_GT(fp8_run.plain_wire_bytes_per_step, 0) << name;
      EXPECT_NEAR(ratio, 0.5, 0.01) << name << ": one byte an element against bf16's two, plus the scales";
    }
    if (world->rank() == 0) {
      std::printf("[%s fp8 communication] 50 steps, bf16, %d rank(s): rel diff to bf16 communication max %.3g mean "
                  "%.3g, final loss %.4f vs %.4f; %lld bytes sent a step vs %lld in bf16 (%.4f)\n",
                  name.c_str(), world->size(), gap.max, gap.mean, fp8.back(), plain.back(),
                  static_cast<long long>(fp8_run.fp8_wire_bytes_per_step),
                  static_cast<long long>(fp8_run.plain_wire_bytes_per_step), ratio);
    }
  }
  // fp16's loss-scaled gradients are refused for Gemini as for ZeRO.
  try {
    tiny_config(job_dir("fp8_gemini_fp16"), {"plugin.name=\"gemini\"", "plugin.precision=\"fp16\"",
                                            "plugin.fp8_communication=true"});
    ADD_FAILURE() << "expected a ConfigError for gemini fp8_communication with fp16";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_communication with precision 'fp16'"), std::string::npos) << e.what();
  }
}

TEST(Trainer, TransformersLoadsTheCheckpoint) {
  auto world = ct::world();
  auto dir = job_dir("hf");
  auto result = apps::train(tiny_config(dir, {"train.steps=3"}));
  if (world->rank() == 0) {
    const auto model_dir = fs::path(result.final_checkpoint) / "model";
    auto model = models::load_pretrained(model_dir.string());
    model->eval();  // dropout is on in this config; transformers evaluates without it
    auto ids = at::randint(200, {2, 16}, at::kLong);
    const double ours = model->loss(model->forward(ids), ids).item<double>();
    nlohmann::json ids_json = nlohmann::json::array();
    for (int64_t r = 0; r < 2; ++r) {
      nlohmann::json row = nlohmann::json::array();
      for (int64_t c = 0; c < 16; ++c) row.push_back(ids[r][c].item<int64_t>());
      ids_json.push_back(row);
    }
    const std::string command = fmt::format("{} {} {} '{}' 'héllo <|endoftext|>' 2>&1", COLOSSUS_PYTHON,
                                            COLOSSUS_HF_LOAD_CHECK, model_dir.string(), ids_json.dump());
    const auto result = ct::run_command(command);
    const std::string& output = result.output;
    ASSERT_EQ(result.exit_code, 0) << output;
    auto reply = nlohmann::json::parse(output.substr(output.rfind('{')));
    EXPECT_NEAR(reply["loss"].get<double>(), ours, 1e-4);
    // The byte tokenizer: bytes of "héllo " then <|endoftext|> = 256.
    std::vector<int> expected{'h', 0xC3, 0xA9, 'l', 'l', 'o', ' ', 256};
    EXPECT_EQ(reply["encoded"].get<std::vector<int>>(), expected);
  }
  world->barrier().wait();
}

// Phi-3 through `colossus train`, tensor-parallel over the job's ranks, on
// sequences longer than phi3-tiny's 32 original positions (longrope's long
// set): the checkpoint is gathered, then written with the fused qkv_proj /
// gate_up_proj, no padding id (the byte tokenizer has none; an absent key
// would be Phi3Config's 32000), and transformers computes our loss on it.
TEST(Trainer, TransformersLoadsAPhi3Checkpoint) {
  auto world = ct::world();
  auto dir = job_dir("hf_phi3");
  auto result = apps::train(apps::parse_train_config(
      "[model]\npreset = \"phi3-tiny\"\n[plugin]\nname = \"hybrid_parallel\"\n",
      {"train.output_dir=\"" + dir.string() + "\"", "train.steps=3", "train.log_every=1", "train.tensorboard=false",
       "train.eval_batches=1", "train.sample_tokens=0", "data.builtin_bytes=200000", "data.seq_len=48",
       "data.batch_size=2", "data.eval_fraction=0.05", fmt::format("plugin.tp_size={}", world->size())}));
  if (world->rank() == 0) {
    const auto model_dir = fs::path(result.final_checkpoint) / "model";
    const auto written = read_config_json(model_dir / "config.json");
    EXPECT_EQ(written["architectures"][0], "Phi3ForCausalLM");
    EXPECT_TRUE(written["pad_token_id"].is_null());
    const auto state = checkpoint::load_state_dict(model_dir.string());
    EXPECT_TRUE(state.contains("model.layers.0.self_attn.qkv_proj.weight"));
    EXPECT_TRUE(state.contains("model.layers.0.mlp.gate_up_proj.weight"));
    auto model = models::load_pretrained(model_dir.string());
    auto ids = at::randint(200, {2, 40}, at::kLong);
    const double ours = model->loss(model->forward(ids), ids).item<double>();
    nlohmann::json ids_json = nlohmann::json::array();
    for (int64_t r = 0; r < ids.size(0); ++r) {
      nlohmann::json row = nlohmann::json::array();
      for (int64_t c = 0; c < ids.size(1); ++c) row.push_back(ids[r][c].item<int64_t>());
      ids_json.push_back(row);
    }
    const auto check = ct::run_command(fmt::format("{} {} {} '{}' 'hi' 2>&1", COLOSSUS_PYTHON, COLOSSUS_HF_LOAD_CHECK,
                                                   model_dir.string(), ids_json.dump()));
    ASSERT_EQ(check.exit_code, 0) << check.output;
    auto reply = nlohmann::json::parse(check.output.substr(check.output.rfind('{')));
    EXPECT_NEAR(reply["loss"].get<double>(), ours, 1e-4);
    std::printf("phi3 via colossus train: transformers loss %.6f, ours %.6f\n", reply["loss"].get<double>(), ours);
  }
  world->barrier().wait();
}

namespace {

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::trunc) << text; }

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const fs::path& path, const nlohmann::json& j) { write_text(path, j.dump()); }

// The message of the CheckpointError `fn` throws ("" when it throws none).
template <typename Fn>
std::string checkpoint_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Issue 21, class 1: with step directories but no usable `latest`, --resume
// continues from the newest complete step directory (never from step 0,
// which would overwrite and prune them); `latest` cannot lead out of the
// checkpoints folder; a folder with only incomplete checkpoints is refused;
// stale step-N.partial/ and latest.tmp.* are removed at the start of a run.
TEST(TrainerResume, WithoutUsableLatestTakesTheNewestCompleteStep) {
  auto world = ct::world();
  auto dir = job_dir("no_latest"), other = job_dir("no_latest_other");
  const std::vector<std::string> short_run{"train.steps=4", "train.save_every=2", "train.keep_last=0",
                                           "train.grad_accum=1", "train.eval_batches=0"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), short_run.begin(), short_run.end());
    return extra;
  };
  apps::train(tiny_config(dir, with({})));
  apps::train(tiny_config(other, with({"train.steps=2"})));
  const auto root = dir / "checkpoints";
  if (world->rank() == 0) {
    fs::remove(root / "latest");
    fs::create_directories(root / "step-00000010");  // incomplete: no train_state.json
    fs::create_directories(root / "step-00000012.partial" / "model");
    write_text(root / "latest.tmp.999", "step-00000012\n");
  }
  world->barrier().wait();
  auto resumed = apps::train(tiny_config(dir, with({"train.steps=6"})), {.resume = "auto"});
  EXPECT_EQ(resumed.first_step, 4) << "the newest complete step, not step 0 and not the incomplete step 10";
  if (world->rank() == 0) {
    EXPECT_FALSE(fs::exists(root / "step-00000012.partial")) << "stale partial checkpoints are removed";
    EXPECT_FALSE(fs::exists(root / "latest.tmp.999"));
    EXPECT_TRUE(fs::exists(root / "step-00000002")) << "nothing older was pruned (keep_last = 0)";
    // `latest` naming anything but a step directory of this folder is not followed.
    const auto other_step = (other / "checkpoints" / "step-00000002").string();
    for (const std::string& bad : std::vector<std::string>{other_step, "../../no_latest_other/checkpoints/step-00000002",
                                                           "step-00000099", "model", ""}) {
      write_text(root / "latest", bad + "\n");
      auto point = apps::find_resume_point(root.string());
      ASSERT_TRUE(point.has_value()) << bad;
      EXPECT_EQ(fs::path(point->dir).filename(), "step-00000006") << bad;
      EXPECT_NE(point->note.find("newest complete checkpoint"), std::string::npos) << point->note;
      EXPECT_THROW(apps::CheckpointDirs(dir.string()).latest(), CheckpointError) << bad;
    }
    // Only incomplete step directories: refused, and they are left alone.
    for (const auto& step : {"step-00000002", "step-00000004", "step-00000006"}) fs::remove(root / step / "train_state.json");
    fs::remove(root / "latest");
    const auto message = checkpoint_error_of([&] { apps::find_resume_point(root.string()); });
    EXPECT_NE(message.find("refusing to start over"), std::string::npos) << message;
    EXPECT_TRUE(fs::exists(root / "step-00000006" / "model"));
  }
  world->barrier().wait();
  EXPECT_THROW(apps::train(tiny_config(dir, with({"train.steps=8"})), {.resume = "auto"}), CheckpointError);
  if (world->rank() == 0) {
    EXPECT_TRUE(fs::exists(root / "step-00000006" / "model")) << "a refused resume deletes nothing";
  }
  world->barrier().wait();
}

// Issue 21, class 1: a fresh run (no --resume) into a folder that holds an
// earlier run's checkpoints is refused before anything is written; its
// checkpoints stay as they were, and --resume continues that run.
TEST(TrainerResume, FreshRunIntoAnEarlierRunsCheckpointsIsRefused) {
  auto world = ct::world();
  auto dir = job_dir("fresh_over_old");
  const std::vector<std::string> run{"train.steps=2", "train.save_every=1", "train.keep_last=1", "train.grad_accum=1",
                                     "train.eval_batches=0"};
  apps::train(tiny_config(dir, run));
  const auto root = dir / "checkpoints";
  const auto message = checkpoint_error_of([&] { apps::train(tiny_config(dir, run)); });
  EXPECT_NE(message.find("already holds checkpoints"), std::string::npos) << message;
  EXPECT_NE(message.find("step-00000002"), std::string::npos) << message;
  EXPECT_NE(message.find("--resume"), std::string::npos) << message;
  world->barrier().wait();
  if (world->rank() == 0) {
    EXPECT_TRUE(fs::exists(root / "step-00000002" / "train_state.json")) << "a refused run deletes nothing";
    // A `latest` file alone (its step directory gone) is refused too.
    checkpoint::io::remove_tree((root / "step-00000002").string());
  }
  world->barrier().wait();
  EXPECT_THROW(apps::train(tiny_config(dir, run)), CheckpointError);
  world->barrier().wait();
}

// `latest` as a FIFO: read without blocking and refused as not a regular file.
TEST(TrainerResume, LatestThatIsAFifoDoesNotBlock) {
  if (ct::world()->rank() != 0) return;
  const auto root = ct::scratch_dir("trainer") / "fifo_latest" / "checkpoints";
  fs::create_directories(root);
  ASSERT_EQ(::mkfifo((root / "latest").c_str(), 0600), 0);
  const auto message = checkpoint_error_of([&] { apps::CheckpointDirs(root.parent_path().string()).latest(); });
  EXPECT_NE(message.find("not a regular file"), std::string::npos) << message;
}

// Every field of train_state.json, the scheduler state and the optimizer
// state is range-checked, and the state must belong to its step directory.
TEST(TrainerResume, CorruptStatesAreRefused) {
  auto world = ct::world();
  auto dir = job_dir("corrupt");
  apps::train(tiny_config(dir, {"train.steps=2", "train.grad_accum=1", "train.eval_batches=0"}));
  const auto step = dir / "checkpoints" / "step-00000002";
  const auto backup = dir / "backup";
  if (world->rank() == 0) fs::copy(step, backup, fs::copy_options::recursive);
  world->barrier().wait();
  auto restore = [&] {
    // Every rank is done with the previous attempt (a slower rank may still
    // be reading the step directory rank 0 is about to replace).
    world->barrier().wait();
    if (world->rank() == 0) {
      fs::remove_all(step);
      fs::copy(backup, step, fs::copy_options::recursive);
    }
    world->barrier().wait();
  };
  auto resume_error = [&](const std::function<void()>& corrupt) {
    restore();
    if (world->rank() == 0) corrupt();
    world->barrier().wait();
    return checkpoint_error_of(
        [&] { apps::train(tiny_config(dir, {"train.steps=4", "train.grad_accum=1"}), {.resume = "auto"}); });
  };
  auto edit_json = [](const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {  // NOLINT
    auto j = read_json(path);
    edit(j);
    write_json(path, j);
  };
  const auto state = step / "train_state.json";
  const auto negative_step = resume_error([&] { edit_json(state, [](nlohmann::json& j) { j["step"] = -3; }); });
  EXPECT_NE(negative_step.find("step = -3"), std::string::npos) << negative_step;
  const auto huge_step = resume_error([&] { edit_json(state, [](nlohmann::json& j) { j["step"] = int64_t{1} << 60; }); });
  EXPECT_NE(huge_step.find("tokens_seen"), std::string::npos) << huge_step;
  EXPECT_NE(resume_error([&] { edit_json(state, [](nlohmann::json& j) { j["data_position"] = -1; }); }).find("data_position"),
            std::string::npos);
  // A consistent state of another step is not this directory's.
  EXPECT_NE(resume_error([&] {
              edit_json(state, [](nlohmann::json& j) {
                j["tokens_seen"] = j["tokens_seen"].get<int64_t>() / 2;
                j["step"] = 1;
              });
            }).find("the directory is step 2"),
            std::string::npos);
  EXPECT_NE(resume_error([&] { edit_json(step / "lr_scheduler.json", [](nlohmann::json& j) { j["step"] = -5; }); }).find("step -5"),
            std::string::npos);
  EXPECT_NE(resume_error([&] { edit_json(step / "lr_scheduler.json", [](nlohmann::json& j) { j["step"] = 7; }); })
                .find("lr_scheduler.json is at step 7"),
            std::string::npos);
  // The optimizer file: a negative step count, then a missing moment.
  const auto optimizer = (step / "optimizer" / "optimizer.safetensors").string();
  auto rewrite_optimizer = [&](const std::function<void(nlohmann::json&, checkpoint::NamedTensors&)>& edit) {
    checkpoint::NamedTensors tensors;
    std::map<std::string, std::string> metadata;
    {
      auto file = checkpoint::SafetensorsFile::open(optimizer);
      for (const auto& name : file.keys()) tensors.emplace_back(name, file.get(name).clone());
      metadata = file.metadata();
    }
    auto j = nlohmann::json::parse(metadata.at("colossus.optimizer_state"));
    edit(j, tensors);
    metadata["colossus.optimizer_state"] = j.dump();
    checkpoint::save_safetensors(optimizer, tensors, metadata);
  };
  EXPECT_NE(resume_error([&] {
              rewrite_optimizer([](nlohmann::json& j, checkpoint::NamedTensors&) { j["state"]["0"]["step"] = -1; });
            }).find("step -1"),
            std::string::npos);
  EXPECT_NE(resume_error([&] {
              rewrite_optimizer([](nlohmann::json&, checkpoint::NamedTensors& tensors) {
                std::erase_if(tensors, [](const auto& t) { return t.first == "state.0.exp_avg_sq"; });
              });
            }).find("lacks 'state.0.exp_avg_sq'"),
            std::string::npos);
  restore();
  auto ok = apps::train(tiny_config(dir, {"train.steps=3", "train.grad_accum=1", "train.eval_batches=0"}),
                        {.resume = "auto"});
  EXPECT_EQ(ok.first_step, 2) << "the restored checkpoint resumes";
}

// Issue 21, class 6: a diverging run (lr 1e30: parameters overflow within a
// few steps) stops with DivergenceError after train.max_nonfinite_steps
// non-finite steps, and no checkpoint of a non-finite state is published, so
// keep_last never prunes the good ones in its favour.
TEST(TrainerDivergence, StopsAndNeverPublishesANonFiniteCheckpoint) {
  auto world = ct::world();
  auto dir = job_dir("diverge");
  const auto config = tiny_config(dir, {"optimizer.lr=1e30", "lr_scheduler.warmup_steps=0", "train.save_every=1",
                                        "train.keep_last=2", "train.max_nonfinite_steps=2", "train.grad_accum=1",
                                        "train.eval_batches=0"});
  std::string message;
  try {
    apps::train(config);
  } catch (const apps::DivergenceError& e) {
    message = e.what();
  }
  ASSERT_NE(message.find("training diverged"), std::string::npos) << "the run must stop: " << message;
  EXPECT_NE(message.find("train.max_nonfinite_steps = 2"), std::string::npos) << message;
  if (world->rank() == 0) {
    apps::CheckpointDirs dirs(dir.string());
    const auto complete = dirs.complete_steps();
    ASSERT_FALSE(complete.empty()) << "the first step's checkpoint is finite";
    ASSERT_TRUE(dirs.latest().has_value());
    EXPECT_EQ(*dirs.latest(), complete.back());
    for (const auto& step : complete) {
      for (const auto& [name, tensor] : checkpoint::load_state_dict((fs::path(step) / "model").string())) {
        EXPECT_TRUE(at::isfinite(tensor).all().item<bool>()) << step << " " << name;
      }
      const auto state = apps::TrainState::load((fs::path(step) / "train_state.json").string());
      EXPECT_TRUE(std::isfinite(state.last_loss)) << step;
    }
    EXPECT_LT(apps::step_of_dir(complete.back()), 20);
  }
  world->barrier().wait();
}

// Issue 21, class 7: a misspelt [model.config] key is refused by name
// instead of being written into config.json.
TEST(TrainerConfig, MisspeltModelConfigKeyIsRefused) {
  auto dir = job_dir("misspelt");
  try {
    apps::train(tiny_config(dir, {"model.config.n_layr=2", "train.steps=1"}));
    FAIL() << "model.config.n_layr must be refused";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.config.n_layr"), std::string::npos) << what;
    EXPECT_NE(what.find("n_layer"), std::string::npos) << "the valid keys are listed: " << what;
  }
}

// Issue 21, class 2: an integer tensor is not silently cast into a float
// parameter; a bf16 checkpoint into an fp32 model (a precision cast) loads.
TEST(PretrainedLoad, IntegerTensorIntoFloatParameterIsRefused) {
  if (ct::world()->rank() != 0) return;
  const auto base = ct::scratch_dir("trainer") / "pretrained_dtype";
  auto model = models::create_model(models::preset("gpt2-tiny"), {.seed = 1});
  models::save_pretrained(*model, (base / "fp32").string());
  auto bf16 = models::create_model(models::preset("gpt2-tiny"), {.seed = 1, .dtype = at::kBFloat16});
  models::save_pretrained(*bf16, (base / "bf16").string());
  EXPECT_NO_THROW(models::load_pretrained((base / "bf16").string()));
  auto state = checkpoint::load_state_dict((base / "fp32").string());
  state["transformer.wpe.weight"] = state["transformer.wpe.weight"].to(at::kInt);
  const auto message = checkpoint_error_of([&] { models::load_state_dict(*model, state, "int32 file"); });
  EXPECT_NE(message.find("dtype mismatch"), std::string::npos) << message;
  EXPECT_NE(message.find("transformer.wpe.weight"), std::string::npos) << message;
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }

// hybrid_parallel pp = 2 from the TOML keys (each loader batch one
// microbatch, grad_accum = 2 of them per step, booster.execute_pipeline): on
// 2 ranks the loss curve of tp = 2 over the same data (both dp = 1; dropout
// off), with tp's eval losses (forward-only pipeline), and a run stopped at
// step 3 resumes from its checkpoint (model, and optimizer state merged over
// the stages) onto the same curve exactly.
TEST(Trainer, PipelineParallelTrainsTheTpCurveAndResumes) {
  if (ct::world()->size() != 2) GTEST_SKIP() << "pp = 2 needs 2 ranks";
  const std::vector<std::string> base{"train.steps=6", "model.config.resid_pdrop=0.0", "model.config.embd_pdrop=0.0",
                                      "plugin.name=\"hybrid_parallel\""};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return extra;
  };
  const auto tp_run = apps::train(tiny_config(job_dir("pp_tp2"), with({"plugin.tp_size=2"})));
  const auto tp = losses_of(tp_run);
  const std::vector<std::string> pp{"plugin.pp_size=2", "plugin.pp_style=\"1f1b\""};
  const auto full_run = apps::train(tiny_config(job_dir("pp_full"), with(pp)));
  const auto full = losses_of(full_run);
  ASSERT_EQ(full.size(), tp.size());
  for (size_t i = 0; i < tp.size(); ++i) EXPECT_NEAR(full[i], tp[i], 1e-5 * std::abs(tp[i])) << "step " << i + 1;
  // The eval loss runs through the forward-only pipeline: tp's at each eval.
  ASSERT_FALSE(full_run.eval_losses.empty());
  ASSERT_EQ(full_run.eval_losses.size(), tp_run.eval_losses.size());
  for (size_t i = 0; i < tp_run.eval_losses.size(); ++i) {
    EXPECT_EQ(full_run.eval_losses[i].first, tp_run.eval_losses[i].first);
    EXPECT_NEAR(full_run.eval_losses[i].second, tp_run.eval_losses[i].second,
                1e-5 * std::abs(tp_run.eval_losses[i].second))
        << "eval at step " << tp_run.eval_losses[i].first;
  }
  const auto split_dir = job_dir("pp_split");
  auto first_steps = pp;
  first_steps.push_back("train.steps=3");
  auto resumed = losses_of(apps::train(tiny_config(split_dir, with(first_steps))));
  const auto rest = losses_of(apps::train(tiny_config(split_dir, with(pp)), {.resume = "auto"}));
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  ASSERT_EQ(resumed.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(resumed[i], full[i]) << "step " << i + 1;
}

// train.cuda_graph needs one GPU with bf16 mixed precision: elsewhere (these
// CPU ranks) the run stops before its first step with the reason and the way
// out. The captured step itself is tested in tests/amp (GraphedTrainStep) and
// on the GPU by scripts/device_train_speed.sh.
TEST(Trainer, CudaGraphOffTheGpuIsAConfigError) {
  auto dir = job_dir("cuda_graph");
  try {
    apps::train(tiny_config(dir, {"train.cuda_graph=true", "train.grad_accum=1", "train.steps=2"}));
    FAIL() << "train.cuda_graph on the CPU must be refused";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("device cpu"), std::string::npos) << what;
    EXPECT_NE(what.find("train.cuda_graph = false"), std::string::npos) << what;
  }
}
