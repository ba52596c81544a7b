// `colossus train` as a process, the way users run it (issue 20): a run whose
// saves prune older checkpoints exits 0 with every checkpoint published, async
// or not, and resumes to its end; a save that fails on the background writer
// fails the run, naming the cause, and never publishes the half-written step.
#include "colossus/apps/trainer/checkpoint_dirs.h"
#include "colossus/apps/trainer/train_config.h"
#include "colossus/apps/trainer/trainer.h"
#include "colossus/checkpoint/file_io.h"
#include "colossus/core/errors.h"
#include "tests/testing/command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

namespace fs = std::filesystem;
using colossus::apps::CheckpointDirs;

constexpr const char* kConfig = R"(
[model]
preset = "gpt2-tiny"
[model.config]
n_embd = 32
n_layer = 2
n_head = 2
n_positions = 64
[data]
source = "builtin"
builtin_bytes = 100000
seq_len = 32
batch_size = 2
[optimizer]
name = "hybrid_adam"
lr = 1e-3
[lr_scheduler]
total_steps = 8
[train]
steps = 6
log_every = 2
eval_every = 2
eval_batches = 1
save_every = 2
keep_last = 2
tensorboard = false
sample_tokens = 0
)";

struct TrainRun {
  int exit_code;
  std::string output;
};

TrainRun colossus_train(const fs::path& config, const std::string& flags) {
  const auto result = colossus::testing::run_command(fmt::format("'{}' train '{}' {} 2>&1", COLOSSUS_BIN, config.string(), flags));
  return {result.exit_code, result.output};
}

// The entries of a run's checkpoints folder.
std::set<std::string> checkpoint_entries(const fs::path& run) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(run / "checkpoints")) names.insert(entry.path().filename().string());
  return names;
}

std::string read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(TrainCli, PruningRunsExitZeroWithEveryCheckpointPublishedAndResume) {
  const fs::path dir = colossus::testing::scratch_dir("train_cli");
  const fs::path config = dir / "tiny.toml";
  std::ofstream(config) << kConfig;
  for (const bool async : {true, false}) {
    SCOPED_TRACE(async ? "async saves" : "sync saves");
    const fs::path run = dir / (async ? "async" : "sync");
    // Three saves with keep_last 2: the third prunes the first (the GPU crash's trigger).
    const TrainRun first = colossus_train(config, fmt::format("--train.output_dir='{}' --train.async_save={}", run.string(), async));
    ASSERT_EQ(first.exit_code, 0) << first.output;
    for (int step : {2, 4, 6}) {
      EXPECT_NE(first.output.find(fmt::format("step {}: checkpoint saved", step)), std::string::npos)
          << "step " << step << "\n" << first.output;
    }
    EXPECT_EQ(checkpoint_entries(run), (std::set<std::string>{"latest", "step-00000004", "step-00000006"}));
    EXPECT_EQ(read_line(run / "checkpoints" / "latest"), "step-00000006");
    EXPECT_TRUE(fs::exists(run / "checkpoints" / "step-00000006" / "model" / "model.safetensors"));

    // --resume continues to a longer end, publishing and pruning again.
    const TrainRun resumed = colossus_train(
        config, fmt::format("--train.output_dir='{}' --train.async_save={} --train.steps=8 --resume", run.string(), async));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
    EXPECT_NE(resumed.output.find("step 8: checkpoint saved"), std::string::npos) << resumed.output;
    EXPECT_EQ(checkpoint_entries(run), (std::set<std::string>{"latest", "step-00000006", "step-00000008"}));
    EXPECT_EQ(read_line(run / "checkpoints" / "latest"), "step-00000008");
  }
}

