// Per-rank sharded checkpoints (SaveOptions::shard): Gemini and ZeRO-2 runs of
// 2 ranks save after 10 of 20 steps, each rank writing only its own files (no
// file holds the whole model or state), and the directory resumes on 1 rank
// and on every rank of the job (4 under `RANKS 4`), model and optimizer,
// under plain DDP, and loads in transformers (Phi-3 with its fused names); a truncated shard is a
// CheckpointError naming the file. CTest runs it on 2 and 4 MPI ranks.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "tests/testing/command.h"
#include "tests/testing/testing.h"
#include "tests/zero/zero_testing.h"

using namespace colossus;
using namespace colossus::zero::testing;
namespace ct = colossus::testing;
namespace bt = colossus::booster::testing;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kSaveAt = 10;

void expect_continues(const std::vector<double>& resumed, const std::vector<double>& uninterrupted,
                      const std::string& what) {
  ASSERT_EQ(resumed.size(), static_cast<size_t>(bt::kSteps - kSaveAt));
  const double worst = worst_rel_diff(resumed, std::vector<double>(uninterrupted.begin() + kSaveAt, uninterrupted.end()));
  EXPECT_LE(worst, 1e-5) << what;
  if (ct::world()->rank() == 0) {
    std::printf("%s (job of %d): max rel diff vs uninterrupted %.2e\n", what.c_str(), ct::world()->size(), worst);
  }
}

// Every rank of a 2-rank group wrote one file of each prefix: together they
// are the whole, apart none is.
void expect_rank_files(const std::string& dir, const std::string& prefix) {
  std::set<std::string> all;
  size_t biggest = 0;
  for (int r = 1; r <= 2; ++r) {
    const auto path = fs::path(dir) / fmt::format("{}-{:05d}-of-00002.safetensors", prefix, r);
    ASSERT_TRUE(fs::exists(path)) << path;
    const auto keys = checkpoint::SafetensorsFile::open(path.string()).keys();
    biggest = std::max(biggest, keys.size());
    all.insert(keys.begin(), keys.end());
  }
  EXPECT_TRUE(fs::exists(fs::path(dir) / (prefix + ".safetensors.index.json")));
  EXPECT_FALSE(fs::exists(fs::path(dir) / (prefix + ".safetensors")));
  EXPECT_EQ(all.size(), checkpoint::load_state_dict(dir, prefix).size());
  EXPECT_LT(biggest, all.size()) << prefix << ": one rank wrote everything";
}

// transformers' loss on the saved weights equals ours (rank 0 only).
void expect_transformers_loads(const std::string& dir, const models::ModelConfig& config) {
  if (ct::world()->rank() != 0) return;
  if (!fs::exists(COLOSSUS_PYTHON)) {
    std::printf("no Python oracle at %s: transformers check skipped\n", COLOSSUS_PYTHON);
    return;
  }
  auto loaded = models::load_pretrained(dir);
  auto ids = bt::global_batch(config, 0);
  const double ours = loaded->loss(loaded->forward(ids), ids).item<double>();
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t r = 0; r < ids.size(0); ++r) {
    rows.push_back(std::vector<int64_t>(ids[r].data_ptr<int64_t>(), ids[r].data_ptr<int64_t>() + ids.size(1)));
  }
  const auto result =
      ct::run_command(fmt::format("{} {} {} '{}' 2>&1", COLOSSUS_PYTHON, COLOSSUS_HF_LOSS_CHECK, dir, rows.dump()));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const double theirs =
      nlohmann::json::parse(result.output.substr(result.output.rfind('{')))["loss"].get<double>();
  EXPECT_NEAR(theirs, ours, 1e-4 * std::abs(ours));
  std::printf("transformers loss %.6f, ours %.6f\n", theirs, ours);
}

