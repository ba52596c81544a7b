// The flat layout ZeRO-1/2 shards: parameters are packed (reverse
// registration order, roughly the order backward produces their gradients)
// into buckets of one dtype, each padded to a multiple of the dp size. A
// bucket is the unit of everything: its flat buffer is split into dp equal
// contiguous chunks (dp rank r owns chunk r), its gradients are reduce-
// scattered as one collective and its parameters all-gathered as one.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace colossus::zero {

using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

// Where one parameter lies in its bucket and which part of it this rank owns.
struct ParamSlot {
  bool managed = false;  // false: the parameter needs no grad and is not sharded
  size_t bucket = 0;
  int64_t offset = 0;  // element offset of the parameter in the bucket's flat buffer
  int64_t numel = 0;
  // This rank's part: elements [own_begin, own_begin + own_numel) of the
  // flattened parameter, at element `own_offset` of the rank's chunk. Empty
  // (own_numel 0) when the parameter lies wholly in other ranks' chunks.
  int64_t own_begin = 0;
  int64_t own_numel = 0;
  int64_t own_offset = 0;
};

struct BucketLayout {
  c10::ScalarType dtype;
  std::vector<size_t> params;  // indices into the named params, in packing order
  int64_t numel = 0;           // padded: a multiple of the dp size
  int64_t shard_numel = 0;     // numel / dp: each rank's chunk
};

struct Layout {
  std::vector<BucketLayout> buckets;
  std::vector<ParamSlot> slots;  // by parameter index
};

// Packs `params` (those that require grad) into buckets of at most
// `bucket_numel` elements (a larger parameter gets a bucket of its own); a
// bucket holds one dtype. `dp_rank` picks the owned parts in `slots`.
Layout plan_layout(const NamedParams& params, int64_t bucket_numel, int dp_size, int dp_rank);

// The part of `param_flat` ((numel) elements of one parameter, any dtype) this
// rank owns: a view of own_numel elements.
inline at::Tensor owned_part(const at::Tensor& param_flat, const ParamSlot& slot) {
  return param_flat.narrow(0, slot.own_begin, slot.own_numel);
}

}  // namespace colossus::zero
