#include "colossus/data/token_dataset.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace colossus::data {

TokenDataset::TokenDataset(std::vector<std::string> shard_paths, int64_t seq_len) : seq_len_(seq_len) {
  if (seq_len < 1) throw ConfigError(fmt::format("seq_len = {} must be at least 1", seq_len));
  if (shard_paths.empty()) throw ConfigError("a token dataset needs at least one shard");
  for (const auto& path : shard_paths) {
    shards_.push_back(TokenShard::open(path));
    first_sample_.push_back(total_samples_);
    total_samples_ += shards_.back().size() / seq_len;
    vocab_size_ = std::max(vocab_size_, shards_.back().vocab_size());
  }
  if (total_samples_ == 0) {
    throw ConfigError(fmt::format("the shards hold {} tokens, fewer than one sample of seq_len = {}; lower seq_len "
                                  "or add data", num_tokens(), seq_len));
  }
}

TokenDataset TokenDataset::from_dir(const std::string& dir, int64_t seq_len) {
  return TokenDataset(list_token_shards(dir), seq_len);
}

int64_t TokenDataset::num_tokens() const {
  int64_t total = 0;
  for (const auto& s : shards_) total += s.size();
  return total;
}

void TokenDataset::read(int64_t index, int64_t* out) const {
  if (index < 0 || index >= total_samples_) {
    throw ConfigError(fmt::format("sample {} is outside the dataset's {} samples", index, total_samples_));
  }
  auto it = std::upper_bound(first_sample_.begin(), first_sample_.end(), index) - 1;
  auto shard = static_cast<size_t>(it - first_sample_.begin());
  shards_[shard].read((index - *it) * seq_len_, seq_len_, out);
}

at::Tensor TokenDataset::batch(const std::vector<int64_t>& indices) const {
  auto out = at::empty({static_cast<int64_t>(indices.size()), seq_len_}, at::kLong);
  auto* data = out.data_ptr<int64_t>();
  for (size_t i = 0; i < indices.size(); ++i) read(indices[i], data + static_cast<int64_t>(i) * seq_len_);
  return out;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, SamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw ConfigError(fmt::format("sampler rank {} of world {} is invalid", options.rank, options.world_size));
  }
  if (options.drop_last && dataset_size < options.world_size) {
    throw ConfigError(fmt::format("the dataset has {} samples, fewer than the {} data-parallel ranks", dataset_size,
                                  options.world_size));
  }
}

int64_t DistributedSampler::samples_per_rank() const {
  auto w = options_.world_size;
  return options_.drop_last ? dataset_size_ / w : (dataset_size_ + w - 1) / w;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  std::iota(order.begin(), order.end(), 0);
  if (options_.shuffle) {
    // mt19937_64 is specified by the standard, so the order is the same on
    // every rank and every platform; shuffle by hand (std::shuffle is not).
    std::mt19937_64 rng(options_.seed * 1000003ULL + static_cast<uint64_t>(epoch));
    for (size_t i = order.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(rng() % i);
      std::swap(order[i - 1], order[j]);
    }
  }
  int64_t total = samples_per_rank() * options_.world_size;
  while (static_cast<int64_t>(order.size()) < total) order.push_back(order[order.size() % dataset_size_]);
  std::vector<int64_t> mine;
  for (int64_t i = options_.rank; i < total; i += options_.world_size) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

}  // namespace colossus::data
