// Internal to colossus/kernels: a multi-tensor CPU step's elements split over
// threads by count, the tensors taken as one concatenation (the fused Adam
// kernels, adam.cpp and adam_mixed_simd.cpp, and grad_accumulate.cpp), run
// on the persistent CPU pool. Each pointer table entry has a `numel`.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>

#include "colossus/kernels/cpu/thread_pool.h"

namespace colossus::kernels::detail {

// Below this many elements a second share costs more than it saves (handing
// one to a pool thread and waiting for it is a few us; a core does ~1M
// elements per ms).
inline constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;
// Split points are multiples of this, so threads never share a cache line.
inline constexpr int64_t kSplitAlign = 1024;

// range(tensor, lo, hi) for the parts of elements [begin, end) of the
// concatenation that each tensor holds.
template <typename Ptrs, typename Range>
void for_flat_range(const Ptrs* tensors, int64_t count, int64_t begin, int64_t end, const Range& range) {
  int64_t offset = 0;
  for (int64_t i = 0; i < count && offset < end; ++i) {
    const int64_t n = tensors[i].numel;
    const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + n);
    if (lo < hi) range(tensors[i], lo - offset, hi - offset);
    offset += n;
  }
}

// The whole concatenation over `num_threads` shares (0: every core; fewer
// when the work is small), this thread taking the first and the persistent
// pool (thread_pool.h) the others. The split depends only on the share
// count, so results are those of one thread per share, whichever runs it.
template <typename Ptrs, typename Range>
void split_over_threads(const Ptrs* tensors, int64_t count, int num_threads, const Range& range) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += tensors[i].numel;
  int64_t threads = num_threads > 0 ? num_threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::max<int64_t>(1, std::min(threads, total / kMinElementsPerThread));
  int64_t per_thread = (total + threads - 1) / threads;
  per_thread = (per_thread + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  struct Split {
    const Ptrs* tensors;
    int64_t count, total, per_thread;
    const Range* range;
  };
  const Split split{tensors, count, total, per_thread, &range};
  run_on_cpu_pool(
      threads,
      [](const void* context, int64_t k) {
        const auto& s = *static_cast<const Split*>(context);
        const int64_t begin = std::min(s.total, k * s.per_thread), end = std::min(s.total, (k + 1) * s.per_thread);
        if (begin < end) for_flat_range(s.tensors, s.count, begin, end, *s.range);
      },
      &split);
}

}  // namespace colossus::kernels::detail
