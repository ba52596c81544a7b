#include "colossus/inference/attention/paged_attention.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/index_put.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/TensorOptions.h>

#include <algorithm>

namespace colossus::inference {

void upload_metadata(AttentionMetadata& meta, const std::vector<int64_t>& slots, const at::Device& device) {
  const auto on_device = [&](at::ScalarType dtype) { return at::TensorOptions().dtype(dtype).device(device); };
  size_t width = 1;
  for (const auto& row : meta.host_block_tables) width = std::max(width, row.size());
  std::vector<int32_t> flat(meta.host_block_tables.size() * width, 0);
  for (size_t s = 0; s < meta.host_block_tables.size(); ++s) {
    std::copy(meta.host_block_tables[s].begin(), meta.host_block_tables[s].end(), flat.begin() + s * width);
  }
  const auto num_seqs = static_cast<int64_t>(meta.host_block_tables.size());
  meta.block_tables = at::tensor(flat, at::kInt).view({num_seqs, static_cast<int64_t>(width)}).to(on_device(at::kInt));
  meta.query_start = at::tensor(meta.host_query_start, at::kInt).to(on_device(at::kInt));
  meta.context_lens = at::tensor(meta.host_context_lens, at::kInt).to(on_device(at::kInt));
  meta.slot_mapping = at::tensor(slots, at::kLong).to(on_device(at::kLong));
  meta.max_query_len = 0;
  meta.max_context_len = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    meta.max_query_len = std::max<int64_t>(meta.max_query_len, meta.host_query_start[s + 1] - meta.host_query_start[s]);
    meta.max_context_len = std::max<int64_t>(meta.max_context_len, meta.host_context_lens[s]);
  }
}

void write_kv_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor& key_cache, at::Tensor& value_cache,
                    const at::Tensor& slot_mapping) {
  const int64_t block_size = key_cache.size(2);
  TORCH_CHECK(k.dim() == 3 && k.sizes() == v.sizes(), "write_kv_cache: k and v must be (N, kv_heads, head_dim)");
  TORCH_CHECK(k.size(1) == key_cache.size(1) && k.size(2) == key_cache.size(3), "write_kv_cache: k is ", k.sizes(),
              " but the cache holds ", key_cache.size(1), " heads of ", key_cache.size(3));
  at::Tensor keep = slot_mapping.ge(0);
  at::Tensor slots = slot_mapping.masked_select(keep);
  at::Tensor blocks = slots.div(block_size, "floor");
  at::Tensor offsets = slots.remainder(block_size);
  // cache[block, :, offset, :] = k[i]: advanced indices on dims 0 and 2 put
  // the token dim first, (n, kv_heads, head_dim), which is k's own layout.
  const auto write = [&](at::Tensor& cache, const at::Tensor& values) {
    at::Tensor rows = values.index({keep}).to(cache.scalar_type());
    cache.index_put_({blocks, at::indexing::Slice(), offsets}, rows);
  };
  write(key_cache, k);
  write(value_cache, v);
}

at::Tensor paged_attention_reference(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                     const AttentionMetadata& meta, double scale) {
  TORCH_CHECK(q.dim() == 3, "paged_attention: q must be (N, heads, head_dim), got ", q.sizes());
  const int64_t heads = q.size(1), kv_heads = key_cache.size(1), block_size = key_cache.size(2);
  TORCH_CHECK(heads % kv_heads == 0, "paged_attention: ", heads, " query heads is not a multiple of ", kv_heads,
              " kv heads");
  at::Tensor out = at::empty_like(q);
  const auto index_options = at::TensorOptions().dtype(at::kLong).device(key_cache.device());
  for (int64_t s = 0; s < meta.num_seqs(); ++s) {
    const int64_t begin = meta.host_query_start[s], end = meta.host_query_start[s + 1];
    const int64_t q_len = end - begin, context = meta.host_context_lens[s];
    if (q_len == 0) continue;
    const int64_t blocks_used = (context + block_size - 1) / block_size;
    std::vector<int64_t> blocks(meta.host_block_tables[s].begin(), meta.host_block_tables[s].begin() + blocks_used);
    at::Tensor block_ids = at::tensor(blocks, at::kLong).to(index_options);
    // (blocks, kv_heads, block_size, D) -> (1, kv_heads, context, D)
    const auto gather = [&](const at::Tensor& cache) {
      return cache.index_select(0, block_ids).permute({1, 0, 2, 3}).reshape({kv_heads, -1, cache.size(3)})
          .narrow(1, 0, context).unsqueeze(0).to(q.scalar_type());
    };
    at::Tensor query = q.narrow(0, begin, q_len).transpose(0, 1).unsqueeze(0);  // (1, heads, q_len, D)
    // Query j sits at position context - q_len + j: it sees keys 0..that.
    at::Tensor key_pos = at::arange(context, index_options);
    at::Tensor query_pos = at::arange(context - q_len, context, index_options).unsqueeze(1);
    at::Tensor mask = key_pos.unsqueeze(0).le(query_pos);  // (q_len, context) bool
    at::Tensor y = at::scaled_dot_product_attention(query, gather(key_cache), gather(value_cache), mask, 0.0,
                                                    /*is_causal=*/false, scale, /*enable_gqa=*/heads != kv_heads);
    out.narrow(0, begin, q_len).copy_(y.squeeze(0).transpose(0, 1));
  }
  return out;
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const AttentionMetadata& meta, double scale) {
  return paged_attention_reference(q, key_cache, value_cache, meta, scale);
}

}  // namespace colossus::inference
