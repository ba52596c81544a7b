// The bookkeeping of one KV pool's blocks: reference counts (a block shared
// by forked beams or by prompts with a common prefix is freed when its last
// user lets go) and the prefix cache: full blocks keyed by a hash of every
// token up to their end, kept after their last user releases them (evicted
// least recently used) so a later prompt with the same prefix reuses them.
#pragma once
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace colossus::inference {

using BlockId = int32_t;

class BlockAllocator {
 public:
  BlockAllocator(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t block_size() const { return block_size_; }
  // Blocks allocate() can hand out: never used, or cached with no user.
  int64_t num_available() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }
  int64_t num_used() const { return num_blocks() - num_available(); }

  // A block with reference count 1 and no hash; evicts the least recently
  // used cached block when no free one is left. nullopt when all are in use.
  std::optional<BlockId> allocate();
  void retain(BlockId block);
  // Drops one reference; at zero a hashed block stays cached (evictable),
  // any other returns to the free list.
  void release(BlockId block);
  int32_t ref_count(BlockId block) const { return ref_counts_.at(static_cast<size_t>(block)); }

  // Prefix cache. `hash` chains the previous block's hash with this block's
  // tokens; the tokens are kept too and compared on lookup, so a hash
  // collision is a miss, never someone else's KV.
  static uint64_t chain_hash(uint64_t previous, const int64_t* tokens, int64_t count);
  // A hit takes a reference (reviving the block if it had no user).
  std::optional<BlockId> lookup(uint64_t hash, const int64_t* tokens);
  // Marks a full block's contents as reusable under `hash`.
  void publish(BlockId block, uint64_t hash, const int64_t* tokens);
  int64_t prefix_queries() const { return prefix_queries_; }
  int64_t prefix_hits() const { return prefix_hits_; }

 private:
  struct Cached {
    uint64_t hash = 0;
    std::vector<int64_t> tokens;
  };
  void forget(BlockId block);

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<int32_t> ref_counts_;
  std::vector<BlockId> free_;
  std::list<BlockId> evictable_;  // cached, no user; front = least recently used
  std::vector<std::list<BlockId>::iterator> evictable_pos_;
  std::vector<std::optional<Cached>> cached_;  // per block
  std::unordered_map<uint64_t, BlockId> by_hash_;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
};

}  // namespace colossus::inference
