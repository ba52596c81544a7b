// Booster checkpoints on 1, 2 and 4 MPI ranks: a run saved at step 10 and
// resumed into fresh objects continues bit for bit (fp32, clipped fp32, bf16;
// sync and async saves); async files equal sync files byte for byte and the
// model directory equals models::save_pretrained's; sharded layouts; every
// bad input is a CheckpointError naming the file or tensor, on every rank.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/lr_scheduler.h"
#include "colossus/optim/sgd.h"
#include "tests/booster/booster_testing.h"
#include "tests/testing/testing.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

using namespace colossus;
using namespace colossus::booster::testing;
namespace ct = colossus::testing;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kSaveStep = 10;

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every regular file of `dir`, by name.
std::map<std::string, std::string> dir_bytes(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) files[entry.path().filename().string()] = file_bytes(entry.path());
  }
  return files;
}

void save_all(BoostedRun& run, const std::string& dir, const booster::SaveOptions& options) {
  auto& b = run.booster();
  b.save_model(*run.boosted().model, dir + "/model", options);
  b.save_optimizer(*run.boosted().optimizer, dir + "/optimizer", options);
  b.save_lr_scheduler(*run.boosted().lr_scheduler, dir + "/scheduler.json");
}

void load_all(BoostedRun& run, const std::string& dir) {
  auto& b = run.booster();
  b.load_model(*run.boosted().model, dir + "/model");
  b.load_optimizer(*run.boosted().optimizer, dir + "/optimizer");
  b.load_lr_scheduler(*run.boosted().lr_scheduler, dir + "/scheduler.json");
}

template <class Fn>
void expect_checkpoint_error(Fn&& fn, const std::vector<std::string>& words) {
  try {
    fn();
    FAIL() << "no CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    for (const auto& word : words)
      EXPECT_NE(message.find(word), std::string::npos) << "'" << word << "' not in: " << message;
  }
}

}  // namespace

struct ResumeCase {
  std::string name;
  booster::BoosterOptions options;
};

class ResumeBitExact : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeBitExact, SyncAndAsyncSavesContinueTheSameCurve) {
  const auto& options = GetParam().options;
  SharedScratch scratch("resume");
  BoostedRun uninterrupted(tiny_llama(), options, 2);
  const auto expected = uninterrupted.train(0, kSteps);

  BoostedRun first_half(tiny_llama(), options, 2);
  const auto head = first_half.train(0, kSaveStep);
  for (int64_t i = 0; i < kSaveStep; ++i) EXPECT_EQ(head[i], expected[i]) << "step " << i;
  save_all(first_half, scratch.path("sync"), {});
  save_all(first_half, scratch.path("async"), {.use_async = true});
  // Training on while the async save runs must not reach the files.
  first_half.train(kSaveStep, kSaveStep + 2);
  first_half.booster().wait_for_saves();

