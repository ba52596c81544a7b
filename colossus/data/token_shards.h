// Token shards: a corpus tokenized once into flat files of token ids (uint16
// when the vocabulary fits, else uint32) behind a small header, memory-mapped
// for reading so a dataset of any size costs no RAM up front.
//   header (32 bytes): "CLSTOKS1" | uint32 version=1 | uint32 bytes_per_token
//                      | uint64 num_tokens | uint64 vocab_size
//   then num_tokens little-endian ids.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace colossus::data {

// Writes one shard atomically (temp file, then rename).
void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size);

class TokenShard {
 public:
  // Throws ConfigError naming the file for a bad magic, version, size or a
  // truncated body.
  static TokenShard open(const std::string& path);

  int64_t size() const { return num_tokens_; }
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& path() const { return path_; }
  // Tokens [begin, begin + count) widened to int64 into `out`.
  void read(int64_t begin, int64_t count, int64_t* out) const;

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> mapping_;
  std::string path_;
  int64_t num_tokens_ = 0;
  int64_t vocab_size_ = 0;
  int bytes_per_token_ = 0;
};

// All `*.tokens` files of a directory, sorted by name.
std::vector<std::string> list_token_shards(const std::string& dir);

}  // namespace colossus::data