TEST(TrainCli, FailedAsyncSaveFailsTheRunAndIsNeverPublished) {
  namespace io = colossus::checkpoint::io;
  const fs::path dir = colossus::testing::scratch_dir("train_cli") / "failed_save";
  auto config_for = [&](const std::string& name, int steps) {
    return colossus::apps::parse_train_config(
        kConfig, {fmt::format("train.output_dir=\"{}\"", (dir / name).string()), fmt::format("train.steps={}", steps),
                  "train.async_save=true"});
  };
  // How many fault points one save passes: a run with one save (at step 2).
  // The writer thread and the training thread both pass them: atomics.
  std::atomic<int> calls{0};
  io::set_fault_hook([&](std::string_view) { ++calls; });
  colossus::apps::train(config_for("count", 2));
  const int per_save = calls.load();
  ASSERT_GT(per_save, 0);

  // The second save (step 4) fails at its first fault point on the background writer's thread.
  calls = 0;
  std::atomic<bool> failed{false};
  const auto main_thread = std::this_thread::get_id();
  io::set_fault_hook([&](std::string_view step) {
    if (++calls > per_save && std::this_thread::get_id() != main_thread && !failed.exchange(true)) {
      throw std::runtime_error(fmt::format("injected failure at '{}'", step));
    }
  });
  try {
    colossus::apps::train(config_for("run", 6));
    ADD_FAILURE() << "a run whose save failed returned normally";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos) << e.what();
  }
  io::set_fault_hook(nullptr);
  const CheckpointDirs dirs((dir / "run").string());
  ASSERT_TRUE(dirs.latest().has_value());
  EXPECT_EQ(fs::path(*dirs.latest()).filename(), "step-00000002") << "latest moved past the failed save";
  EXPECT_FALSE(fs::exists(dirs.step_dir(4))) << "the half-written step was published";

  // The run resumes from the last good checkpoint and finishes.
  const auto rest = colossus::apps::train(config_for("run", 6), {.resume = "auto"});
  EXPECT_EQ(rest.first_step, 2);
  EXPECT_EQ(rest.final_step, 6);
  EXPECT_EQ(fs::path(*dirs.latest()).filename(), "step-00000006");
}