  if (ct::world()->rank() == 0) {
    for (const char* part : {"model", "optimizer"}) {
      const auto sync = dir_bytes(scratch.path("sync") + "/" + part);
      EXPECT_FALSE(sync.empty());
      EXPECT_TRUE(sync == dir_bytes(scratch.path("async") + "/" + part)) << part << ": async files differ from sync";
    }
  }
  for (const char* from : {"sync", "async"}) {
    BoostedRun resumed(tiny_llama(), options, 2);
    load_all(resumed, scratch.path(from));
    const auto tail = resumed.train(kSaveStep, kSteps);
    for (int64_t i = kSaveStep; i < kSteps; ++i) {
      EXPECT_EQ(tail[i - kSaveStep], expected[i]) << from << " save, step " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, ResumeBitExact,
                         ::testing::Values(ResumeCase{"fp32", {}}, ResumeCase{"fp32_clipped", {.max_norm = 0.5}},
                                           ResumeCase{"bf16", {.mixed_precision = "bf16", .max_norm = 0.5}}),
                         [](const auto& info) { return info.param.name; });

TEST(BoosterCheckpoint, ModelDirIsWhatSavePretrainedWrites) {
  SharedScratch scratch("hf");
  for (const char* precision : {"fp32", "bf16"}) {
    BoostedRun run(tiny_gpt2(), {.mixed_precision = precision});
    run.train(0, 2);
    const std::string dir = scratch.path(std::string("booster_") + precision);
    run.booster().save_model(*run.boosted().model, dir);
    if (ct::world()->rank() == 0) {
      const std::string reference = scratch.path(std::string("pretrained_") + precision);
      models::save_pretrained(run.boosted().model->unwrap(), reference);
      EXPECT_TRUE(dir_bytes(dir) == dir_bytes(reference)) << precision;
      auto loaded = checkpoint::load_state_dict(dir);
      const auto dtype = std::string(precision) == "bf16" ? at::kBFloat16 : at::kFloat;
      for (const auto& [name, tensor] : loaded) EXPECT_EQ(tensor.scalar_type(), dtype) << name;
    }
    barrier();
  }
}

TEST(BoosterCheckpoint, ShardedModelAndOptimizerRoundTrip) {
  SharedScratch scratch("sharded");
  models::GPT2Config big = std::get<models::GPT2Config>(tiny_gpt2());
  big.vocab_size = 2048;
  big.n_embd = 128;  // ~1.2 M parameters: several 1 MB shards
  BoostedRun run(big, {});
  run.train(0, 1);
  run.booster().save_model(*run.boosted().model, scratch.path("model"), {.size_per_shard_mb = 1});
  run.booster().save_optimizer(*run.boosted().optimizer, scratch.path("model"), {.size_per_shard_mb = 1});
  EXPECT_TRUE(fs::exists(scratch.path("model") + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(scratch.path("model") + "/optimizer.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(scratch.path("model") + "/optimizer.safetensors"));

  BoostedRun fresh(big, {});
  fresh.booster().load_model(*fresh.boosted().model, scratch.path("model"));
  fresh.booster().load_optimizer(*fresh.boosted().optimizer, scratch.path("model"));
  auto expected = run.boosted().model->unwrap().named_parameters();
  for (const auto& item : fresh.boosted().model->unwrap().named_parameters()) {
    EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
  }
  const auto a = run.boosted().optimizer->state_dict(), b = fresh.boosted().optimizer->state_dict();
  EXPECT_EQ(a.json, b.json);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) EXPECT_TRUE(at::equal(a.tensors[i].second, b.tensors[i].second));
}

TEST(BoosterCheckpoint, BadInputNamesTheFileOrTensor) {
  SharedScratch scratch("bad");
  const bool rank0 = ct::world()->rank() == 0;
  BoostedRun run(tiny_gpt2(), {});
  run.train(0, 1);
  auto& b = run.booster();
  auto& model = *run.boosted().model;
  auto& optimizer = *run.boosted().optimizer;

  // A truncated optimizer file.
  const std::string opt_dir = scratch.path("truncated");
  b.save_optimizer(optimizer, opt_dir);
  const std::string opt_file = opt_dir + "/optimizer.safetensors";
  if (rank0) fs::resize_file(opt_file, fs::file_size(opt_file) / 2);
  barrier();
  expect_checkpoint_error([&] { b.load_optimizer(optimizer, opt_dir); }, {opt_file});

  // A missing optimizer directory, and a directory without optimizer files.
  const std::string missing = scratch.path("no_such_dir");
  expect_checkpoint_error([&] { b.load_optimizer(optimizer, missing); }, {missing});
  expect_checkpoint_error([&] { b.load_optimizer(optimizer, scratch.path("")); }, {"optimizer.safetensors"});

  // Another optimizer's state.
  const std::string good_dir = scratch.path("adamw");
  b.save_optimizer(optimizer, good_dir);
  optim::SGD sgd(run.boosted().model->unwrap().parameters());
  expect_checkpoint_error([&] { b.load_optimizer(sgd, good_dir); }, {good_dir + "/optimizer.safetensors", "SGD"});

  // Another scheduler's JSON.
  optim::SGD dummy(std::vector<at::Tensor>{at::zeros({1}).requires_grad_(true)});
  optim::ConstantLR constant(dummy);
  const std::string sched_file = scratch.path("constant.json");
  b.save_lr_scheduler(constant, sched_file);
  expect_checkpoint_error([&] { b.load_lr_scheduler(*run.boosted().lr_scheduler, sched_file); },
                          {sched_file, "constant", "cosine"});
  expect_checkpoint_error([&] { b.load_lr_scheduler(*run.boosted().lr_scheduler, scratch.path("none.json")); },
                          {scratch.path("none.json")});

  // A model directory missing a tensor.
  const std::string model_dir = scratch.path("model");
  b.save_model(model, model_dir);
  if (rank0) {
    checkpoint::NamedTensors kept;
    for (auto& [name, tensor] : checkpoint::load_state_dict(model_dir)) {
      if (name != "transformer.ln_f.bias") kept.emplace_back(name, tensor.clone());
    }
    checkpoint::save_safetensors(model_dir + "/model.safetensors", kept, {{"format", "pt"}});
  }
  barrier();
  expect_checkpoint_error([&] { b.load_model(model, model_dir); },
                          {"transformer.ln_f.bias", model_dir + "/model.safetensors", "missing"});

  // A shard size of 0 is a configuration mistake, on every rank.
  EXPECT_THROW(b.save_model(model, model_dir, {.size_per_shard_mb = 0}), ConfigError);
}

TEST(BoosterCheckpoint, AsyncErrorSurfacesOnEveryRank) {
  BoostedRun run(tiny_gpt2(), {});
  // /proc takes no new directories, not even for root: the background write fails.
  run.booster().save_model(*run.boosted().model, "/proc/colossus_no_such_dir/model", {.use_async = true});
  EXPECT_THROW(run.booster().wait_for_saves(), CheckpointError);
  run.booster().wait_for_saves();  // the error was reported once; nothing is pending
}
