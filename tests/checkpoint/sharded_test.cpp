// save_sharded / load_state_dict / load_tensors / check_state_dict: the HF
// layout and index, loading errors, replacing one checkpoint with another,
// and crashes at every step of a save (a forked child dies at step k; the
// directory must then load as the old or the new checkpoint, never a mix).
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "tests/checkpoint/test_util.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

namespace colossus::checkpoint {
namespace {

using testing::TempDir;
using testing::throws_checkpoint_error;
namespace fs = std::filesystem;

// `count` float tensors of 256 floats (1 KiB) each; `seed` changes every value.
NamedTensors model(int count, float seed) {
  NamedTensors tensors;
  for (int i = 0; i < count; ++i) {
    tensors.emplace_back(fmt::format("layers.{}.weight", i), at::full({16, 16}, seed + static_cast<float>(i)));
  }
  return tensors;
}

std::vector<std::string> shard_names(int n) {
  std::vector<std::string> names;
  for (int k = 1; k <= n; ++k) names.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", k, n));
  return names;
}

TEST(SaveSharded, OneFileWhenEverythingFits) {
  TempDir dir;
  auto tensors = model(3, 1.0f);
  save_sharded(dir.path(), tensors);
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"model.safetensors"});
  auto file = SafetensorsFile::open(dir.file("model.safetensors"));
  EXPECT_EQ(file.metadata().at("format"), "pt") << "transformers refuses shards without it";
  EXPECT_TRUE(testing::same_state_dict(load_state_dict(dir.path()), tensors));
}

TEST(SaveSharded, ShardsAndIndexInHuggingFaceLayout) {
  TempDir dir;
  auto tensors = model(10, 0.5f);
  tensors.emplace_back("big", at::ones({1000}));  // 4000 bytes: over the limit, so a shard of its own
  tensors.emplace_back("tail", at::ones({2}, at::kHalf));
  save_sharded(dir.path(), tensors, {.max_shard_bytes = 3000, .metadata = {{"run", "7"}}});

  // 1 KiB tensors, 3000-byte shards: 2 per shard -> 5 shards, then "big", then "tail".
  auto names = shard_names(7);
  auto expected_files = names;
  expected_files.push_back("model.safetensors.index.json");
  std::sort(expected_files.begin(), expected_files.end());
  EXPECT_EQ(testing::list_dir(dir.path()), expected_files);

  auto index = nlohmann::json::parse(testing::read_bytes(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), 10 * 1024 + 4000 + 4);
  EXPECT_EQ(index["weight_map"].size(), tensors.size());
  EXPECT_EQ(index["weight_map"]["layers.0.weight"], names[0]);
  EXPECT_EQ(index["weight_map"]["layers.1.weight"], names[0]);
  EXPECT_EQ(index["weight_map"]["layers.2.weight"], names[1]);
  EXPECT_EQ(index["weight_map"]["layers.9.weight"], names[4]);
  EXPECT_EQ(index["weight_map"]["big"], names[5]);
  EXPECT_EQ(index["weight_map"]["tail"], names[6]);
  for (const auto& name : names) {
    auto shard = SafetensorsFile::open(dir.file(name));
    EXPECT_EQ(shard.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"run", "7"}}));
  }

  EXPECT_TRUE(testing::same_state_dict(load_state_dict(dir.path()), tensors));
  EXPECT_TRUE(testing::same_state_dict(load_state_dict(dir.file("model.safetensors.index.json")), tensors));
  // load_tensors opens only the shards it needs: remove one it does not need.
  fs::remove(dir.file(names[2]));
  auto subset = load_tensors(dir.path(), {"layers.0.weight", "big"});
  EXPECT_EQ(subset.size(), 2u);
  EXPECT_TRUE(testing::same_tensor(subset.at("big"), at::ones({1000})));
  EXPECT_TRUE(throws_checkpoint_error(
      [&] {
        load_tensors(dir.path(), {"big", "nope", "nada"});
      },
      {"lacks 2 requested tensors: nope, nada"}));
}

