// Internal to colossus/kernels: a multi-tensor CPU step's elements split over
// threads by count, the tensors taken as one concatenation (the fused Adam
// kernels, adam.cpp and adam_mixed_simd.cpp). Each pointer table entry has a
// `numel`.
#pragma once
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace colossus::kernels::detail {

// Below this many elements a second thread costs more than it saves
// (thread start is ~20-50 us; a core does ~1M elements per ms).
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

// The whole concatenation over `num_threads` threads (0: every core; fewer
// when the work is small), this thread taking the first share.
template <typename Ptrs, typename Range>
void split_over_threads(const Ptrs* tensors, int64_t count, int num_threads, const Range& range) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += tensors[i].numel;
  int64_t threads = num_threads > 0 ? num_threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::max<int64_t>(1, std::min(threads, total / kMinElementsPerThread));
  int64_t per_thread = (total + threads - 1) / threads;
  per_thread = (per_thread + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  std::vector<std::thread> workers;
  for (int64_t k = 1; k < threads; ++k) {
    const int64_t begin = std::min(total, k * per_thread), end = std::min(total, (k + 1) * per_thread);
    if (begin < end) workers.emplace_back([=, &range] { for_flat_range(tensors, count, begin, end, range); });
  }
  for_flat_range(tensors, count, 0, std::min(total, per_thread), range);
  for (auto& w : workers) w.join();
}

}  // namespace colossus::kernels::detail
