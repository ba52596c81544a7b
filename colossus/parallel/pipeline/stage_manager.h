// The pipeline stage manager: which contiguous range of a model's blocks each
// (virtual) stage runs, and where each virtual stage lives. With
// num_model_chunks = C there are V = pp x C virtual stages; virtual stage v
// runs on pp rank v % pp as its chunk v / pp (Megatron's interleaved
// placement; C = 1 is the plain pipeline). The first virtual stage also runs
// the embedding, the last the final norm, head and loss.
#pragma once
#include <cstdint>
#include <vector>

namespace colossus::parallel::pipeline {

struct BlockRange {
  int64_t begin = 0;  // first block index
  int64_t end = 0;    // one past the last
  int64_t size() const { return end - begin; }
};

// Splits `block_weights.size()` blocks into `num_stages` contiguous non-empty
// ranges minimising the heaviest stage's weight, where a stage's weight is the
// sum of its blocks' plus `first_extra` for stage 0 and `last_extra` for the
// last stage (embedding / norm + head parameters). Weights are parameter
// counts. Throws ConfigError when there are fewer blocks than stages.
std::vector<BlockRange> balance_blocks(const std::vector<int64_t>& block_weights, int num_stages,
                                       int64_t first_extra = 0, int64_t last_extra = 0);

// Ranges from explicit per-stage layer counts (num_layers_per_stage); throws
// ConfigError naming the numbers unless there is one positive count per
// virtual stage and they sum to the block count.
std::vector<BlockRange> ranges_from_counts(const std::vector<int64_t>& layers_per_stage, int64_t num_blocks);

class StageManager {
 public:
  // ranges: one per virtual stage (pp_size * num_model_chunks of them).
  StageManager(int pp_size, int pp_rank, int num_model_chunks, std::vector<BlockRange> ranges);

  int pp_size() const { return pp_size_; }
  int pp_rank() const { return pp_rank_; }
  int num_model_chunks() const { return num_model_chunks_; }
  int num_virtual_stages() const { return pp_size_ * num_model_chunks_; }

  // Virtual stage of this rank's chunk c, and back.
  int virtual_stage(int chunk) const { return chunk * pp_size_ + pp_rank_; }
  int rank_of(int virtual_stage) const { return virtual_stage % pp_size_; }
  bool is_first(int chunk) const { return virtual_stage(chunk) == 0; }
  bool is_last(int chunk) const { return virtual_stage(chunk) == num_virtual_stages() - 1; }
  // This rank runs the embedding / the head (some chunk of it is first / last).
  bool holds_first_stage() const { return pp_rank_ == 0; }
  bool holds_last_stage() const { return rank_of(num_virtual_stages() - 1) == pp_rank_; }

  const BlockRange& blocks(int chunk) const { return ranges_.at(static_cast<size_t>(virtual_stage(chunk))); }
  const std::vector<BlockRange>& all_ranges() const { return ranges_; }
  // Whether block `index` runs on this rank (in any chunk).
  bool owns_block(int64_t index) const;

 private:
  int pp_size_;
  int pp_rank_;
  int num_model_chunks_;
  std::vector<BlockRange> ranges_;
};

}  // namespace colossus::parallel::pipeline
