// CUDA builds only (in the colossus_cuda bundle): the `colossus check`
// self-tests of the paged-attention kernels, registered with the kernel
// registry. The KV-cache write is checked against the CPU path bit for bit,
// and attention over random paged layouts (shuffled blocks, mixed lengths, a
// long split context, GQA, prefill chunks next to decode rows; bf16/fp16
// prefill on tensor cores and on CUDA cores; sliding windows; soft caps) against
// paged_attention_reference run in float64 on the CPU. While a test runs, the
// kernel slots are wrapped to count launches, so a dispatch that fell back to
// the reference is caught.
#include "colossus/inference/attention/paged_attention.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/registry.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace colossus::inference {

namespace {

// The slots as the kernel layer filled them, wrapped for the duration of a test.
struct CountingSlots {
  kernels::CudaPagedAttentionFn attention = nullptr;
  kernels::CudaReshapeAndCacheFn reshape_and_cache = nullptr;
  std::atomic<int64_t> attention_launches{0};
  std::atomic<int64_t> cache_writes{0};
  std::atomic<bool> cuda_core_prefill{false};  // bf16/fp16 prefill on the CUDA-core kernel
};
CountingSlots counting;

bool counted_attention(const kernels::PagedAttentionArgs& args, int device_index) {
  kernels::PagedAttentionArgs a = args;
  if (counting.cuda_core_prefill.load()) a.prefill_tensor_cores = false;
  const bool launched = counting.attention(a, device_index);
  if (launched) ++counting.attention_launches;
  return launched;
}

bool counted_cache_write(const kernels::ReshapeAndCacheArgs& args, int device_index) {
  const bool launched = counting.reshape_and_cache(args, device_index);
  if (launched) ++counting.cache_writes;
  return launched;
}

// Installs the counting wrappers; restores the kernel layer's slots on exit.
class CountLaunches {
 public:
  CountLaunches() {
    auto& slots = kernels::cuda_slots();
    counting.attention = slots.paged_attention;
    counting.reshape_and_cache = slots.reshape_and_cache;
    if (counting.attention != nullptr) slots.paged_attention = counted_attention;
    if (counting.reshape_and_cache != nullptr) slots.reshape_and_cache = counted_cache_write;
  }
  ~CountLaunches() {
    auto& slots = kernels::cuda_slots();
    slots.paged_attention = counting.attention;
    slots.reshape_and_cache = counting.reshape_and_cache;
    counting.cuda_core_prefill = false;
  }
  CountLaunches(const CountLaunches&) = delete;
  CountLaunches& operator=(const CountLaunches&) = delete;
};


struct Tolerance {
  double atol, rtol;
};

Tolerance tolerance_for(at::ScalarType dtype) {
  // Inputs are the same rounded values for both sides; what remains is fp32
  // accumulation and the rounding of the output to the input dtype.
  if (dtype == at::kBFloat16) return {2e-2, 1e-2};
  if (dtype == at::kHalf) return {4e-3, 2e-3};
  return {1e-4, 1e-4};
}

std::string dtype_name(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? "bf16" : dtype == at::kHalf ? "fp16" : "fp32";
}

// Bit-level equality (NaN == NaN), so caches poisoned with NaN compare.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  const auto int_type = a.element_size() == 4 ? at::kInt : at::kShort;
  return at::equal(a.contiguous().view(int_type), b.contiguous().view(int_type));
}

struct Layout {
  const char* name;
  int64_t heads, kv_heads, head_dim, block_size;
  std::vector<int64_t> context_lens;  // per sequence, this step's tokens included
  std::vector<int64_t> query_lens;    // new tokens per sequence
  int64_t window = 0;                 // sliding window (0: none)
  double softcap = 0.0;               // score soft cap (0: none)
};

