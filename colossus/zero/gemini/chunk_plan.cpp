// Chunk size search and packing (see chunk_plan.h).
#include "colossus/zero/gemini/chunk_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "colossus/core/errors.h"

namespace colossus::zero::gemini {

namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Elements of padding when `numels` are packed in order into chunks of
// `chunk_numel`.
int64_t wasted(const std::vector<int64_t>& numels, int64_t chunk_numel) {
  int64_t waste = 0, filled = 0;
  bool open = false;
  for (int64_t n : numels) {
    if (!open || filled + n > chunk_numel) {
      if (open) waste += chunk_numel - filled;
      filled = 0;
      open = true;
    }
    filled += n;
  }
  if (open) waste += chunk_numel - filled;
  return waste;
}

}  // namespace

ChunkSearchResult search_chunk_size(const std::vector<int64_t>& numels, const ChunkSearchOptions& options, int dp) {
  if (options.search_interval <= 0 || options.search_range_numel < 0 || options.min_chunk_numel < 0 || dp <= 0) {
    throw ConfigError(
        fmt::format("gemini: chunk search needs search_interval > 0, "
                    "search_range >= 0, min_chunk >= 0 (got {}, {}, {})",
                    options.search_interval, options.search_range_numel, options.min_chunk_numel));
  }
  int64_t largest = 1;
  for (int64_t n : numels) largest = std::max(largest, n);
  const int64_t start = round_up(std::max(options.min_chunk_numel, largest), dp);
  ChunkSearchResult best{.chunk_numel = start, .wasted_numel = std::numeric_limits<int64_t>::max()};
  for (int64_t size = start; size <= start + options.search_range_numel; size += options.search_interval) {
    const int64_t chunk = round_up(size, dp);
    const int64_t waste = wasted(numels, chunk);
    if (waste < best.wasted_numel) best = {.chunk_numel = chunk, .wasted_numel = waste};
  }
  return best;
}

Layout plan_chunks(const NamedParams& params, int64_t chunk_numel, int dp_size, int dp_rank) {
  if (chunk_numel <= 0 || chunk_numel % dp_size != 0) {
    throw ConfigError(
        fmt::format("gemini: chunk size {} must be a positive multiple of dp = {}", chunk_numel, dp_size));
  }
  Layout layout;
  layout.slots.resize(params.size());
  int64_t filled = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k].second;
    if (!p.requires_grad()) continue;
    if (p.numel() > chunk_numel) {
      throw ConfigError(
          fmt::format("gemini: parameter '{}' ({} elements) is "
                      "larger than the chunk size {}",
                      params[k].first, p.numel(), chunk_numel));
    }
    const bool fits =
        !layout.buckets.empty() && layout.buckets.back().dtype == p.scalar_type() && filled + p.numel() <= chunk_numel;
    if (!fits) {
      layout.buckets.push_back(BucketLayout{
          .dtype = p.scalar_type(), .params = {}, .numel = chunk_numel, .shard_numel = chunk_numel / dp_size});
      filled = 0;
    }
    layout.slots[k] =
        ParamSlot{.managed = true, .bucket = layout.buckets.size() - 1, .offset = filled, .numel = p.numel()};
    layout.buckets.back().params.push_back(k);
    filled += p.numel();
  }
  for (auto& slot : layout.slots) {
    if (!slot.managed) continue;
    const int64_t shard = layout.buckets[slot.bucket].shard_numel;
    const int64_t shard_begin = shard * dp_rank, shard_end = shard_begin + shard;
    const int64_t begin = std::max(slot.offset, shard_begin), end = std::min(slot.offset + slot.numel, shard_end);
    if (begin < end) {
      slot.own_begin = begin - slot.offset;
      slot.own_numel = end - begin;
      slot.own_offset = begin - shard_begin;
    }
  }
  return layout;
}

}  // namespace colossus::zero::gemini