TEST(TrainCli, DatasetAndBinaryFilesAreRefusedAsTextSources) {
  const fs::path dir = colossus::testing::scratch_dir("train_cli") / "sources";
  fs::create_directories(dir);
  std::ofstream(dir / "chat.jsonl") << R"({"messages": [{"role": "user", "content": "hi"}]})" << "\n";
  std::ofstream(dir / "weights.dat", std::ios::binary) << std::string("text\0\xff\xfe binary", 16);
  auto error_for = [&](const fs::path& source) {
    try {
      colossus::apps::train(colossus::apps::parse_train_config(
          kConfig, {fmt::format("train.output_dir=\"{}\"", (dir / "run").string()),
                    fmt::format("data.source=\"{}\"", source.string())}));
    } catch (const colossus::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  // JSONL records, as a file, a glob or a folder holding only them, are post-training data.
  const std::string jsonl = error_for(dir / "chat.jsonl");
  EXPECT_EQ(jsonl, fmt::format("data.source = '{0}' is JSONL records, which pretraining does not read (it reads raw "
                               "text and would train on the JSON markup); to pretrain on their text, tokenize it with "
                               "`colossus data prepare {0} --tokenizer TOKENIZER --output SHARDS` and set data.source = "
                               "SHARDS; to fine-tune on them, set train.task = \"sft\"",
                               (dir / "chat.jsonl").string()));
  EXPECT_NE(error_for(dir / "*.jsonl").find("' is JSONL records, which pretraining"), std::string::npos);
  fs::create_directories(dir / "records");
  std::ofstream(dir / "records" / "part-0.jsonl") << R"({"text": "hi"})" << "\n";
  EXPECT_NE(error_for(dir / "records").find("' is JSONL records, which pretraining"), std::string::npos);
  const std::string binary = error_for(dir / "weights.dat");
  EXPECT_NE(binary.find("is not UTF-8 text"), std::string::npos) << binary;
  EXPECT_NE(binary.find("offset 4"), std::string::npos) << binary;
}

// The docs' path from records to pretraining: `colossus data prepare` turns
// JSONL into token shards, and `colossus train` trains on them; rerunning the
// same prepare command finds the output complete.
TEST(TrainCli, DataPrepareShardsTrainAsADataSource) {
  const fs::path dir = colossus::testing::scratch_dir("train_cli") / "prepare";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "corpus.jsonl");
    for (int i = 0; i < 300; ++i)
      out << R"({"text": "Record )" << i << R"(: the quick brown fox jumps over the lazy dog."})" << "\n";
  }
  const std::string prepare = fmt::format("'{}' data prepare '{}' --tokenizer byte --output '{}' --shard_tokens 4000 2>&1",
                                          COLOSSUS_BIN, (dir / "corpus.jsonl").string(), (dir / "shards").string());
  const auto first = colossus::testing::run_command(prepare);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("300 documents"), std::string::npos) << first.output;
  EXPECT_TRUE(fs::exists(dir / "shards" / "shard-000000.tokens"));
  const auto again = colossus::testing::run_command(prepare);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("already complete"), std::string::npos) << again.output;
  // docs/getting-started.md's "Pretraining on your own corpus", small.
  const fs::path repo = fs::path(COLOSSUS_BIN).parent_path().parent_path().parent_path();
  const auto run = colossus::testing::run_command(fmt::format(
      "'{}' train '{}' --data.source='{}' --data.tokenizer=byte --train.steps=2 --train.save=false "
      "--train.output_dir='{}' --train.sample_tokens=0 --train.eval_batches=0 --data.batch_size=2 2>&1",
      COLOSSUS_BIN, (repo / "examples/configs/gpt2_demo.toml").string(), (dir / "shards").string(),
      (dir / "run").string()));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(fs::exists(dir / "run" / "metrics.jsonl"));
  // The start of the log names the parallel layout and prints the effective config.
  EXPECT_NE(run.output.find("layout: 1 rank(s): dp 1 (ddp)"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("effective config:"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("source = '" + (dir / "shards").string() + "'"), std::string::npos) << run.output;
}

// docs/getting-started.md's first fine-tune, command for command: a model
// directory (here the Hugging Face checkpoint of a short pretraining run),
// examples/configs/sft.toml on prompt/completion records with the model and
// data given as overrides, then `colossus generate` on the fine-tuned run.
TEST(TrainCli, GettingStartedFineTuneRunsAsDocumented) {
  const fs::path dir = colossus::testing::scratch_dir("train_cli") / "getting_started";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path repo = fs::path(COLOSSUS_BIN).parent_path().parent_path().parent_path();
  const auto base = colossus::testing::run_command(fmt::format(
      "'{}' train '{}' --train.steps=2 --train.save_every=2 --train.output_dir='{}' --data.builtin_bytes=100000 "
      "--model.config.n_layer=2 --model.config.n_embd=64 --model.config.n_head=4 --train.sample_tokens=0 2>&1",
      COLOSSUS_BIN, (repo / "examples/configs/gpt2_demo.toml").string(), (dir / "base").string()));
  ASSERT_EQ(base.exit_code, 0) << base.output;
  const fs::path model = dir / "base" / "checkpoints" / read_line(dir / "base" / "checkpoints" / "latest") / "model";
  {
    std::ofstream out(dir / "train.jsonl");
    for (int i = 0; i < 24; ++i)
      out << R"({"prompt": "Question )" << i << R"(: what is )" << i << R"( plus one?", "completion": " )" << i + 1
          << R"(."})" << "\n";
  }
  const auto sft = colossus::testing::run_command(fmt::format(
      "cd '{}' && '{}' train '{}' --model.pretrained='{}' --data.source=train.jsonl --train.steps=3 "
      "--train.save_every=3 --train.log_every=1 --train.output_dir=runs/sft --data.seq_len=64 --data.max_length=64 2>&1",
      dir.string(), COLOSSUS_BIN, (repo / "examples/configs/sft.toml").string(), model.string()));
  ASSERT_EQ(sft.exit_code, 0) << sft.output;
  EXPECT_NE(sft.output.find("train 3/3"), std::string::npos) << sft.output;
  const auto sample = colossus::testing::run_command(fmt::format(
      "cd '{}' && '{}' generate runs/sft --prompt 'Question 3: what is 3 plus one?' --max_new_tokens 4 --greedy 2>&1",
      dir.string(), COLOSSUS_BIN));
  EXPECT_EQ(sample.exit_code, 0) << sample.output;
}

