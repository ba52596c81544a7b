// The KV pool of all layers and the per-sequence operations on it: reserving
// blocks for the tokens a step will write, reusing cached prompt prefixes,
// copy-on-write of shared blocks, forking (beams), StreamingLLM's window, freeing.
#pragma once
#include "colossus/inference/engine/block_allocator.h"
#include "colossus/inference/engine/sequence.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace colossus::models {
class CausalLM;
}

namespace colossus::inference {

struct KVCacheShape {
  int64_t num_layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;
  int64_t num_blocks = 0;
  // MLA's compressed cache (DeepSeek): one row per token that serves as key
  // and value, so the values are a view of the keys and take no memory.
  bool values_alias_keys = false;
  int64_t bytes_per_block(int64_t element_size) const {
    return (values_alias_keys ? 1 : 2) * num_layers * kv_heads * block_size * head_dim * element_size;
  }
};

// The cache shape of a model's attention layers (kv heads, head dim, layers).
KVCacheShape kv_cache_shape(const models::CausalLM& model, int64_t block_size);

class KVCache {
 public:
  // The pool is allocated (uninitialised) on `options`' device and dtype.
  KVCache(const KVCacheShape& shape, const at::TensorOptions& options, bool enable_prefix_caching);

  const KVCacheShape& shape() const { return shape_; }
  int64_t block_size() const { return shape_.block_size; }
  // (num_blocks, kv_heads, block_size, head_dim) views of layer `layer`'s pool.
  at::Tensor& keys(int64_t layer) { return keys_[static_cast<size_t>(layer)]; }
  at::Tensor& values(int64_t layer) { return values_[static_cast<size_t>(layer)]; }
  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }

  // A new sequence (no blocks yet): takes the cached blocks of its longest
  // prompt prefix of full blocks, leaving at least one prompt token to
  // compute (its logits are needed). Returns the tokens reused.
  int64_t match_prefix(Sequence& seq);
  // Blocks needed to hold `count` more tokens after seq.num_computed
  // (counting the copy of a shared block about to be written).
  int64_t blocks_needed(const Sequence& seq, int64_t count) const;
  // Makes room for `count` more tokens: new blocks, and a private copy of a
  // shared block they would write into (copied at the next apply_copies()).
  // All or nothing: false (and nothing changed) when the pool is short.
  bool reserve(Sequence& seq, int64_t count);
  // The cache slot (block * block_size + offset) of token position `position`.
  int64_t slot(const Sequence& seq, int64_t position) const;
  // The cache position of token `position` (differs after StreamingLLM drops).
  int64_t cache_position(const Sequence& seq, int64_t position) const;
  // Publishes the sequence's newly completed full blocks to the prefix cache.
  void publish(Sequence& seq);
  // Copies pending copy-on-write blocks in every layer (one gather per layer).
  void apply_copies();
  // child shares all of parent's blocks (beam forks).
  void fork(const Sequence& parent, Sequence& child);
  // Drops blocks past the sinks until the sequence keeps at most
  // sink_tokens + window_tokens cached tokens (StreamingLLM).
  void drop_window(Sequence& seq, int64_t sink_tokens, int64_t window_tokens);
  // Trims blocks past the first `num_tokens` cache positions (speculative rollback).
  void truncate(Sequence& seq, int64_t num_tokens);
  void free(Sequence& seq);

 private:
  KVCacheShape shape_;
  std::vector<at::Tensor> keys_, values_;
  BlockAllocator allocator_;
  std::vector<std::pair<BlockId, BlockId>> pending_copies_;  // (from, to)
};

}  // namespace colossus::inference
