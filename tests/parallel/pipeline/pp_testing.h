// Shared by the pipeline tests: the booster tests' tiny models made 8 blocks
// deep, their single-process reference curves (cached per model), a run
// through HybridParallelPlugin + booster.execute_pipeline on this rank's dp
// rows, and the 1e-5 curve comparison every pipeline layout must pass.
#pragma once
#include "colossus/booster/booster.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/models/config.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace colossus::booster::testing {

// 8 blocks, so pp 4 x 2 chunks has a block per virtual stage.
models::ModelConfig deep(models::ModelConfig config);

// reference_losses(config, kSteps, max_norm), computed once per (model, max_norm).
const std::vector<double>& reference(const models::ModelConfig& config, double max_norm = 0.0);

// One process, `steps` steps as reference_losses: the trained model.
std::shared_ptr<models::CausalLM> trained_single_process(const models::ModelConfig& config, int64_t steps);

// The plain model's loss on ids (B, T), without gradients.
double loss_on(models::CausalLM& model, const at::Tensor& ids);

class PpRun {
 public:
  // Model seed 7, AdamW (lr 3e-3, weight decay 0.01), warmup 4 + cosine over
  // kSteps: the reference's training, boosted with `options` over the world.
  // lazy: the model is built on the meta device and each rank reads its
  // stage's tp slices from the same seeded init (Booster param_source).
  PpRun(const models::ModelConfig& config, HybridParallelPluginOptions options, bool lazy = false);

  // This dp rank's rows of a global (B, T) batch.
  at::Tensor rows(const at::Tensor& batch) const;
  // One step on global_batch(step): returns the loss averaged over dp.
  double train_step(int64_t step);
  std::vector<double> train(int64_t first, int64_t end);
  // The pipeline's loss on a global batch without gradients (forward-only
  // schedule), averaged over dp; gradients are left as they were.
  double eval_loss(const at::Tensor& global);

  HybridParallelPlugin& plugin() { return *plugin_; }
  Booster& booster() { return *booster_; }
  Boosted& boosted() { return boosted_; }
  HybridParallelModel& model() { return dynamic_cast<HybridParallelModel&>(*boosted_.model); }

 private:
  double mean_over_dp(double loss) const;

  models::ModelConfig config_;
  std::shared_ptr<HybridParallelPlugin> plugin_;
  std::unique_ptr<Booster> booster_;
  Boosted boosted_;
};

double worst_rel_diff(const std::vector<double>& got, const std::vector<double>& ref);
// got within 1e-5 (relative) of ref at every step; rank 0 prints the worst.
void expect_curve(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what);
// Both models (GPT-2 and LLaMA, 8 blocks) under one layout against one process.
void expect_layout_matches(HybridParallelPluginOptions options, const std::string& what, double max_norm = 0.0);

bool four_ranks();

}  // namespace colossus::booster::testing