// examples/configs/families/*.toml and plugins/*.toml: every one is a valid
// config, and each runs (on this one rank, with its family's tiny preset or
// a tiny LLaMA, for 2 steps) where one rank can run its layout.
TEST(TrainCli, ExampleConfigsOfEveryFamilyAndPluginRun) {
  const fs::path repo = fs::path(COLOSSUS_BIN).parent_path().parent_path().parent_path();
  const fs::path dir = colossus::testing::scratch_dir("train_cli") / "examples";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string tiny =
      "--data.source=builtin --data.tokenizer=byte --data.builtin_bytes=60000 --data.seq_len=32 --data.max_length=32 "
      "--data.batch_size=1 --data.packing=false --train.steps=2 --train.save=false --train.sample_tokens=0 "
      "--train.eval_batches=1 --train.tensorboard=false";
  int ran = 0;
  for (const char* folder : {"families", "plugins"}) {
    for (const auto& entry : fs::directory_iterator(repo / "examples/configs" / folder)) {
      const std::string name = entry.path().stem().string();
      const std::string config = entry.path().string();
      // A family's config names a model directory; the test swaps in the family's tiny preset.
      const std::string model = std::string(folder) == "families"
                                    ? fmt::format("--model.pretrained= --model.preset={}-tiny --train.task=pretrain", name)
                                    : name.starts_with("moe") ? std::string("--model.preset=mixtral-tiny --plugin.ep_size=1")
                                                              : std::string("--model.preset=llama-tiny");
      // Every file parses with every key known (--print_config reads it whole).
      const auto printed = colossus::testing::run_command(
          fmt::format("'{}' train '{}' {} --data.tokenizer=byte --print_config 2>&1", COLOSSUS_BIN, config, model));
      EXPECT_EQ(printed.exit_code, 0) << config << ": " << printed.output;
      if (name.starts_with("hybrid")) continue;  // 8 ranks: dp x pp x tp / sp
      const auto run = colossus::testing::run_command(fmt::format("'{}' train '{}' {} {} --train.output_dir='{}' 2>&1",
                                                                   COLOSSUS_BIN, config, model, tiny,
                                                                   (dir / name).string()));
      EXPECT_EQ(run.exit_code, 0) << config << ": " << run.output;
      EXPECT_NE(run.output.find("train 2/2"), std::string::npos) << config << ": " << run.output;
      ++ran;
    }
  }
  EXPECT_EQ(ran, 16);  // 11 families, 5 plugin layouts one rank runs (moe_hybrid_parallel with ep_size 1)
}

TEST(TrainCli, MixtralPresetTrainsThroughTheTrainer) {
  // The trainer read the context length with std::get<LlamaConfig>, which a
  // Mixtral config (a variant of its own) threw bad_variant_access on.
  const fs::path dir = colossus::testing::scratch_dir("train_cli") / "mixtral";
  const auto result = colossus::apps::train(colossus::apps::parse_train_config(
      "[model]\npreset = \"mixtral-tiny\"\n",
      {fmt::format("train.output_dir=\"{}\"", dir.string()), "train.steps=2", "train.save_every=0",
       "train.eval_every=0", "train.tensorboard=false", "train.sample_tokens=0", "data.builtin_bytes=50000",
       "data.seq_len=32", "data.batch_size=2"}));
  EXPECT_EQ(result.final_step, 2);
  ASSERT_FALSE(result.steps.empty());
  EXPECT_TRUE(std::isfinite(result.steps.back().loss));
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "step-00000002" / "model" / "config.json"));
}

}  // namespace
