#include "colossus/parallel/pipeline/stage_manager.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <numeric>

namespace colossus::parallel::pipeline {

std::vector<BlockRange> balance_blocks(const std::vector<int64_t>& block_weights, int num_stages, int64_t first_extra,
                                       int64_t last_extra) {
  const auto n = static_cast<int64_t>(block_weights.size());
  if (num_stages < 1) throw ConfigError(fmt::format("pipeline: {} stages; need at least 1", num_stages));
  if (n < num_stages) {
    throw ConfigError(
        fmt::format("pipeline: the model has {} blocks but pp_size x num_model_chunks = {} "
                    "stages need at least one each; use a "
                    "model with >= {} layers or fewer stages (e.g. {})",
                    n, num_stages, num_stages, std::max<int64_t>(1, n)));
  }
  std::vector<int64_t> prefix(static_cast<size_t>(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + block_weights[i];
  auto weight = [&](int stage, int64_t begin, int64_t end) {
    int64_t w = prefix[end] - prefix[begin];
    if (stage == 0) w += first_extra;
    if (stage == num_stages - 1) w += last_extra;
    return w;
  };
  // best[s][e]: the least possible heaviest stage when stages [0, s) cover
  // blocks [0, e).
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  const auto S = static_cast<size_t>(num_stages);
  std::vector<std::vector<int64_t>> best(S + 1, std::vector<int64_t>(static_cast<size_t>(n) + 1, kInf));
  std::vector<std::vector<int64_t>> cut(S + 1, std::vector<int64_t>(static_cast<size_t>(n) + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= num_stages; ++s) {
    for (int64_t e = s; e <= n - (num_stages - s); ++e) {
      for (int64_t b = s - 1; b < e; ++b) {
        if (best[s - 1][b] == kInf) continue;
        const int64_t load = std::max(best[s - 1][b], weight(s - 1, b, e));
        // Ties go to the later cut: earlier stages (which also hold more
        // in-flight activations under 1F1B) get no more blocks than needed.
        if (load <= best[s][e]) {
          best[s][e] = load;
          cut[s][e] = b;
        }
      }
    }
  }
  std::vector<BlockRange> ranges(S);
  int64_t end = n;
  for (int s = num_stages; s >= 1; --s) {
    const int64_t begin = cut[s][end];
    ranges[static_cast<size_t>(s - 1)] = {begin, end};
    end = begin;
  }
  return ranges;
}

std::vector<BlockRange> ranges_from_counts(const std::vector<int64_t>& layers_per_stage, int64_t num_blocks) {
  const int64_t total = std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), int64_t{0});
  const bool positive = std::all_of(layers_per_stage.begin(), layers_per_stage.end(), [](int64_t c) { return c >= 1; });
  if (total != num_blocks || !positive) {
    throw ConfigError(
        fmt::format("pipeline: num_layers_per_stage = [{}] must be positive "
                    "and sum to the model's {} blocks (it sums to {}); "
                    "e.g. leave it empty to balance by parameter count",
                    fmt::join(layers_per_stage, ", "), num_blocks, total));
  }
  std::vector<BlockRange> ranges;
  int64_t begin = 0;
  for (int64_t count : layers_per_stage) {
    ranges.push_back({begin, begin + count});
    begin += count;
  }
  return ranges;
}

StageManager::StageManager(int pp_size, int pp_rank, int num_model_chunks, std::vector<BlockRange> ranges)
    : pp_size_(pp_size), pp_rank_(pp_rank), num_model_chunks_(num_model_chunks), ranges_(std::move(ranges)) {
  if (pp_size < 1 || num_model_chunks < 1 || pp_rank < 0 || pp_rank >= pp_size) {
    throw ConfigError(
        fmt::format("pipeline: pp_size = {}, pp_rank = {}, "
                    "num_model_chunks = {} are inconsistent",
                    pp_size, pp_rank, num_model_chunks));
  }
  if (ranges_.size() != static_cast<size_t>(num_virtual_stages())) {
    throw ConfigError(
        fmt::format("pipeline: {} block ranges for pp_size {} x "
                    "num_model_chunks {} = {} stages",
                    ranges_.size(), pp_size, num_model_chunks, num_virtual_stages()));
  }
}

bool StageManager::owns_block(int64_t index) const {
  for (int c = 0; c < num_model_chunks_; ++c) {
    const auto& r = blocks(c);
    if (index >= r.begin && index < r.end) return true;
  }
  return false;
}

}  // namespace colossus::parallel::pipeline
