// Shared by the Booster tests: tiny models, the data of each step, a training
// run through the Booster (DDP over the MPI world) and its single-process
// reference on the full global batch, and a scratch directory all ranks share.
#pragma once
#include "colossus/booster/booster.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/models/config.h"

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace colossus::booster::testing {

// 8 rows divide over 1, 2 and 4 ranks, also with 2 micro-batches each.
constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kSeqLen = 16;
constexpr int64_t kSteps = 20;

models::ModelConfig tiny_gpt2();
models::ModelConfig tiny_llama();  // GQA: 4 query heads, 2 key/value heads
// A LLaMA-architecture family's preset ("qwen2-tiny", "qwen3-tiny") at tiny_llama's size.
models::ModelConfig tiny_family(const char* preset);
// Phi-3 at that size (head_dim 8: four longrope frequencies) with 8 original
// positions, so kSeqLen-token rows take long_factor; its checkpoints hold the
// fused qkv_proj / gate_up_proj.
models::ModelConfig tiny_phi3();

// The global batch of `step`: (kGlobalBatch, kSeqLen) int64, the same on every rank.
at::Tensor global_batch(const models::ModelConfig& config, int64_t step);

// Loss of every step of one process on the full global batch: plain model,
// AdamW, warmup + cosine schedule, no Booster (optionally plain clipping).
std::vector<double> reference_losses(const models::ModelConfig& config, int64_t steps, double max_norm = 0.0);
// Packed rows (models/token_layout.h): every row holds documents of 5 and 7
// tokens, then 4 tokens of padding; the labels of `ids` leave out the second
// document's first token and the padding. Every row has the same number of
// targets, so the mean of per-rank means is the global mean.
models::TokenLayout packed_layout(int64_t rows);
at::Tensor packed_labels(const at::Tensor& ids);
// reference_losses on packed rows.
std::vector<double> reference_losses_packed(const models::ModelConfig& config, int64_t steps);
// The same run in bf16 with fp32 masters (amp::MixedPrecisionOptimizer, the
// masters starting at the fp32 init): what a parallel bf16 run should track.
std::vector<double> reference_losses_bf16(const models::ModelConfig& config, int64_t steps);

// A run through the Booster with DDP over the world: model seed 7, AdamW and
// the same schedule as the reference.
class BoostedRun {
 public:
  BoostedRun(const models::ModelConfig& config, BoosterOptions options, int micro_batches = 1);
  // One optimizer step on `step`'s global batch (this rank's rows, in
  // micro-batches under no_sync); returns the global mean loss over ranks.
  double train_step(int64_t step);
  std::vector<double> train(int64_t first_step, int64_t end_step);

  Booster& booster() { return *booster_; }
  Boosted& boosted() { return boosted_; }

 private:
  models::ModelConfig config_;
  int micro_batches_;
  std::unique_ptr<Booster> booster_;
  Boosted boosted_;
};

// A fresh directory under the system temp dir, the same path on every rank
// (rank 0 picks it); removed by rank 0 when the object dies.
class SharedScratch {
 public:
  explicit SharedScratch(const std::string& tag);
  ~SharedScratch();
  SharedScratch(const SharedScratch&) = delete;
  SharedScratch& operator=(const SharedScratch&) = delete;
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

void barrier();

}  // namespace colossus::booster::testing
