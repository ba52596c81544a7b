#include "colossus/inference/engine/kv_cache.h"

#include "colossus/models/causal_lm.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace colossus::inference {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

KVCacheShape kv_cache_shape(const models::CausalLM& model, int64_t block_size) {
  KVCacheShape shape{.num_layers = static_cast<int64_t>(model.blocks().size()), .block_size = block_size};
  std::visit(
      [&](const auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, models::GPT2Config>) {
          shape.kv_heads = c.n_head;
          shape.head_dim = c.head_dim();
        } else if constexpr (std::is_same_v<C, models::DeepseekConfig>) {
          // MLA under an attention hook is multi-query attention over one
          // compressed row per token, [latent | rotated shared key], which
          // is also its value (mla_attention.h).
          shape.kv_heads = 1;
          shape.head_dim = c.kv_lora_rank + c.qk_rope_head_dim;
          shape.values_alias_keys = true;
        } else {
          shape.kv_heads = c.kv_heads();
          shape.head_dim = c.resolved_head_dim();
        }
      },
      model.config());
  return shape;
}

KVCache::KVCache(const KVCacheShape& shape, const at::TensorOptions& options, bool enable_prefix_caching)
    : shape_(shape), allocator_(shape.num_blocks, shape.block_size, enable_prefix_caching) {
  TORCH_CHECK(shape.num_blocks > 0 && shape.num_layers > 0, "KV cache needs at least one block and one layer");
  // One allocation for all layers; per-layer keys/values are views of it.
  const int64_t planes = shape.values_alias_keys ? 1 : 2;
  at::Tensor pool = at::empty({shape.num_layers, planes, shape.num_blocks, shape.kv_heads, shape.block_size, shape.head_dim},
                              options);
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    keys_.push_back(pool[l][0]);
    values_.push_back(pool[l][planes - 1]);
  }
}

int64_t KVCache::cache_position(const Sequence& seq, int64_t position) const {
  return position - seq.dropped_blocks * shape_.block_size;
}

int64_t KVCache::slot(const Sequence& seq, int64_t position) const {
  const int64_t p = cache_position(seq, position);
  const BlockId block = seq.blocks.at(static_cast<size_t>(p / shape_.block_size));
  return static_cast<int64_t>(block) * shape_.block_size + p % shape_.block_size;
}

int64_t KVCache::match_prefix(Sequence& seq) {
  TORCH_CHECK(seq.blocks.empty() && seq.num_computed == 0, "match_prefix on a sequence that already has KV blocks");
  const int64_t bs = shape_.block_size;
  // Full blocks strictly before the last prompt token, which must be computed.
  const int64_t candidates = (seq.prompt_len - 1) / bs;
  uint64_t hash = 0;
  for (int64_t b = 0; b < candidates; ++b) {
    const int64_t* tokens = seq.tokens.data() + b * bs;
    const uint64_t next = BlockAllocator::chain_hash(hash, tokens, bs);
    auto block = allocator_.lookup(next, tokens);
    if (!block) break;
    seq.blocks.push_back(*block);
    hash = next;
  }
  const auto hit_blocks = static_cast<int64_t>(seq.blocks.size());
  seq.hashed_blocks = hit_blocks;
  seq.last_hash = hash;
  seq.num_computed = hit_blocks * bs;
  seq.num_cached_prefix = seq.num_computed;
  return seq.num_computed;
}

int64_t KVCache::blocks_needed(const Sequence& seq, int64_t count) const {
  const int64_t first = cache_position(seq, seq.num_computed);
  const auto have = static_cast<int64_t>(seq.blocks.size());
  int64_t needed = std::max<int64_t>(0, ceil_div(first + count, shape_.block_size) - have);
  const int64_t first_block = first / shape_.block_size;
  if (count > 0 && first_block < have && allocator_.ref_count(seq.blocks[static_cast<size_t>(first_block)]) > 1) {
    ++needed;
  }
  return needed;
}

