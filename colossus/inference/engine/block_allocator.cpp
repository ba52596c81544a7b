#include "colossus/inference/engine/block_allocator.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace colossus::inference {

BlockAllocator::BlockAllocator(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching)
    : block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      ref_counts_(static_cast<size_t>(num_blocks), 0),
      evictable_pos_(static_cast<size_t>(num_blocks)),
      cached_(static_cast<size_t>(num_blocks)) {
  // Hand out low ids first (pop from the back).
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<BlockId>(b));
}

std::optional<BlockId> BlockAllocator::allocate() {
  BlockId block = 0;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!evictable_.empty()) {
    block = evictable_.front();
    evictable_.pop_front();
    forget(block);
  } else {
    return std::nullopt;
  }
  ref_counts_[static_cast<size_t>(block)] = 1;
  return block;
}

void BlockAllocator::retain(BlockId block) {
  auto& count = ref_counts_.at(static_cast<size_t>(block));
  TORCH_CHECK(count > 0, "retain of KV block ", block, " that has no user");
  ++count;
}

void BlockAllocator::release(BlockId block) {
  auto& count = ref_counts_.at(static_cast<size_t>(block));
  TORCH_CHECK(count > 0, "release of KV block ", block, " that has no user");
  if (--count > 0) return;
  if (cached_[static_cast<size_t>(block)]) {
    evictable_pos_[static_cast<size_t>(block)] = evictable_.insert(evictable_.end(), block);
  } else {
    free_.push_back(block);
  }
}

void BlockAllocator::forget(BlockId block) {
  auto& cached = cached_[static_cast<size_t>(block)];
  if (!cached) return;
  auto it = by_hash_.find(cached->hash);
  if (it != by_hash_.end() && it->second == block) by_hash_.erase(it);
  cached.reset();
}

uint64_t BlockAllocator::chain_hash(uint64_t previous, const int64_t* tokens, int64_t count) {
  // splitmix64 steps over the previous hash and each token.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(previous);
  for (int64_t i = 0; i < count; ++i) h = mix(h ^ static_cast<uint64_t>(tokens[i]));
  return h;
}

std::optional<BlockId> BlockAllocator::lookup(uint64_t hash, const int64_t* tokens) {
  if (!prefix_caching_) return std::nullopt;
  ++prefix_queries_;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const BlockId block = it->second;
  const auto& cached = cached_[static_cast<size_t>(block)];
  if (!std::equal(cached->tokens.begin(), cached->tokens.end(), tokens)) return std::nullopt;
  auto& count = ref_counts_[static_cast<size_t>(block)];
  if (count == 0) evictable_.erase(evictable_pos_[static_cast<size_t>(block)]);
  ++count;
  ++prefix_hits_;
  return block;
}

void BlockAllocator::publish(BlockId block, uint64_t hash, const int64_t* tokens) {
  if (!prefix_caching_ || cached_[static_cast<size_t>(block)]) return;
  if (by_hash_.contains(hash)) return;  // an identical block is already cached
  cached_[static_cast<size_t>(block)] = Cached{hash, std::vector<int64_t>(tokens, tokens + block_size_)};
  by_hash_[hash] = block;
}

}  // namespace colossus::inference
