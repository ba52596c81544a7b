#include "colossus/inference/attention/paged_attention.h"

#include "colossus/kernels/cuda_slots.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/index_put.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/TensorOptions.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

namespace colossus::inference {

namespace {

// The CUDA kernels (kernels/paged_attention.h, reached through cuda_slots()
// so that this library needs no CUDA) take fp32/fp16/bf16.
std::optional<kernels::AttentionDtype> kernel_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return kernels::AttentionDtype::kFloat32;
    case at::kHalf:
      return kernels::AttentionDtype::kFloat16;
    case at::kBFloat16:
      return kernels::AttentionDtype::kBFloat16;
    default:
      return std::nullopt;
  }
}

bool fits_int32(int64_t v) { return v >= 0 && v <= std::numeric_limits<int32_t>::max(); }

// Both caches (num_blocks, kv_heads, block_size, head_dim), contiguous, on
// one CUDA device, of one dtype.
bool kernel_caches(const at::Tensor& key_cache, const at::Tensor& value_cache) {
  return key_cache.is_cuda() && key_cache.dim() == 4 && key_cache.sizes() == value_cache.sizes() &&
         key_cache.scalar_type() == value_cache.scalar_type() && key_cache.device() == value_cache.device() &&
         key_cache.is_contiguous() && value_cache.is_contiguous() && fits_int32(key_cache.size(1)) &&
         fits_int32(key_cache.size(2)) && fits_int32(key_cache.size(3));
}

bool on_device_int32(const at::Tensor& t, const at::Device& device) {
  return t.defined() && t.device() == device && t.scalar_type() == at::kInt;
}

// Runs the CUDA kernels when the build has them and they take these tensors;
// false (nothing launched) means: use the reference. Sizes come from the
// metadata's host fields, so nothing here waits for the device.
bool try_paged_attention_cuda(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                              const AttentionMetadata& meta, const models::AttentionSpec& spec, at::Tensor& out) {
  const auto launch = kernels::cuda_slots().paged_attention;
  const auto dtype = kernel_dtype(q.scalar_type());
  if (launch == nullptr || !dtype || !kernel_caches(key_cache, value_cache)) return false;
  if (!fits_int32(spec.window)) return false;
  const at::Device device = key_cache.device();
  const int64_t num_seqs = meta.num_seqs();
  if (q.dim() != 3 || q.device() != device || q.scalar_type() != key_cache.scalar_type() || q.stride(2) != 1 ||
      q.size(2) != key_cache.size(3) || !fits_int32(q.size(0)) || !fits_int32(q.size(1)) ||
      q.size(0) != meta.num_tokens()) {
    return false;
  }
  if (static_cast<int64_t>(meta.host_query_start.size()) != num_seqs + 1 ||
      !on_device_int32(meta.block_tables, device) || !on_device_int32(meta.query_start, device) ||
      !on_device_int32(meta.context_lens, device) ||
      meta.block_tables.dim() != 2 || meta.block_tables.size(0) != num_seqs || meta.block_tables.stride(1) != 1 ||
      !meta.query_start.is_contiguous() || !meta.context_lens.is_contiguous()) {
    return false;
  }
  kernels::PagedAttentionArgs args;
  args.has_decode_seqs = false;
  args.has_prefill_seqs = false;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t q_len = meta.host_query_start[s + 1] - meta.host_query_start[s];
    args.has_decode_seqs |= q_len == 1;
    args.has_prefill_seqs |= q_len > 1;
    args.max_query_len = std::max(args.max_query_len, q_len);
    args.max_context_len = std::max(args.max_context_len, meta.host_context_lens[s]);
  }
  out = at::empty(q.sizes(), q.options());
  args.out = out.data_ptr();
  args.q = q.data_ptr();
  args.out_token_stride = out.stride(0);
  args.out_head_stride = out.stride(1);
  args.q_token_stride = q.stride(0);
  args.q_head_stride = q.stride(1);
  args.key_cache = key_cache.data_ptr();
  args.value_cache = value_cache.data_ptr();
  args.block_tables = meta.block_tables.data_ptr<int32_t>();
  args.block_table_stride = meta.block_tables.stride(0);
  args.query_start = meta.query_start.data_ptr<int32_t>();
  args.context_lens = meta.context_lens.data_ptr<int32_t>();
  args.num_seqs = static_cast<int32_t>(num_seqs);
  args.num_tokens = static_cast<int32_t>(q.size(0));
  args.heads = static_cast<int32_t>(q.size(1));
  args.kv_heads = static_cast<int32_t>(key_cache.size(1));
  args.block_size = static_cast<int32_t>(key_cache.size(2));
  args.head_dim = static_cast<int32_t>(key_cache.size(3));
  args.max_blocks_per_seq = static_cast<int32_t>(meta.block_tables.size(1));
  args.scale = static_cast<float>(spec.scale);
  args.window = static_cast<int32_t>(spec.window);
  args.softcap = static_cast<float>(spec.softcap);
  args.dtype = *dtype;
  return launch(args, device.index());
}

