// The paged-attention reference against plain causal attention over
// contiguous K/V: random block layouts (blocks scattered and shuffled over
// the pool), mixed prefill chunks and decode tokens in one step, GQA, sliding
// windows and soft-capped scores (written out here independently).
#include "colossus/inference/attention/paged_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace colossus::inference {
namespace {

struct Layout {
  int64_t heads, kv_heads, head_dim, block_size, num_blocks;
  std::vector<int64_t> context_lens;  // per sequence, after this step
  std::vector<int64_t> query_lens;    // new tokens per sequence this step
  int64_t window = 0;                 // sliding window (0: none)
  double softcap = 0.0;
};

// Full K/V per sequence written through the cache in one step (as if every
// position were new), then attention for the last q_len positions only.
void check_layout(const Layout& l, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  std::mt19937 rng(static_cast<unsigned>(seed));
  at::Tensor key_cache = at::zeros({l.num_blocks, l.kv_heads, l.block_size, l.head_dim});
  at::Tensor value_cache = at::zeros_like(key_cache);
  std::vector<int64_t> free_blocks(static_cast<size_t>(l.num_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);

  AttentionMetadata meta;
  meta.host_query_start.push_back(0);
  std::vector<int64_t> slots;
  std::vector<at::Tensor> full_k, full_v, queries;
  for (size_t s = 0; s < l.context_lens.size(); ++s) {
    const int64_t context = l.context_lens[s], q_len = l.query_lens[s];
    std::vector<int32_t> table;
    for (int64_t b = 0; b < (context + l.block_size - 1) / l.block_size; ++b) {
      table.push_back(static_cast<int32_t>(free_blocks.back()));
      free_blocks.pop_back();
    }
    at::Tensor k = at::randn({context, l.kv_heads, l.head_dim}), v = at::randn({context, l.kv_heads, l.head_dim});
    at::Tensor all_slots = at::empty({context}, at::kLong);
    for (int64_t p = 0; p < context; ++p) all_slots[p] = table[p / l.block_size] * l.block_size + p % l.block_size;
    write_kv_cache(k, v, key_cache, value_cache, all_slots);
    full_k.push_back(k);
    full_v.push_back(v);
    queries.push_back(at::randn({q_len, l.heads, l.head_dim}));
    meta.host_block_tables.push_back(table);
    meta.host_context_lens.push_back(static_cast<int32_t>(context));
    meta.host_query_start.push_back(meta.host_query_start.back() + static_cast<int32_t>(q_len));
  }
  upload_metadata(meta, slots, at::kCPU);
  at::Tensor q = at::cat(queries);
  const double scale = 1.0 / std::sqrt(static_cast<double>(l.head_dim));
  at::Tensor out = paged_attention_reference(q, key_cache, value_cache, meta,
                                             {.scale = scale, .window = l.window, .softcap = l.softcap});

  for (size_t s = 0; s < l.context_lens.size(); ++s) {
    const int64_t context = l.context_lens[s], q_len = l.query_lens[s];
    const int64_t groups = l.heads / l.kv_heads;
    at::Tensor k = full_k[s].repeat_interleave(groups, 1).transpose(0, 1);  // (heads, context, D)
    at::Tensor v = full_v[s].repeat_interleave(groups, 1).transpose(0, 1);
    at::Tensor qs = queries[s].transpose(0, 1);                              // (heads, q_len, D)
    at::Tensor scores = at::matmul(qs, k.transpose(1, 2)) * scale;           // (heads, q_len, context)
    if (l.softcap > 0) scores = (scores / l.softcap).tanh() * l.softcap;
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t position = context - q_len + j;
      if (position + 1 < context) scores.select(1, j).narrow(1, position + 1, context - position - 1).fill_(-INFINITY);
      // The window: keys at positions <= position - window are out of sight.
      const int64_t hidden_before = l.window > 0 ? std::max<int64_t>(0, position - l.window + 1) : 0;
      if (hidden_before > 0) scores.select(1, j).narrow(1, 0, hidden_before).fill_(-INFINITY);
    }
    at::Tensor expected = at::matmul(scores.softmax(-1), v).transpose(0, 1);  // (q_len, heads, D)
    at::Tensor got = out.narrow(0, meta.host_query_start[s], q_len);
    EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-5))
        << "sequence " << s << " (context " << context << ", q_len " << q_len << ") max diff "
        << (got - expected).abs().max().item<float>();
  }
}

TEST(PagedAttentionReference, DecodeOnlyMatchesContiguousAttention) {
  check_layout({.heads = 4, .kv_heads = 4, .head_dim = 8, .block_size = 4, .num_blocks = 40,
                .context_lens = {1, 5, 8, 13}, .query_lens = {1, 1, 1, 1}},
               1);
}

TEST(PagedAttentionReference, MixedPrefillChunksAndDecodeWithGqa) {
  check_layout({.heads = 6, .kv_heads = 2, .head_dim = 16, .block_size = 8, .num_blocks = 64,
                .context_lens = {17, 3, 40, 9, 64}, .query_lens = {17, 1, 7, 1, 30}},
               2);
}

TEST(PagedAttentionReference, SlidingWindowOverBlocksAndChunks) {
  // Windows cut mid-block, chunks longer than the window, a window of 1.
  for (int64_t window : {1, 5, 12}) {
    check_layout({.heads = 6, .kv_heads = 2, .head_dim = 16, .block_size = 4, .num_blocks = 64,
                  .context_lens = {17, 3, 40, 9, 64}, .query_lens = {17, 1, 7, 1, 30}, .window = window},
                 3 + static_cast<uint64_t>(window));
  }
}

TEST(PagedAttentionReference, SoftCappedScoresWithAWindow) {
  check_layout({.heads = 4, .kv_heads = 2, .head_dim = 8, .block_size = 4, .num_blocks = 40,
                .context_lens = {13, 1, 20}, .query_lens = {13, 1, 3}, .window = 6, .softcap = 2.0},
               9);
}

TEST(PagedAttentionReference, SkippedSlotsAreNotWritten) {
  at::Tensor key_cache = at::zeros({2, 1, 2, 4}), value_cache = at::zeros_like(key_cache);
  at::Tensor k = at::ones({3, 1, 4}), v = at::full({3, 1, 4}, 2.0);
  write_kv_cache(k, v, key_cache, value_cache, at::tensor(std::vector<int64_t>{3, -1, 0}));
  EXPECT_EQ(key_cache.sum().item<float>(), 8.0f);   // two tokens of 4 ones
  EXPECT_EQ(value_cache.sum().item<float>(), 16.0f);
  EXPECT_EQ(key_cache[1][0][1].sum().item<float>(), 4.0f);  // slot 3 = block 1, offset 1
  EXPECT_EQ(key_cache[0][0][1].sum().item<float>(), 0.0f);  // slot 1 untouched
}

}  // namespace
}  // namespace colossus::inference