TEST(SaveSharded, CustomPrefixLeavesOtherPrefixesAlone) {
  TempDir dir;
  save_sharded(dir.path(), model(4, 1.0f), {.max_shard_bytes = 2048, .prefix = "model"});
  save_sharded(dir.path(), model(2, 9.0f), {.max_shard_bytes = 1024, .prefix = "ema"});
  save_sharded(dir.path(), model(3, 5.0f), {.max_shard_bytes = 1 << 20, .prefix = "ema"});
  EXPECT_TRUE(testing::same_state_dict(load_state_dict(dir.path()), model(4, 1.0f)));
  EXPECT_TRUE(testing::same_state_dict(load_state_dict(dir.path(), "ema"), model(3, 5.0f)));
  EXPECT_EQ(testing::list_dir(dir.path()),
            (std::vector<std::string>{"ema.safetensors", "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors", "model.safetensors.index.json"}));
  EXPECT_TRUE(
      throws_checkpoint_error([&] { save_sharded(dir.path(), model(1, 0), {.prefix = "a/b"}); }, {"prefix 'a/b'"}));
  EXPECT_TRUE(throws_checkpoint_error([&] { save_sharded(dir.path(), model(1, 0), {.max_shard_bytes = 0}); },
                                      {"max_shard_bytes is 0"}));
  EXPECT_TRUE(throws_checkpoint_error(
      [&] {
        save_sharded(dir.path(), {{"x", at::ones({1})}, {"x", at::ones({1})}}, {.max_shard_bytes = 1});
      },
      {"'x' appears twice"}));
}

// CheckpointFiles maps each file once and hands out a fresh view per get():
// the same tensors load_state_dict gives, single file or shards; errors name
// the checkpoint and the tensor, or the missing shard.
TEST(CheckpointFiles, FreshViewsOfEveryTensorSingleOrSharded) {
  for (const int64_t max_shard_bytes : {int64_t{1} << 20, int64_t{2048}}) {
    TempDir dir;
    const auto tensors = model(5, 2.0f);
    save_sharded(dir.path(), tensors, {.max_shard_bytes = max_shard_bytes});
    const auto files = CheckpointFiles::open(dir.path());
    std::map<std::string, at::Tensor> got;
    for (const auto& name : files.keys()) got.emplace(name, files.get(name));
    EXPECT_TRUE(testing::same_state_dict(got, tensors)) << max_shard_bytes;
    at::Tensor first = files.get("layers.0.weight"), second = files.get("layers.0.weight");
    EXPECT_EQ(first.data_ptr(), second.data_ptr()) << "a view of the mapping, not a copy";
    EXPECT_FALSE(first.is_same(second)) << "a fresh view per call";
    EXPECT_TRUE(throws_checkpoint_error([&] { files.get("ghost"); }, {dir.path(), "'ghost'"}));
  }
  TempDir dir;
  save_sharded(dir.path(), model(4, 1.0f), {.max_shard_bytes = 2048});
  fs::remove(dir.file("model-00002-of-00002.safetensors"));
  EXPECT_TRUE(throws_checkpoint_error([&] { CheckpointFiles::open(dir.path()); },
                                      {"shard", "model-00002-of-00002.safetensors", "missing"}));
}