// k, v rows into the caches by the CUDA kernel, when the build has it and
// the dtypes match (the reference also converts).
bool try_write_kv_cache_cuda(const at::Tensor& k, const at::Tensor& v, at::Tensor& key_cache,
                             at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  const auto launch = kernels::cuda_slots().reshape_and_cache;
  const auto dtype = kernel_dtype(key_cache.scalar_type());
  if (launch == nullptr || !dtype || !kernel_caches(key_cache, value_cache)) return false;
  const at::Device device = key_cache.device();
  if (k.device() != device || v.device() != device || k.scalar_type() != key_cache.scalar_type() ||
      v.scalar_type() != key_cache.scalar_type() || k.stride(2) != 1 || v.stride(2) != 1 ||
      slot_mapping.device() != device || slot_mapping.scalar_type() != at::kLong || slot_mapping.dim() != 1 ||
      !slot_mapping.is_contiguous() || slot_mapping.numel() != k.size(0) || !fits_int32(k.size(0))) {
    return false;
  }
  kernels::ReshapeAndCacheArgs args;
  args.k = k.data_ptr();
  args.v = v.data_ptr();
  args.k_token_stride = k.stride(0);
  args.k_head_stride = k.stride(1);
  args.v_token_stride = v.stride(0);
  args.v_head_stride = v.stride(1);
  args.key_cache = key_cache.data_ptr();
  args.value_cache = value_cache.data_ptr();
  args.slot_mapping = slot_mapping.data_ptr<int64_t>();
  args.num_tokens = k.size(0);
  args.kv_heads = static_cast<int32_t>(key_cache.size(1));
  args.block_size = static_cast<int32_t>(key_cache.size(2));
  args.head_dim = static_cast<int32_t>(key_cache.size(3));
  args.dtype = *dtype;
  return launch(args, device.index());
}

}  // namespace

void upload_metadata(AttentionMetadata& meta, const std::vector<int64_t>& slots, const at::Device& device) {
  size_t width = 1;
  for (const auto& row : meta.host_block_tables) width = std::max(width, row.size());
  const auto num_seqs = static_cast<int64_t>(meta.host_block_tables.size());
  // One host buffer and one copy (pinned and asynchronous on CUDA, so the host
  // never waits here): slot_mapping (int64) first, then the int32 block tables
  // (padded with 0), query_start and context_lens; the device tensors are views.
  const auto num_slots = static_cast<int64_t>(slots.size());
  const int64_t table_numel = num_seqs * static_cast<int64_t>(width);
  const auto starts = static_cast<int64_t>(meta.host_query_start.size());
  const auto lens = static_cast<int64_t>(meta.host_context_lens.size());
  const int64_t slot_bytes = num_slots * 8, int32_count = table_numel + starts + lens;
  at::Tensor host = at::empty({std::max<int64_t>(slot_bytes + int32_count * 4, 8)},
                              at::TensorOptions().dtype(at::kByte).pinned_memory(device.is_cuda()));
  auto* base = host.data_ptr<uint8_t>();
  if (num_slots > 0) std::memcpy(base, slots.data(), static_cast<size_t>(slot_bytes));
  auto* ints = reinterpret_cast<int32_t*>(base + slot_bytes);
  std::fill(ints, ints + table_numel, 0);
  for (size_t s = 0; s < meta.host_block_tables.size(); ++s) {
    std::copy(meta.host_block_tables[s].begin(), meta.host_block_tables[s].end(), ints + s * width);
  }
  std::copy(meta.host_query_start.begin(), meta.host_query_start.end(), ints + table_numel);
  std::copy(meta.host_context_lens.begin(), meta.host_context_lens.end(), ints + table_numel + starts);
  const at::Tensor on_device = host.to(at::TensorOptions().device(device), /*non_blocking=*/true);
  meta.slot_mapping = on_device.narrow(0, 0, slot_bytes).view(at::kLong);
  const at::Tensor int32s = on_device.narrow(0, slot_bytes, int32_count * 4).view(at::kInt);
  meta.block_tables = int32s.narrow(0, 0, table_numel).view({num_seqs, static_cast<int64_t>(width)});
  meta.query_start = int32s.narrow(0, table_numel, starts);
  meta.context_lens = int32s.narrow(0, table_numel + starts, lens);
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
  if (key_cache.is_cuda() && try_write_kv_cache_cuda(k, v, key_cache, value_cache, slot_mapping)) return;
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
                                     const AttentionMetadata& meta, const models::AttentionSpec& spec) {
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
    // Query j sits at position context - q_len + j: it sees keys 0..that (within the window).
    const at::Tensor mask = models::causal_window_mask(q_len, context, context - q_len, spec.window, key_cache.device());
    at::Tensor y = models::masked_attention(query, gather(key_cache), gather(value_cache), mask, spec, 0.0);
    out.narrow(0, begin, q_len).copy_(y.squeeze(0).transpose(0, 1));
  }
  return out;
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const AttentionMetadata& meta, const models::AttentionSpec& spec) {
  at::Tensor out;
  if (key_cache.is_cuda() && try_paged_attention_cuda(q, key_cache, value_cache, meta, spec, out)) return out;
  return paged_attention_reference(q, key_cache, value_cache, meta, spec);
}

