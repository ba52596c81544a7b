// Gemini's chunk layout: trainable parameters, in module order (the order the
// forward uses them), packed into equal-size chunks; the chunk size is
// searched as Colossal-AI's search_chunk_configuration does (the size in
// [start, start + search range] that wastes the fewest elements, start being
// the larger of min_chunk_numel and the largest parameter). Every chunk is a
// multiple of the dp size, so dp rank r owns elements [r, r+1) * numel / dp.
#pragma once
#include <cstdint>
#include <vector>

#include "colossus/zero/low_level/bucket_store.h"

namespace colossus::zero::gemini {

struct ChunkSearchOptions {
  int64_t min_chunk_numel = 32 << 20;     // smallest chunk considered (elements)
  int64_t search_range_numel = 32 << 20;  // sizes tried above the start (elements)
  int64_t search_interval = 1024;         // step between sizes tried (hidden_dim when given)
};

struct ChunkSearchResult {
  int64_t chunk_numel = 0;   // a multiple of dp
  int64_t wasted_numel = 0;  // padding at the ends of chunks, in all
};

// numels: the parameters in packing order (all > 0).
ChunkSearchResult search_chunk_size(const std::vector<int64_t>& numels, const ChunkSearchOptions& options, int dp);

// Packs the trainable parameters of `params` in order into chunks of
// `chunk_numel` elements (a parameter that does not fit in what is left of a
// chunk starts the next one; a chunk holds one dtype). Returns the layout in
// ZeRO's terms: a "bucket" is a chunk, `slots` say which part of each
// parameter dp rank `dp_rank` owns.
Layout plan_chunks(const NamedParams& params, int64_t chunk_numel, int dp_size, int dp_rank);

}  // namespace colossus::zero::gemini