TEST(LoadStateDict, ErrorsNameWhatIsMissing) {
  TempDir dir;
  EXPECT_TRUE(throws_checkpoint_error([&] { load_state_dict(dir.path()); },
                                      {dir.path(), "looked for", "model.safetensors", "model.safetensors.index.json"}));
  EXPECT_TRUE(throws_checkpoint_error([&] { load_state_dict(dir.file("nothing")); }, {"nothing", "does not exist"}));

  save_sharded(dir.path(), model(4, 1.0f), {.max_shard_bytes = 2048});
  std::string index = dir.file("model.safetensors.index.json");
  std::string index_text = testing::read_bytes(index);
  fs::remove(dir.file("model-00002-of-00002.safetensors"));
  EXPECT_TRUE(throws_checkpoint_error([&] { load_state_dict(dir.path()); },
                                      {"shard", "model-00002-of-00002.safetensors", "missing", index}));

  auto json = nlohmann::json::parse(index_text);
  json["weight_map"]["ghost"] = "model-00001-of-00002.safetensors";
  testing::write_bytes(index, json.dump());
  EXPECT_TRUE(throws_checkpoint_error([&] { load_tensors(dir.path(), {"ghost"}); },
                                      {index, "'ghost'", "model-00001-of-00002.safetensors", "does not hold it"}));
  json["weight_map"]["ghost"] = "../outside.safetensors";
  testing::write_bytes(index, json.dump());
  EXPECT_TRUE(throws_checkpoint_error([&] { load_state_dict(dir.path()); }, {index, "not a file beside the index"}));
  testing::write_bytes(index, "{\"weight_map\": [");
  EXPECT_TRUE(throws_checkpoint_error([&] { load_state_dict(dir.path()); }, {index, "not valid JSON"}));
  testing::write_bytes(index, "{\"metadata\": {}}");
  EXPECT_TRUE(throws_checkpoint_error([&] { load_state_dict(dir.path()); }, {index, "no \"weight_map\""}));
}

TEST(CheckStateDict, ListsMissingUnexpectedAndMismatched) {
  std::map<std::string, at::Tensor> loaded{
      {"a", at::ones({2, 3})}, {"b", at::ones({4}, at::kHalf)}, {"c", at::ones({5})}, {"extra", at::ones({1})}};
  NamedTensors expected{
      {"a", at::zeros({2, 3})}, {"b", at::zeros({4}, at::kFloat)}, {"c", at::zeros({6})}, {"gone", at::zeros({1})}};
  EXPECT_TRUE(throws_checkpoint_error([&] { check_state_dict(loaded, expected, /*strict=*/true); },
                                      {"missing 1: gone", "unexpected 1: extra", "mismatched 2",
                                       "'b' expected F32 [4], got F16 [4]", "'c' expected F32 [6], got F32 [5]"}));
  // Non-strict tolerates missing and unexpected names, never a wrong shape.
  EXPECT_TRUE(throws_checkpoint_error([&] { check_state_dict(loaded, expected, false); }, {"mismatched 2"}));
  try {
    check_state_dict(loaded, expected, false);
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()).find("gone"), std::string::npos);
  }
  EXPECT_NO_THROW(check_state_dict(loaded, {{"a", at::zeros({2, 3})}}, false));
  EXPECT_TRUE(throws_checkpoint_error(
      [&] {
        check_state_dict(loaded, {{"a", at::zeros({2, 3})}}, true);
      },
      {"unexpected 3: b, c, extra"}));
  EXPECT_NO_THROW(check_state_dict(
      loaded,
      {{"a", at::zeros({2, 3})}, {"b", at::zeros({4}, at::kHalf)}, {"c", at::zeros({5})}, {"extra", at::zeros({1})}},
      true));
}

TEST(Atomicity, StaleTempFilesDoNotBreakLoadingOrSaving) {
  TempDir dir;
  save_sharded(dir.path(), model(4, 1.0f), {.max_shard_bytes = 2048});
  // Debris of a crashed save: half-written temps, one even under our own pid.
  testing::write_bytes(dir.file("model-00001-of-00002.safetensors.tmp.4242"), "garbage");
  testing::write_bytes(dir.file("model.safetensors.index.json.tmp.4242"), "{\"weight_");
  testing::write_bytes(io::temp_path_for(dir.file("model.safetensors")), "\x01\x02");
  EXPECT_TRUE(testing::same_state_dict(load_state_dict(dir.path()), model(4, 1.0f)));
  save_sharded(dir.path(), model(4, 2.0f), {.max_shard_bytes = 1 << 20});
  EXPECT_TRUE(testing::same_state_dict(load_state_dict(dir.path()), model(4, 2.0f)));
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(dir.file("model-00001-of-00002.safetensors")));
}

