// TokenDataset: fixed-length samples cut from token shards, and
// DistributedSampler: which samples each data-parallel rank reads, in an order
// reshuffled every epoch from (seed, epoch), the same on every rank.
#pragma once
#include "colossus/data/token_shards.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace colossus::data {

class TokenDataset {
 public:
  // Sample i is tokens [i*seq_len, (i+1)*seq_len) of the concatenated shards
  // (a sample never crosses a shard boundary). Labels equal the inputs: the
  // model's loss shifts them (HF convention).
  TokenDataset(std::vector<std::string> shard_paths, int64_t seq_len);
  static TokenDataset from_dir(const std::string& dir, int64_t seq_len);

  int64_t size() const { return total_samples_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t num_tokens() const;
  // Writes sample `index` (seq_len int64 ids) to `out`.
  void read(int64_t index, int64_t* out) const;
  // samples: indices -> (len(indices), seq_len) int64 tensor.
  at::Tensor batch(const std::vector<int64_t>& indices) const;

 private:
  std::vector<TokenShard> shards_;
  std::vector<int64_t> first_sample_;  // cumulative sample counts per shard
  int64_t seq_len_;
  int64_t total_samples_ = 0;
  int64_t vocab_size_ = 0;
};

struct SamplerOptions {
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  // Drop the tail that does not divide by world_size (else pad by repeating
  // the first indices, as torch's DistributedSampler does).
  bool drop_last = true;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, SamplerOptions options);
  // This rank's sample indices for `epoch`.
  std::vector<int64_t> indices(int64_t epoch) const;
  int64_t samples_per_rank() const;

 private:
  int64_t dataset_size_;
  SamplerOptions options_;
};

}  // namespace colossus::data