// One layout in one dtype: K/V of every cached position written through
// write_kv_cache (strided rows plus junk rows at slot -1) into NaN-poisoned
// caches with shuffled blocks, then paged_attention against the reference.
std::string check_layout(const Layout& l, at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  std::mt19937 rng(static_cast<unsigned>(seed));
  const auto on_gpu = at::TensorOptions().dtype(dtype).device(at::kCUDA);
  int64_t blocks_needed = 0;
  for (int64_t c : l.context_lens) blocks_needed += (c + l.block_size - 1) / l.block_size;
  const int64_t num_blocks = blocks_needed + 5;
  at::Tensor key_cache = at::full({num_blocks, l.kv_heads, l.block_size, l.head_dim}, NAN, on_gpu);
  at::Tensor value_cache = at::full_like(key_cache, NAN);
  std::vector<int64_t> free_blocks(static_cast<size_t>(num_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);

  AttentionMetadata meta;
  meta.host_query_start.push_back(0);
  std::vector<int64_t> step_slots;
  std::vector<at::Tensor> queries;
  const int64_t writes_before = counting.cache_writes.load();
  for (size_t s = 0; s < l.context_lens.size(); ++s) {
    const int64_t context = l.context_lens[s], q_len = l.query_lens[s];
    std::vector<int32_t> table;
    for (int64_t b = 0; b < (context + l.block_size - 1) / l.block_size; ++b) {
      table.push_back(static_cast<int32_t>(free_blocks.back()));
      free_blocks.pop_back();
    }
    // Rows of a (tokens, 2, kv_heads, D) buffer: K and V are strided views.
    // Three junk rows of huge values go to slot -1 and must land nowhere.
    at::Tensor kv = at::randn({context + 3, 2, l.kv_heads, l.head_dim}, on_gpu);
    kv.narrow(0, context, 3).fill_(1e4);
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < context; ++p) slots.push_back(table[p / l.block_size] * l.block_size + p % l.block_size);
    slots.insert(slots.end(), {-1, -1, -1});
    write_kv_cache(kv.select(1, 0), kv.select(1, 1), key_cache, value_cache,
                              at::tensor(slots, at::kLong).to(at::kCUDA));
    for (int64_t p = context - q_len; p < context; ++p) step_slots.push_back(slots[p]);
    queries.push_back(at::randn({q_len, l.heads, l.head_dim}, on_gpu));
    meta.host_block_tables.push_back(table);
    meta.host_context_lens.push_back(static_cast<int32_t>(context));
    meta.host_query_start.push_back(meta.host_query_start.back() + static_cast<int32_t>(q_len));
  }
  if (counting.cache_writes.load() == writes_before) return "write_kv_cache did not use the CUDA kernel";
  upload_metadata(meta, step_slots, key_cache.device());
  // q as a strided view (two extra heads per row) on odd seeds.
  at::Tensor q = at::cat(queries);
  if (seed % 2 == 1) {
    at::Tensor wide = at::randn({q.size(0), l.heads + 2, l.head_dim}, on_gpu);
    wide.narrow(1, 1, l.heads).copy_(q);
    q = wide.narrow(1, 1, l.heads);
  }
  const models::AttentionSpec spec{
      .scale = 1.0 / std::sqrt(static_cast<double>(l.head_dim)), .window = l.window, .softcap = l.softcap};

  const int64_t launches_before = counting.attention_launches.load();
  const at::Tensor out = paged_attention(q, key_cache, value_cache, meta, spec);
  if (counting.attention_launches.load() == launches_before) return "paged_attention fell back to the reference";
  const at::Tensor expected = paged_attention_reference(
      q.cpu().to(at::kDouble), key_cache.cpu().to(at::kDouble), value_cache.cpu().to(at::kDouble), meta, spec);
  const at::Tensor got = out.cpu().to(at::kDouble);
  const Tolerance tol = tolerance_for(dtype);
  const at::Tensor err = (got - expected).abs();
  const at::Tensor bad = err.gt(expected.abs() * tol.rtol + tol.atol).logical_or(got.isnan());
  if (!bad.any().item<bool>()) return {};
  const int64_t flat = bad.flatten().nonzero()[0][0].item<int64_t>();
  const int64_t row = flat / (l.heads * l.head_dim), head = flat / l.head_dim % l.heads;
  int64_t seq = 0;
  while (meta.host_query_start[seq + 1] <= row) ++seq;
  return fmt::format(
      "{} of {} values off (max err {:.3g}, tolerance {} + {}*|ref|); first at row {} (sequence {}: "
      "context {}, q_len {}), head {}: got {:.5g}, expected {:.5g}",
      bad.sum().item<int64_t>(), bad.numel(), err.nan_to_num(INFINITY).max().item<double>(), tol.atol, tol.rtol, row,
      seq, l.context_lens[seq], l.query_lens[seq], head, got.flatten()[flat].item<double>(),
      expected.flatten()[flat].item<double>());
}

std::vector<int64_t> ones(size_t n) { return std::vector<int64_t>(n, 1); }