bool KVCache::reserve(Sequence& seq, int64_t count) {
  if (count <= 0) return true;
  if (blocks_needed(seq, count) > allocator_.num_available()) return false;
  const int64_t first = cache_position(seq, seq.num_computed);
  const size_t first_block = static_cast<size_t>(first / shape_.block_size);
  if (first_block < seq.blocks.size() && allocator_.ref_count(seq.blocks[first_block]) > 1) {
    const BlockId shared = seq.blocks[first_block];
    const BlockId copy = *allocator_.allocate();
    pending_copies_.emplace_back(shared, copy);
    allocator_.release(shared);
    seq.blocks[first_block] = copy;
  }
  while (static_cast<int64_t>(seq.blocks.size()) < ceil_div(first + count, shape_.block_size)) {
    seq.blocks.push_back(*allocator_.allocate());
  }
  return true;
}

void KVCache::publish(Sequence& seq) {
  if (seq.dropped_blocks > 0) return;  // positions no longer match the token prefix
  const int64_t bs = shape_.block_size;
  const int64_t full = std::min<int64_t>(seq.num_computed / bs, static_cast<int64_t>(seq.blocks.size()));
  for (int64_t b = seq.hashed_blocks; b < full; ++b) {
    const int64_t* tokens = seq.tokens.data() + b * bs;
    seq.last_hash = BlockAllocator::chain_hash(seq.last_hash, tokens, bs);
    allocator_.publish(seq.blocks[static_cast<size_t>(b)], seq.last_hash, tokens);
    seq.hashed_blocks = b + 1;
  }
}

void KVCache::apply_copies() {
  if (pending_copies_.empty()) return;
  std::vector<int64_t> from, to;
  for (auto [f, t] : pending_copies_) {
    from.push_back(f);
    to.push_back(t);
  }
  pending_copies_.clear();
  const auto device = keys_[0].device();
  at::Tensor src = at::tensor(from, at::kLong).to(device), dst = at::tensor(to, at::kLong).to(device);
  for (size_t l = 0; l < keys_.size(); ++l) {
    keys_[l].index_copy_(0, dst, keys_[l].index_select(0, src));
    if (!shape_.values_alias_keys) values_[l].index_copy_(0, dst, values_[l].index_select(0, src));
  }
}

void KVCache::fork(const Sequence& parent, Sequence& child) {
  TORCH_CHECK(child.blocks.empty(), "fork into a sequence that has KV blocks");
  child.blocks = parent.blocks;
  for (BlockId b : child.blocks) allocator_.retain(b);
  child.num_computed = parent.num_computed;
  child.dropped_blocks = parent.dropped_blocks;
  child.hashed_blocks = parent.hashed_blocks;
  child.last_hash = parent.last_hash;
}

void KVCache::drop_window(Sequence& seq, int64_t sink_tokens, int64_t window_tokens) {
  const int64_t bs = shape_.block_size;
  const int64_t sink_blocks = sink_tokens / bs;
  // Drop the oldest block after the sinks while at least window_tokens
  // recent tokens would remain: at most sink + window + block_size - 1 stay.
  while (cache_position(seq, seq.num_computed) - sink_tokens - bs >= window_tokens &&
         static_cast<int64_t>(seq.blocks.size()) > sink_blocks + 1) {
    allocator_.release(seq.blocks[static_cast<size_t>(sink_blocks)]);
    seq.blocks.erase(seq.blocks.begin() + sink_blocks);
    ++seq.dropped_blocks;
  }
}

void KVCache::truncate(Sequence& seq, int64_t num_tokens) {
  const int64_t keep = ceil_div(cache_position(seq, num_tokens), shape_.block_size);
  while (static_cast<int64_t>(seq.blocks.size()) > keep) {
    allocator_.release(seq.blocks.back());
    seq.blocks.pop_back();
  }
  seq.num_computed = std::min(seq.num_computed, num_tokens);
  seq.hashed_blocks = std::min(seq.hashed_blocks, seq.num_computed / shape_.block_size);
}

void KVCache::free(Sequence& seq) {
  for (BlockId b : seq.blocks) allocator_.release(b);
  seq.blocks.clear();
  seq.num_computed = 0;
  seq.dropped_blocks = 0;
  seq.hashed_blocks = 0;
  seq.last_hash = 0;
}

}  // namespace colossus::inference
