// Block bookkeeping: reference counts, the prefix cache (hits, LRU eviction,
// collisions are misses) and the KV cache's copy-on-write, fork and window.
#include "colossus/inference/engine/block_allocator.h"
#include "colossus/inference/engine/kv_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

namespace colossus::inference {
namespace {

TEST(BlockAllocator, HandsOutEveryBlockOnceAndRefusesWhenExhausted) {
  BlockAllocator blocks(4, 2, /*enable_prefix_caching=*/false);
  std::set<BlockId> seen;
  for (int i = 0; i < 4; ++i) {
    auto b = blocks.allocate();
    ASSERT_TRUE(b.has_value());
    EXPECT_TRUE(seen.insert(*b).second);
    EXPECT_EQ(blocks.ref_count(*b), 1);
  }
  EXPECT_FALSE(blocks.allocate().has_value());
  EXPECT_EQ(blocks.num_available(), 0);
  const BlockId first = *seen.begin();
  blocks.retain(first);
  blocks.release(first);
  EXPECT_EQ(blocks.num_available(), 0) << "a block with a user left must not be freed";
  blocks.release(first);
  EXPECT_EQ(blocks.num_available(), 1);
  EXPECT_EQ(blocks.allocate(), first);
}

TEST(BlockAllocator, PrefixCacheRevivesReleasedBlocksAndEvictsLeastRecentlyUsed) {
  BlockAllocator blocks(3, 2, /*enable_prefix_caching=*/true);
  const int64_t a[] = {1, 2}, b[] = {3, 4};
  const uint64_t ha = BlockAllocator::chain_hash(0, a, 2), hb = BlockAllocator::chain_hash(ha, b, 2);
  const BlockId block_a = *blocks.allocate(), block_b = *blocks.allocate();
  blocks.publish(block_a, ha, a);
  blocks.publish(block_b, hb, b);
  blocks.release(block_a);
  blocks.release(block_b);
  EXPECT_EQ(blocks.num_available(), 3) << "cached blocks without users are available";

  // A hit revives the block with a reference.
  EXPECT_EQ(blocks.lookup(ha, a), block_a);
  EXPECT_EQ(blocks.ref_count(block_a), 1);
  EXPECT_EQ(blocks.num_available(), 2);
  // Same hash, other tokens: a collision must be a miss.
  const int64_t other[] = {9, 9};
  EXPECT_FALSE(blocks.lookup(ha, other).has_value());

  // The free block goes first, then the LRU cached one (b), never a used one.
  const BlockId fresh = *blocks.allocate();
  EXPECT_NE(fresh, block_a);
  EXPECT_NE(fresh, block_b);
  EXPECT_EQ(blocks.allocate(), block_b);
  EXPECT_FALSE(blocks.lookup(hb, b).has_value()) << "an evicted block is no longer in the cache";
  EXPECT_FALSE(blocks.allocate().has_value());
  EXPECT_EQ(blocks.prefix_hits(), 1);
  EXPECT_EQ(blocks.prefix_queries(), 3);
}

KVCache small_cache(int64_t num_blocks, bool prefix_caching = false) {
  return KVCache({.num_layers = 2, .kv_heads = 1, .head_dim = 2, .block_size = 2, .num_blocks = num_blocks},
                 at::TensorOptions().dtype(at::kFloat), prefix_caching);
}

Sequence sequence_of(int64_t length) {
  Sequence seq;
  for (int64_t i = 0; i < length; ++i) seq.tokens.push_back(i + 1);
  seq.prompt_len = length;
  return seq;
}

TEST(KVCache, ReserveIsAllOrNothing) {
  KVCache cache = small_cache(3);
  Sequence seq = sequence_of(8);
  EXPECT_EQ(cache.blocks_needed(seq, 8), 4);
  EXPECT_FALSE(cache.reserve(seq, 8));
  EXPECT_TRUE(seq.blocks.empty());
  EXPECT_EQ(cache.allocator().num_available(), 3);
  EXPECT_TRUE(cache.reserve(seq, 5));
  EXPECT_EQ(seq.blocks.size(), 3u);
  EXPECT_EQ(cache.slot(seq, 4), static_cast<int64_t>(seq.blocks[2]) * 2);
  cache.free(seq);
  EXPECT_EQ(cache.allocator().num_available(), 3);
}

TEST(KVCache, ForkSharesBlocksAndWritingCopiesTheSharedOne) {
  KVCache cache = small_cache(6);
  Sequence parent = sequence_of(3);
  ASSERT_TRUE(cache.reserve(parent, 3));
  parent.num_computed = 3;
  for (int64_t l = 0; l < 2; ++l) {
    cache.keys(l).fill_(0);
    cache.keys(l)[parent.blocks[1]].fill_(static_cast<double>(7 + l));
  }
  Sequence child;
  child.tokens = parent.tokens;
  child.prompt_len = 3;
  cache.fork(parent, child);
  EXPECT_EQ(cache.allocator().ref_count(parent.blocks[1]), 2);
  // The child writes position 3, inside the shared second block: it gets a private copy.
  child.tokens.push_back(42);
  EXPECT_EQ(cache.blocks_needed(child, 1), 1);
  ASSERT_TRUE(cache.reserve(child, 1));
  EXPECT_NE(child.blocks[1], parent.blocks[1]);
  EXPECT_EQ(child.blocks[0], parent.blocks[0]);
  EXPECT_EQ(cache.allocator().ref_count(parent.blocks[1]), 1);
  cache.apply_copies();
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(at::equal(cache.keys(l)[child.blocks[1]], cache.keys(l)[parent.blocks[1]])) << "layer " << l;
    EXPECT_EQ(cache.keys(l)[child.blocks[1]].max().item<float>(), static_cast<float>(7 + l));
  }
}

TEST(KVCache, PrefixMatchLeavesTheLastPromptTokenToCompute) {
  KVCache cache = small_cache(8, /*prefix_caching=*/true);
  Sequence first = sequence_of(6);
  ASSERT_TRUE(cache.reserve(first, 6));
  first.num_computed = 6;
  cache.publish(first);
  EXPECT_EQ(first.hashed_blocks, 3);
  cache.free(first);

  Sequence same = sequence_of(6);  // all 3 blocks cached, but the last token must run
  EXPECT_EQ(cache.match_prefix(same), 4);
  Sequence longer = sequence_of(9);
  EXPECT_EQ(cache.match_prefix(longer), 6);
  Sequence diverging = sequence_of(6);
  diverging.tokens[2] = 99;  // second block differs: only the first matches
  EXPECT_EQ(cache.match_prefix(diverging), 2);
}

TEST(KVCache, StreamingWindowKeepsSinksAndBoundsTheBlocks) {
  KVCache cache = small_cache(16);
  Sequence seq = sequence_of(20);
  ASSERT_TRUE(cache.reserve(seq, 20));
  seq.num_computed = 20;
  const BlockId sink = seq.blocks[0];
  cache.drop_window(seq, /*sink_tokens=*/2, /*window_tokens=*/4);
  EXPECT_EQ(seq.blocks[0], sink);
  EXPECT_LE(cache.cache_position(seq, seq.num_computed), 2 + 4 + 2);
  EXPECT_EQ(seq.dropped_blocks, 10 - static_cast<int64_t>(seq.blocks.size()));
  EXPECT_EQ(cache.allocator().num_used(), static_cast<int64_t>(seq.blocks.size()));
}

}  // namespace
}  // namespace colossus::inference