std::string check_paged_attention_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  if (kernels::cuda_slots().paged_attention == nullptr) return "no paged-attention kernel in this build";
  const CountLaunches count_launches;
  const std::vector<int64_t> decode_lens = {1, 2, 15, 16, 17, 31, 32, 33, 64, 65, 100, 511, 512, 513, 1000, 2047, 8192};
  std::vector<Layout> layouts;
  for (int64_t d : {64, 128}) {
    // Decode at block-boundary lengths; 512 tokens per partition, so 513..8192 merge 2-16 partitions.
    layouts.push_back({"decode, GQA 32q/8kv, block 16", 32, 8, d, 16, decode_lens, ones(decode_lens.size())});
    // One long sequence: the split shrinks to fill the GPU (64 partitions of 128).
    layouts.push_back({"decode, one 8K context, GQA 32q/8kv, block 32", 32, 8, d, 32, {8192}, {1}});
    // Prefill chunks (whole prompts, chunks behind a cached prefix) beside decode rows.
    layouts.push_back({"mixed prefill + decode, GQA 32q/8kv, block 16", 32, 8, d, 16,
                       {17, 3, 40, 9, 64, 300, 1, 700}, {17, 1, 7, 1, 30, 100, 1, 129}});
    layouts.push_back({"prefill only, MHA 8q/8kv, block 32", 8, 8, d, 32, {33, 128, 77}, {33, 5, 2}});
    layouts.push_back({"mixed, 3 heads per KV head (12q/4kv), block 8", 12, 4, d, 8, {50, 1, 20, 600}, {50, 1, 4, 1}});
    // Sliding windows: partitions and blocks wholly before the window, a
    // window cut mid-block, chunks longer than the window, a window of 1.
    layouts.push_back({"decode, window 100, GQA 32q/8kv, block 16", 32, 8, d, 16, decode_lens,
                       ones(decode_lens.size()), 100});
    layouts.push_back({"decode, one 8K context, window 1000, block 32", 32, 8, d, 32, {8192}, {1}, 1000});
    layouts.push_back({"mixed prefill + decode, window 24, GQA 32q/8kv, block 16", 32, 8, d, 16,
                       {17, 3, 40, 9, 64, 300, 1, 700}, {17, 1, 7, 1, 30, 100, 1, 129}, 24});
    layouts.push_back({"mixed, window 1, block 8", 12, 4, d, 8, {50, 1, 20, 600}, {50, 1, 4, 1}, 1});
    // Soft-capped scores (Gemma 2): a cap of 2 bends most of the N(0, 1)
    // scores of random q and k, so a kernel that skips it fails.
    layouts.push_back({"decode, softcap 2, GQA 32q/8kv, block 16", 32, 8, d, 16, decode_lens,
                       ones(decode_lens.size()), 0, 2.0});
    layouts.push_back({"mixed prefill + decode, softcap 2, window 24, block 16", 32, 8, d, 16,
                       {17, 3, 40, 9, 64, 300, 1, 700}, {17, 1, 7, 1, 30, 100, 1, 129}, 24, 2.0});
  }
  // Gemma 2's head size with its cap and window.
  layouts.push_back({"mixed, softcap 2, window 40, GQA 8q/4kv, block 16", 8, 4, 256, 16, {17, 1, 600, 45},
                     {17, 1, 1, 20}, 40, 2.0});
  for (int64_t d : {32, 80, 96, 256}) {
    layouts.push_back({"mixed, GQA 8q/2kv, block 16", 8, 2, d, 16, {17, 1, 600, 45}, {17, 1, 1, 20}});
  }
  std::vector<std::string> failures;
  int cases = 0;
  uint64_t seed = 1;
  // bf16/fp16 prefill runs on tensor cores (head_dim <= 128) by default; each
  // 16-bit layout runs again with the CUDA-core prefill kernel.
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (bool cuda_cores : {false, true}) {
      if (cuda_cores && dtype == at::kFloat) continue;
      counting.cuda_core_prefill = cuda_cores;
      for (const Layout& l : layouts) {
        const bool prefill = std::any_of(l.query_lens.begin(), l.query_lens.end(), [](int64_t n) { return n > 1; });
        if (cuda_cores && !prefill) continue;
        ++cases;
        std::string error;
        try {
          error = check_layout(l, dtype, seed++);
        } catch (const std::exception& e) {
          error = e.what();
        }
        if (!error.empty()) {
          const bool tensor_cores = dtype != at::kFloat && !cuda_cores && l.head_dim <= 128;
          failures.push_back(fmt::format("[{} head_dim {} {}, prefill on {}] {}", l.name, l.head_dim, dtype_name(dtype),
                                         tensor_cores ? "tensor cores" : "CUDA cores", error));
        }
      }
    }
  }
  if (failures.empty()) return {};
  std::string report = fmt::format("{} of {} cases failed:", failures.size(), cases);
  for (size_t i = 0; i < failures.size() && i < 24; ++i) report += "\n      " + failures[i];
  return report;
}

