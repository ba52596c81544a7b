// Bucket planning for ZeRO-1/2 (see bucket_store.h).
#include "colossus/zero/low_level/bucket_store.h"

#include <algorithm>

namespace colossus::zero {

Layout plan_layout(const NamedParams& params, int64_t bucket_numel, int dp_size, int dp_rank) {
  Layout layout;
  layout.slots.resize(params.size());
  int64_t filled = 0;  // unpadded elements in the last bucket
  for (size_t k = params.size(); k-- > 0;) {
    const at::Tensor& p = params[k].second;
    if (!p.requires_grad()) continue;
    const bool fits =
        !layout.buckets.empty() && layout.buckets.back().dtype == p.scalar_type() && filled + p.numel() <= bucket_numel;
    if (!fits) {
      layout.buckets.push_back(BucketLayout{.dtype = p.scalar_type()});
      filled = 0;
    }
    auto& bucket = layout.buckets.back();
    layout.slots[k] =
        ParamSlot{.managed = true, .bucket = layout.buckets.size() - 1, .offset = filled, .numel = p.numel()};
    bucket.params.push_back(k);
    filled += p.numel();
    bucket.numel = filled;
  }
  for (auto& bucket : layout.buckets) {
    bucket.numel = (bucket.numel + dp_size - 1) / dp_size * dp_size;
    bucket.shard_numel = bucket.numel / dp_size;
  }
  for (auto& slot : layout.slots) {
    if (!slot.managed) continue;
    const int64_t chunk = layout.buckets[slot.bucket].shard_numel;
    const int64_t chunk_begin = chunk * dp_rank, chunk_end = chunk_begin + chunk;
    const int64_t begin = std::max(slot.offset, chunk_begin), end = std::min(slot.offset + slot.numel, chunk_end);
    if (begin < end) {
      slot.own_begin = begin - slot.offset;
      slot.own_numel = end - begin;
      slot.own_offset = begin - chunk_begin;
    }
  }
  return layout;
}

}  // namespace colossus::zero