// Saved on 2 ranks (each pair of the job saves its own copy), then resumed on
// 1, on all ranks, and under DDP.
void check_resharding(const RunSpec& spec, const std::string& tag) {
  bt::SharedScratch scratch(tag);
  const auto uninterrupted = ZeroRun(spec).train(0, bt::kSteps);
  const int pair = ct::world()->rank() / 2;
  auto pair_group = ct::world()->split(pair, 0, "pair");
  const std::string dir = scratch.path("pair0");
  {
    ZeroRun saver(spec, pair_group);
    saver.train(0, kSaveAt);
    saver.save(scratch.path("pair" + std::to_string(pair)), /*shard=*/true);
  }
  bt::barrier();
  if (ct::world()->rank() == 0) {
    if (spec.model == "phi3") {
      // Its files fuse q/k/v and gate/up, whichever ranks hold the parts.
      const auto state = checkpoint::load_state_dict(dir);
      EXPECT_TRUE(state.contains("model.layers.0.self_attn.qkv_proj.weight"));
      EXPECT_TRUE(state.contains("model.layers.1.mlp.gate_up_proj.weight"));
      EXPECT_FALSE(state.contains("model.layers.0.self_attn.k_proj.weight"));
    }
    // Gemini writes a Phi-3 model whole from rank 0 (a rank's share may hold q without k).
    if (!(spec.model == "phi3" && spec.plugin == "gemini")) expect_rank_files(dir, "model");
    expect_rank_files(dir, "optimizer");
  }
  {
    auto self = ct::world()->split(ct::world()->rank(), 0, "self");
    ZeroRun alone(spec, self);
    alone.load(dir);
    expect_continues(alone.train(kSaveAt, bt::kSteps), uninterrupted, tag + ": 2 ranks -> 1");
  }
  {
    ZeroRun all(spec);
    all.load(dir);
    expect_continues(all.train(kSaveAt, bt::kSteps), uninterrupted,
                     fmt::format("{}: 2 ranks -> {}", tag, ct::world()->size()));
  }
  {
    RunSpec ddp = spec;
    ddp.plugin = "ddp";
    ZeroRun run(ddp);
    run.load(dir);
    expect_continues(run.train(kSaveAt, bt::kSteps), uninterrupted, tag + ": 2 ranks -> ddp");
  }
  expect_transformers_loads(dir, spec.model == "gpt2"   ? bt::tiny_gpt2()
                                 : spec.model == "phi3" ? bt::tiny_phi3()
                                                        : bt::tiny_llama());
  bt::barrier();
}

}  // namespace

TEST(ShardedCheckpoint, GeminiSavedOnTwoRanksReshards) {
  check_resharding({.model = "gpt2", .plugin = "gemini", .max_norm = 0.5}, "gemini_sharded");
}

TEST(ShardedCheckpoint, Zero2SavedOnTwoRanksReshards) {
  check_resharding({.model = "llama", .plugin = "zero", .stage = 2}, "zero2_sharded");
}

// Phi-3: the per-rank files hold the fused qkv_proj / gate_up_proj that
// transformers loads; every resume splits them back.
TEST(ShardedCheckpoint, Phi3FusedNamesUnderZero2AndGemini) {
  check_resharding({.model = "phi3", .plugin = "zero", .stage = 2}, "zero2_phi3_sharded");
  check_resharding({.model = "phi3", .plugin = "gemini"}, "gemini_phi3_sharded");
}

// A shard cut short (a crash of the copy, a full disk) fails the load on every
// rank with the file named, before any parameter changed.
TEST(ShardedCheckpoint, TruncatedShardIsACheckpointError) {
  bt::SharedScratch scratch("sharded_truncated");
  const RunSpec spec{.model = "gpt2", .plugin = "gemini"};
  const int pair = ct::world()->rank() / 2;
  auto pair_group = ct::world()->split(pair, 0, "pair");
  ZeroRun run(spec, pair_group);
  run.train(0, 1);
  const std::string dir = scratch.path("pair" + std::to_string(pair));
  run.save(dir, /*shard=*/true);
  for (const std::string prefix : {"model", "optimizer"}) {
    const auto path = fs::path(dir) / fmt::format("{}-00002-of-00002.safetensors", prefix);
    pair_group->barrier().wait();
    if (pair_group->rank() == 0) fs::resize_file(path, fs::file_size(path) / 2);
    pair_group->barrier().wait();
    try {
      if (prefix == "model") {
        run.booster().load_model(*run.boosted().model, dir);
      } else {
        run.booster().load_optimizer(*run.boosted().optimizer, dir);
      }
      ADD_FAILURE() << prefix << ": a truncated shard loaded";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(path.filename().string()), std::string::npos) << e.what();
    }
  }
  bt::barrier();
}

int main(int argc, char** argv) { return ct::run_all_tests(argc, argv); }