// The cache write alone: strided K/V, skipped slots, every dtype, 16-byte and
// element-wise copies (head_dim 36 rows are not 16-byte multiples in bf16).
std::string check_reshape_and_cache_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  if (kernels::cuda_slots().reshape_and_cache == nullptr) return "no KV-cache write kernel in this build";
  const CountLaunches count_launches;
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (int64_t head_dim : {64, 36}) {
      const int64_t kv_heads = 4, block_size = 16, num_blocks = 9, tokens = 70;
      const auto on_gpu = at::TensorOptions().dtype(dtype).device(at::kCUDA);
      at::Tensor kv = at::randn({tokens, 2, kv_heads, head_dim}, on_gpu);
      std::vector<int64_t> slots(static_cast<size_t>(num_blocks * block_size));
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), std::mt19937(static_cast<unsigned>(head_dim)));
      slots.resize(static_cast<size_t>(tokens));
      for (size_t i = 0; i < slots.size(); i += 7) slots[i] = -1;
      const at::Tensor slot_mapping = at::tensor(slots, at::kLong);
      at::Tensor key_cache = at::full({num_blocks, kv_heads, block_size, head_dim}, NAN, on_gpu);
      at::Tensor value_cache = at::full_like(key_cache, NAN);
      at::Tensor key_cpu = key_cache.cpu(), value_cpu = value_cache.cpu();
      const int64_t before = counting.cache_writes.load();
      write_kv_cache(kv.select(1, 0), kv.select(1, 1), key_cache, value_cache, slot_mapping.to(at::kCUDA));
      if (counting.cache_writes.load() == before)
        return fmt::format("{} head_dim {}: fell back to the reference", dtype_name(dtype), head_dim);
      const at::Tensor kv_cpu = kv.cpu();
      write_kv_cache(kv_cpu.select(1, 0), kv_cpu.select(1, 1), key_cpu, value_cpu, slot_mapping);
      if (!same_bits(key_cache.cpu(), key_cpu) || !same_bits(value_cache.cpu(), value_cpu)) {
        return fmt::format("{} head_dim {}: caches differ from the CPU write", dtype_name(dtype), head_dim);
      }
    }
  }
  return {};
}

