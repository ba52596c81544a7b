// Pipeline parallelism inside HybridParallelPlugin: this pp rank's stages of
// the (already tp-sharded) model, the parameters of other stages freed, and
// execute(): one training step's forward and backward over microbatches in
// the chosen schedule, then the cross-stage and data-parallel gradient sync
// (tied embedding grads summed between the first and last stage; grads
// averaged over dp). The optimizer steps afterwards, as with forward/backward.
#pragma once
#include "colossus/booster/pipeline_batch.h"
#include "colossus/cluster/process_group.h"
#include "colossus/models/causal_lm.h"
#include "colossus/optim/optimizer.h"
#include "colossus/parallel/pipeline/runtime.h"
#include "colossus/parallel/pipeline/schedule.h"
#include "colossus/parallel/pipeline/stage_manager.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace colossus::zero {
class LowLevelZeroOptimizer;
}

namespace colossus::booster {

struct HybridParallelPluginOptions;

// The pipeline checks of HybridParallelPluginOptions::validate(): pp_size,
// pp_style, num_model_chunks, microbatching; each ConfigError names the
// numbers and a valid alternative.
void validate_pipeline_options(const HybridParallelPluginOptions& options);

struct HybridPipelineOptions {
  parallel::pipeline::ScheduleKind schedule = parallel::pipeline::ScheduleKind::OneFOneB;
  int num_model_chunks = 1;
  int64_t num_microbatches = 0;  // > 0: this many per step; else microbatch_size decides
  int64_t microbatch_size = 0;
  bool overlap_p2p = true;
  std::vector<int64_t> num_layers_per_stage;  // empty: balanced by parameter count
};

HybridPipelineOptions pipeline_options_of(const HybridParallelPluginOptions& options);

// Averages `grads` (each rank's list in the same order) over `group` in place,
// in flat buckets of one dtype: the pipeline's gradient sync after a schedule.
void average_gradients(const std::vector<at::Tensor>& grads, cluster::ProcessGroup& group);

// Where a parameter lives: the pp rank that holds it (the first stage's for a
// tied embedding, which the last stage holds too) and its local (tp) shape.
struct ParamPlacement {
  int pp_rank = 0;
  std::vector<int64_t> local_shape;
};

class HybridPipeline {
 public:
  // Collective-free. `model` holds every parameter (tp-sharded); those of
  // other stages become empty tensors here (their placements keep the shapes).
  HybridPipeline(models::CausalLM& model, cluster::ProcessGroupPtr pp_group, cluster::ProcessGroupPtr grad_group,
                 HybridPipelineOptions options);

  // How the wrapper runs the model's ends, so that sequence parallelism
  // (ring_attn / all_to_all) shards the tokens without the pipeline knowing.
  // A small fp32 vector (numel values) that each virtual stage extends after
  // its blocks and the last stage folds into the microbatch loss: what a loss
  // needs from every stage's layers (MoE router statistics). It travels in
  // the same p2p message as the hidden state (packed after it, in its dtype),
  // so autograd carries its gradient back to the stage that made it.
  struct PipelineCarry {
    int64_t numel = 0;  // 0: nothing carried
    // incoming (numel) fp32, undefined on the first stage; this stage ran
    // blocks [block_begin, block_end) -> outgoing (numel) fp32.
    std::function<at::Tensor(const at::Tensor& incoming, int64_t block_begin, int64_t block_end)> extend;
    // The last stage: the criterion's loss of one microbatch and the carried
    // vector, of num_microbatches -> that microbatch's loss.
    std::function<at::Tensor(const at::Tensor& loss, const at::Tensor& carried, int64_t num_microbatches)> finish;
  };
  struct StageHooks {
    // input_ids (B_mb, T) and the microbatch's rows of the batch layout ->
    // hidden (B_mb, T_local, C) on the first stage.
    std::function<at::Tensor(const at::Tensor& input_ids, const models::TokenLayout& layout)> embed;
    // hidden (B_mb, T_local, C) and the layout -> what every block of any stage needs.
    std::function<models::BlockContext(const at::Tensor& hidden, const models::TokenLayout& layout)> context;
    // hidden (B_mb, T_local, C) after the final norm -> logits as the
    // wrapper's forward returns them.
    std::function<at::Tensor(const at::Tensor& hidden)> logits;
    // Optional (PipelineCarry): per-microbatch statistics carried from stage
    // to stage beside the hidden state.
    PipelineCarry carry;
  };
  // batch.input_ids: (B, T) -> the batch loss (mean over its counted tokens,
  // as one forward would give) and, on the last stage, the logits. Under a
  // NoGradGuard (evaluation, as Colossal-AI's schedules under torch.no_grad)
  // only forwards run, chunk by chunk, and gradients are left untouched.
  PipelineOutput execute(const PipelineBatch& batch, const StageHooks& hooks, const PipelineCriterion& criterion,
                         const std::function<at::Tensor(const at::Tensor&)>& scale_loss, bool return_loss,
                         bool return_outputs);

  const parallel::pipeline::StageManager& stages() const { return *stages_; }
  const std::map<std::string, ParamPlacement>& placements() const { return placements_; }
  // Whether this rank holds the parameter (its values are real here).
  bool holds(const std::string& name) const { return held_.contains(name); }
  // The embedding weight is used by the first and the last stage (tied head on
  // another rank).
  bool tied_across_stages() const { return !tied_name_.empty(); }
  const std::string& tied_name() const { return tied_name_; }
  // The last step's actions with their times (for Chrome traces and bubble
  // measurements).
  const std::vector<parallel::pipeline::TimedAction>& last_timeline() const { return last_timeline_; }
  int64_t microbatches_for(int64_t batch_rows) const;
  // ZeRO-1 over dp: gradients are reduce-scattered into its shards once after
  // each schedule (its hooks stay off: microbatch backwards interleave).
  void set_zero_optimizer(zero::LowLevelZeroOptimizer* zero) { zero_ = zero; }
  // split_gather / ring: these tp-replicated parameters see only this tp
  // rank's tokens, so after the dp average their gradients are summed over
  // tp_group (what the wrapper's partial reducer does without a pipeline).
  void set_partial_grads(std::vector<std::string> names, cluster::ProcessGroupPtr tp_group) {
    partial_names_ = std::move(names);
    partial_group_ = std::move(tp_group);
  }

 private:
  void sync_gradients();

  models::CausalLM& model_;
  cluster::ProcessGroupPtr pp_group_;
  cluster::ProcessGroupPtr grad_group_;
  HybridPipelineOptions options_;
  std::unique_ptr<parallel::pipeline::StageManager> stages_;
  std::unique_ptr<parallel::pipeline::PipelineRuntime> runtime_;
  std::map<std::string, ParamPlacement> placements_;
  std::map<std::string, at::Tensor> held_;             // this rank's parameters by name
  std::vector<std::vector<at::Tensor>> chunk_params_;  // per chunk: what its W pass differentiates
  std::string tied_name_;
  std::vector<parallel::pipeline::TimedAction> last_timeline_;
  zero::LowLevelZeroOptimizer* zero_ = nullptr;
  std::vector<std::string> partial_names_;
  cluster::ProcessGroupPtr partial_group_;
};

}  // namespace colossus::booster