struct Layout {
  int tensors;
  int64_t max_shard_bytes;
};

// old -> new layouts: single->single, single->sharded, sharded->single,
// sharded->sharded with the same shard names (the staged path) and with other names.
const std::vector<std::pair<Layout, Layout>> kTransitions = {
    {{3, 1 << 20}, {4, 1 << 20}}, {{3, 1 << 20}, {6, 2048}}, {{6, 2048}, {3, 1 << 20}},
    {{6, 2048}, {6, 2048}},       {{6, 2048}, {6, 1024}},
};

TEST(Atomicity, SavingOverAnyLayoutLeavesOnlyTheNewCheckpoint) {
  for (const auto& [before, after] : kTransitions) {
    TempDir dir;
    save_sharded(dir.path(), model(before.tensors, 1.0f), {.max_shard_bytes = before.max_shard_bytes});
    auto old_view = load_state_dict(dir.path());  // mapped while the next save replaces its files
    save_sharded(dir.path(), model(after.tensors, 2.0f), {.max_shard_bytes = after.max_shard_bytes});
    EXPECT_TRUE(testing::same_state_dict(load_state_dict(dir.path()), model(after.tensors, 2.0f)));
    EXPECT_TRUE(testing::same_state_dict(old_view, model(before.tensors, 1.0f)));
    int n = static_cast<int>((after.tensors * 1024 + after.max_shard_bytes - 1) / after.max_shard_bytes);
    std::vector<std::string> files{"model.safetensors"};
    if (n > 1) {
      files = shard_names(n);
      files.push_back("model.safetensors.index.json");
    }
    EXPECT_EQ(testing::list_dir(dir.path()), files) << "stale or staged files left behind";
  }
}

TEST(Atomicity, CrashAtEveryStepLeavesTheOldOrTheNewCheckpoint) {
  int crashes = 0;
  for (const auto& [before, after] : kTransitions) {
    auto old_tensors = model(before.tensors, 1.0f);
    auto new_tensors = model(after.tensors, 2.0f);
    for (int crash_at = 0;; ++crash_at) {
      TempDir dir;
      save_sharded(dir.path(), old_tensors, {.max_shard_bytes = before.max_shard_bytes});
      pid_t child = ::fork();
      ASSERT_GE(child, 0);
      if (child == 0) {
        int steps = 0;
        io::set_fault_hook([&](std::string_view) {
          if (steps++ == crash_at) ::_exit(3);  // like a kill -9: no cleanup runs
        });
        save_sharded(dir.path(), new_tensors, {.max_shard_bytes = after.max_shard_bytes});
        ::_exit(0);
      }
      int status = 0;
      ASSERT_EQ(::waitpid(child, &status, 0), child);
      ASSERT_TRUE(WIFEXITED(status));
      bool crashed = WEXITSTATUS(status) == 3;
      auto loaded = load_state_dict(dir.path());
      bool is_old = testing::same_state_dict(loaded, old_tensors);
      bool is_new = testing::same_state_dict(loaded, new_tensors);
      EXPECT_TRUE(is_old || is_new) << "crash at step " << crash_at << " left a mixed checkpoint";
      if (!crashed) {
        EXPECT_TRUE(is_new);
        break;
      }
      ++crashes;
      // The next save recovers from whatever the crash left.
      save_sharded(dir.path(), new_tensors, {.max_shard_bytes = after.max_shard_bytes});
      EXPECT_TRUE(testing::same_state_dict(load_state_dict(dir.path()), new_tensors));
    }
  }
  EXPECT_GT(crashes, 20);
}

}  // namespace
}  // namespace colossus::checkpoint