// RoPE + cache write + attention from one packed q/k/v projection
// (paged_attention_packed) against the unfused path in float64 on the CPU:
// RoPE with the same cos/sin rows, write_kv_cache, paged_attention_reference.
// One sequence of 37 tokens over shuffled blocks (GQA 8/2, head_dim 64); then
// slots of -1 must leave the caches as they were.
std::string check_rope_qkv_cache_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  if (kernels::cuda_slots().rope_qkv_cache == nullptr) return "no RoPE + cache-write kernel in this build";
  const int64_t heads = 8, kv_heads = 2, head_dim = 64, block_size = 16, tokens = 37, num_blocks = 6;
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    const auto on_gpu = at::TensorOptions().dtype(dtype).device(at::kCUDA);
    at::manual_seed(7);
    // A wider row than the projection (row stride > width), as a strided view.
    const at::Tensor qkv = at::randn({tokens, (heads + 2 * kv_heads) * head_dim + 8}, on_gpu)
                               .narrow(1, 0, (heads + 2 * kv_heads) * head_dim);
    const at::Tensor angle = at::rand({tokens, head_dim / 2}, at::kDouble) * 6.0;
    const at::Tensor cos64 = at::cat({angle.cos(), angle.cos()}, 1), sin64 = at::cat({angle.sin(), angle.sin()}, 1);
    const at::Tensor signed64 = at::cat({-sin64.narrow(1, 0, head_dim / 2), sin64.narrow(1, head_dim / 2, head_dim / 2)}, 1);
    const at::Tensor cos = cos64.to(on_gpu), signed_sin = signed64.to(on_gpu);
    std::vector<int32_t> table = {4, 1, 5};
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < tokens; ++p) slots.push_back(table[p / block_size] * block_size + p % block_size);
    AttentionMetadata meta;
    meta.host_block_tables = {table};
    meta.host_query_start = {0, static_cast<int32_t>(tokens)};
    meta.host_context_lens = {static_cast<int32_t>(tokens)};
    upload_metadata(meta, slots, at::Device(at::kCUDA, 0));
    at::Tensor key_cache = at::full({num_blocks, kv_heads, block_size, head_dim}, NAN, on_gpu);
    at::Tensor value_cache = at::full_like(key_cache, NAN);
    const models::AttentionSpec spec{.scale = 1.0 / std::sqrt(static_cast<double>(head_dim))};
    const auto out = paged_attention_packed(qkv, heads, cos, signed_sin, key_cache, value_cache, meta, spec);
    if (!out) return fmt::format("{}: the kernel refused its arguments", dtype_name(dtype));

    // The reference from the same rounded inputs (cos and sin rounded as the kernel reads them).
    const at::Tensor x = qkv.cpu().to(at::kDouble), c = cos.cpu().to(at::kDouble), ss = signed_sin.cpu().to(at::kDouble);
    const auto rotate = [&](const at::Tensor& h) {  // (T, H, D)
      return h * c.unsqueeze(1) + at::roll(h, {head_dim / 2}, {-1}) * ss.unsqueeze(1);
    };
    const at::Tensor q = rotate(x.narrow(1, 0, heads * head_dim).view({tokens, heads, head_dim}));
    const at::Tensor k = rotate(x.narrow(1, heads * head_dim, kv_heads * head_dim).view({tokens, kv_heads, head_dim}));
    const at::Tensor v = x.narrow(1, (heads + kv_heads) * head_dim, kv_heads * head_dim).reshape({tokens, kv_heads, head_dim});
    // NaN where nothing is written, as in the poisoned device caches.
    at::Tensor key64 = at::full({num_blocks, kv_heads, block_size, head_dim}, NAN, at::kDouble);
    at::Tensor value64 = at::full_like(key64, NAN);
    write_kv_cache(k, v, key64, value64, at::tensor(slots, at::kLong));
    const at::Tensor expected = paged_attention_reference(q, key64, value64, meta, spec);
    const Tolerance tol = tolerance_for(dtype);
    const auto off = [&](const at::Tensor& got, const at::Tensor& ref) {
      const at::Tensor g = got.cpu().to(at::kDouble);
      // Off: beyond the tolerance, or NaN on one side only (unwritten slots are NaN on both).
      return (g - ref).abs().gt(ref.abs() * tol.rtol + tol.atol).logical_or(g.isnan().ne(ref.isnan())).sum().item<int64_t>();
    };
    const at::Tensor blocks = at::tensor(std::vector<int64_t>(table.begin(), table.end()), at::kLong);
    if (const int64_t bad = off(key_cache.cpu().index_select(0, blocks), key64.index_select(0, blocks)); bad > 0) {
      return fmt::format("{}: {} rotated K values in the cache off", dtype_name(dtype), bad);
    }
    if (const int64_t bad = off(value_cache.cpu().index_select(0, blocks), value64.index_select(0, blocks)); bad > 0) {
      return fmt::format("{}: {} V values in the cache off", dtype_name(dtype), bad);
    }
    if (const int64_t bad = off(*out, expected); bad > 0) {
      return fmt::format("{}: {} of {} attention outputs off (tolerance {} + {}*|ref|)", dtype_name(dtype), bad,
                         expected.numel(), tol.atol, tol.rtol);
    }

    // Slots of -1: q is still rotated, the caches stay as they were.
    const at::Tensor before_k = key_cache.clone(), before_v = value_cache.clone();
    const at::Tensor skip = at::full({tokens}, -1, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
    at::Tensor q_out = at::full({tokens, heads, head_dim}, NAN, on_gpu);
    kernels::RopeQkvCacheArgs args;
    args.qkv = qkv.data_ptr();
    args.qkv_token_stride = qkv.stride(0);
    args.cos = cos.data_ptr();
    args.signed_sin = signed_sin.data_ptr();
    args.q_out = q_out.data_ptr();
    args.key_cache = key_cache.data_ptr();
    args.value_cache = value_cache.data_ptr();
    args.slot_mapping = skip.data_ptr<int64_t>();
    args.num_tokens = tokens;
    args.q_heads = heads;
    args.kv_heads = kv_heads;
    args.head_dim = head_dim;
    args.block_size = block_size;
    args.dtype = dtype == at::kFloat ? kernels::AttentionDtype::kFloat32 : kernels::AttentionDtype::kBFloat16;
    if (!kernels::cuda_slots().rope_qkv_cache(args, 0)) return "the kernel refused slots of -1";
    if (!same_bits(key_cache, before_k) || !same_bits(value_cache, before_v)) {
      return fmt::format("{}: slots of -1 wrote into the caches", dtype_name(dtype));
    }
    if (const int64_t bad = off(q_out, q); bad > 0) return fmt::format("{}: {} rotated q values off", dtype_name(dtype), bad);
  }
  return {};
}

[[maybe_unused]] const bool registered = [] {
  kernels::register_kernel({"rope_qkv_cache", "cuda", check_rope_qkv_cache_cuda});
  kernels::register_kernel({"reshape_and_cache", "cuda", check_reshape_and_cache_cuda});
  kernels::register_kernel({"paged_attention", "cuda", check_paged_attention_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::inference