std::optional<at::Tensor> paged_attention_packed(const at::Tensor& qkv, int64_t heads, const at::Tensor& cos,
                                                 const at::Tensor& signed_sin, at::Tensor& key_cache,
                                                 at::Tensor& value_cache, const AttentionMetadata& meta,
                                                 const models::AttentionSpec& spec) {
  const auto launch = kernels::cuda_slots().rope_qkv_cache;
  const auto dtype = kernel_dtype(qkv.scalar_type());
  if (launch == nullptr || !dtype || !kernel_caches(key_cache, value_cache)) return std::nullopt;
  const at::Device device = key_cache.device();
  const int64_t n = qkv.size(0), kv_heads = key_cache.size(1), head_dim = key_cache.size(3);
  const auto rope_rows_ok = [&](const at::Tensor& t) {
    return t.defined() && t.device() == device && t.scalar_type() == qkv.scalar_type() && t.dim() == 2 &&
           t.size(0) == n && t.size(1) == head_dim && t.is_contiguous();
  };
  const at::Tensor& slots = meta.slot_mapping;
  if (qkv.dim() != 2 || qkv.device() != device || qkv.scalar_type() != key_cache.scalar_type() || qkv.stride(1) != 1 ||
      qkv.size(1) != (heads + 2 * kv_heads) * head_dim || !fits_int32(heads) || !rope_rows_ok(cos) ||
      !rope_rows_ok(signed_sin) || !slots.defined() || slots.device() != device || slots.scalar_type() != at::kLong ||
      !slots.is_contiguous() || slots.numel() != n || n != meta.num_tokens()) {
    return std::nullopt;
  }
  at::Tensor q = at::empty({n, heads, head_dim}, qkv.options());
  kernels::RopeQkvCacheArgs args;
  args.qkv = qkv.data_ptr();
  args.qkv_token_stride = qkv.stride(0);
  args.cos = cos.data_ptr();
  args.signed_sin = signed_sin.data_ptr();
  args.q_out = q.data_ptr();
  args.key_cache = key_cache.data_ptr();
  args.value_cache = value_cache.data_ptr();
  args.slot_mapping = slots.data_ptr<int64_t>();
  args.num_tokens = n;
  args.q_heads = static_cast<int32_t>(heads);
  args.kv_heads = static_cast<int32_t>(kv_heads);
  args.head_dim = static_cast<int32_t>(head_dim);
  args.block_size = static_cast<int32_t>(key_cache.size(2));
  args.dtype = *dtype;
  if (!launch(args, device.index())) return std::nullopt;
  return paged_attention(q, key_cache, value_cache, meta, spec);
}

}  // namespace colossus::inference
