// Token shards (round trip, corrupt files), the dataset's sample windows, the
// distributed sampler's partition and reshuffle, the prefetching loader and its
// resume state, and the built-in corpus with the byte tokenizer.
#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"
#include "colossus/data/data_loader.h"
#include "colossus/data/token_dataset.h"
#include "colossus/data/token_shards.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <stdexcept>
#include <stdlib.h>

using namespace colossus::data;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "colossus-data-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path = pattern;
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str(const std::string& name = "") const { return (path / name).string(); }
  fs::path path;
};

std::vector<int32_t> iota_tokens(int n, int32_t start = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::string shard_error(const std::string& path) {
  try {
    TokenShard::open(path);
  } catch (const colossus::ConfigError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(TokenShards, RoundTripNarrowAndWide) {
  TempDir dir;
  auto tokens = iota_tokens(1000);
  write_token_shard(dir.str("a.tokens"), tokens, 50257);
  write_token_shard(dir.str("b.tokens"), iota_tokens(10, 100000), 200000);
  auto a = TokenShard::open(dir.str("a.tokens"));
  auto b = TokenShard::open(dir.str("b.tokens"));
  EXPECT_EQ(a.size(), 1000);
  EXPECT_EQ(a.vocab_size(), 50257);
  EXPECT_EQ(fs::file_size(dir.str("a.tokens")), 32u + 2000u) << "uint16 when the vocabulary fits";
  EXPECT_EQ(fs::file_size(dir.str("b.tokens")), 32u + 40u);
  std::vector<int64_t> out(5);
  a.read(995, 5, out.data());
  EXPECT_EQ(out, (std::vector<int64_t>{995, 996, 997, 998, 999}));
  b.read(0, 2, out.data());
  EXPECT_EQ(out[1], 100001);
  EXPECT_THROW(a.read(999, 2, out.data()), colossus::ConfigError);
  EXPECT_EQ(list_token_shards(dir.str()), (std::vector<std::string>{dir.str("a.tokens"), dir.str("b.tokens")}));
}

TEST(TokenShards, CorruptFilesNameTheProblem) {
  TempDir dir;
  write_token_shard(dir.str("good.tokens"), iota_tokens(100), 1000);
  fs::copy_file(dir.str("good.tokens"), dir.str("cut.tokens"));
  fs::resize_file(dir.str("cut.tokens"), 100);
  EXPECT_NE(shard_error(dir.str("cut.tokens")).find("truncated"), std::string::npos);
  std::ofstream(dir.str("junk.tokens")) << "this is not a shard at all, just text that is long enough";
  EXPECT_NE(shard_error(dir.str("junk.tokens")).find("bad magic"), std::string::npos);
  EXPECT_NE(shard_error(dir.str("missing.tokens")).find("cannot be opened"), std::string::npos);
  EXPECT_THROW(write_token_shard(dir.str("bad.tokens"), std::vector<int32_t>{5, 2000}, 1000), colossus::ConfigError);
  EXPECT_FALSE(fs::exists(dir.str("bad.tokens"))) << "a failed write leaves no shard behind";
  TempDir empty;
  EXPECT_THROW(list_token_shards(empty.str()), colossus::ConfigError);
}

TEST(TokenDataset, SamplesDoNotCrossShards) {
  TempDir dir;
  write_token_shard(dir.str("0.tokens"), iota_tokens(25), 1000);        // 3 samples of 8, 1 token left
  write_token_shard(dir.str("1.tokens"), iota_tokens(16, 500), 1000);   // 2 samples
  auto ds = TokenDataset::from_dir(dir.str(), 8);
  EXPECT_EQ(ds.size(), 5);
  auto batch = ds.batch({2, 3});
  EXPECT_EQ(batch.sizes(), (at::IntArrayRef{2, 8}));
  EXPECT_EQ(batch[0][0].item<int64_t>(), 16);
  EXPECT_EQ(batch[1][0].item<int64_t>(), 500);
  EXPECT_EQ(batch[1][7].item<int64_t>(), 507);
  EXPECT_THROW(TokenDataset::from_dir(dir.str(), 100), colossus::ConfigError);
}

TEST(DistributedSampler, PartitionsAndReshuffles) {
  const int64_t n = 103;
  std::set<int64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    DistributedSampler s(n, {.rank = rank, .world_size = 4, .seed = 9});
    auto idx = s.indices(0);
    EXPECT_EQ(static_cast<int64_t>(idx.size()), 25);
    for (auto i : idx) EXPECT_TRUE(seen.insert(i).second) << "index " << i << " given to two ranks";
    EXPECT_NE(idx, s.indices(1)) << "a new epoch reshuffles";
    EXPECT_EQ(idx, DistributedSampler(n, {.rank = rank, .world_size = 4, .seed = 9}).indices(0));
  }
  EXPECT_EQ(seen.size(), 100u) << "drop_last drops the 3 that do not divide";
  DistributedSampler padded(n, {.rank = 3, .world_size = 4, .shuffle = false, .drop_last = false});
  EXPECT_EQ(padded.indices(0).size(), 26u);
  EXPECT_THROW(DistributedSampler(n, {.rank = 4, .world_size = 4}), colossus::ConfigError);
}

TEST(DataLoader, PrefetchesInOrderAndResumes) {
  TempDir dir;
  write_token_shard(dir.str("0.tokens"), iota_tokens(64 * 10), 1000);
  auto ds = std::make_shared<TokenDataset>(TokenDataset::from_dir(dir.str(), 10));  // 64 samples
  auto sampler = DistributedSampler(ds->size(), {.rank = 1, .world_size = 2, .seed = 3});
  DataLoader loader(ds, sampler, {.batch_size = 4, .prefetch = 2});
  EXPECT_EQ(loader.batches_per_epoch(), 8);
  std::vector<at::Tensor> uninterrupted;
  for (int i = 0; i < 20; ++i) uninterrupted.push_back(loader.next());
  EXPECT_EQ(loader.epoch(), 2);
  EXPECT_EQ(loader.position(), 4);
  // The batches follow the sampler exactly.
  auto order = sampler.indices(0);
  EXPECT_EQ(uninterrupted[1][2][0].item<int64_t>(), order[6] * 10);
  // A loader restored to (epoch 1, batch 3) yields batch 11 onwards.
  DataLoader resumed(ds, sampler, {.batch_size = 4});
  resumed.set_state(1, 3);
  for (int i = 11; i < 20; ++i) EXPECT_TRUE(at::equal(resumed.next(), uninterrupted[static_cast<size_t>(i)])) << i;
  EXPECT_THROW(resumed.set_state(0, 8), colossus::ConfigError);
  EXPECT_THROW(DataLoader(ds, sampler, {.batch_size = 100}), colossus::ConfigError);
}

TEST(BuiltinCorpus, DeterministicAndTokenizes) {
  auto text = builtin_corpus(1, 20000);
  EXPECT_GE(text.size(), 20000u);
  EXPECT_EQ(text, builtin_corpus(1, 20000));
  EXPECT_NE(text, builtin_corpus(2, 20000));
  EXPECT_NE(text.find("Once upon a time"), std::string::npos);
  EXPECT_NE(text.find(" plus "), std::string::npos);
  auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->vocab_size(), 257);
  std::string sample = "héllo <|endoftext|> world";
  auto ids = tok->encode(sample);
  EXPECT_EQ(ids[7], 256);
  EXPECT_EQ(tok->decode(ids), sample);
  EXPECT_EQ(tok->decode(ids, /*skip_special_tokens=*/true), "héllo  world");
  TempDir dir;
  auto result = tokenize_to_shards(text, *tok, dir.str(), {.shard_tokens = 5000, .eval_fraction = 0.1});
  EXPECT_GT(result.train_shards.size(), 2u);
  EXPECT_EQ(result.eval_shards.size(), 1u);
  EXPECT_NEAR(static_cast<double>(result.eval_tokens) / (result.train_tokens + result.eval_tokens), 0.1, 0.05);
  auto ds = TokenDataset::from_dir(dir.str("train"), 64);
  EXPECT_EQ(ds.vocab_size(), 257);
  std::vector<int64_t> first(64);
  ds.read(0, first.data());
  std::vector<int32_t> as32(first.begin(), first.end());
  EXPECT_EQ(tok->decode(as32), text.substr(0, 64));
}
