// HybridParallelPlugin (first half): tensor parallelism composed with data
// parallelism on one ProcessGroupMesh, as Colossal-AI's HybridParallelPlugin.
// The model is sharded by a plan (the model's own, or custom_policy), gradients
// are averaged over dp while backward runs (GradReducer), the loss is the
// vocab-parallel cross-entropy, and checkpoints are full Hugging Face
// directories (gathered over tp, padding trimmed). Sequence parallelism
// (ring_attn, all_to_all) shards each sequence over an sp axis of the mesh
// (dp, sp, tp); split_gather / ring shard the activations between
// tensor-parallel regions over the tp group itself (Megatron-style).
// Pipeline parallelism (pp_size > 1: 1f1b, interleaved, zero_bubble) splits
// the blocks over a pp axis and trains through booster.execute_pipeline
// (hybrid_parallel_pipeline.h; under a NoGradGuard it runs forwards only, for
// evaluation); every sequence-parallel mode composes with it (ring_attn /
// all_to_all on a mesh (dp, pp, sp, tp), split_gather / ring over tp).
// ZeRO-1 (zero_stage = 1) composes with all of these: the optimizer state and
// fp32 masters are sharded over dp (hybrid_parallel_zero.cpp); ZeRO-2 only
// without a pipeline (as Colossal-AI).
#pragma once
#include "colossus/amp/loss_scaler.h"
#include "colossus/booster/grad_reducer.h"
#include "colossus/booster/hybrid_parallel_pipeline.h"
#include "colossus/booster/plugin.h"
#include "colossus/booster/wrapped_model.h"
#include "colossus/cluster/mesh.h"
#include "colossus/parallel/plan/sharder.h"
#include "colossus/parallel/sequence/sp_model.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace colossus::booster {

struct HybridParallelPluginOptions {
  int tp_size = 1;
  // Pipeline parallelism over a pp axis of the mesh ((dp, pp, tp), or
  // (pp, tp, dp) without dp_outside): pp_style "1f1b", "interleaved"
  // (num_model_chunks >= 2 virtual stages per rank, Megatron order) or
  // "zero_bubble" (ZB-H1: backward split into input and weight gradients;
  // Colossal-AI's V-shaped "zbv" is refused for now). A step is
  // booster.execute_pipeline over num_microbatches microbatches (or
  // rows / microbatch_size). num_layers_per_stage: blocks per virtual stage
  // (empty: balanced by parameter count, embedding and head included);
  // overlap_p2p: each receive is posted one action ahead.
  int pp_size = 1;
  std::string pp_style = "1f1b";
  int num_model_chunks = 1;
  int64_t num_microbatches = 0;
  int64_t microbatch_size = 0;
  std::vector<int64_t> num_layers_per_stage;
  bool overlap_p2p = true;
  // Activation checkpointing (Colossal-AI's gradient_checkpoint_config
  // gradient_checkpointing_ratio): the first round(ratio x blocks) blocks
  // rerun their forward in backward. 0: off. Not with pp_style zero_bubble
  // (the rerun's backward would compute weight gradients in B and again in W).
  double gradient_checkpointing_ratio = 0.0;
  // "full" or "mlp" (models::CheckpointGranularity): what a checkpointed
  // block reruns.
  std::string gradient_checkpointing_granularity = "full";
  // Sequence parallelism: with enable_sequence_parallelism, mode "ring_attn"
  // (ring attention, zig-zag shards) or "all_to_all" (Ulysses; heads / tp
  // must divide by sp) over sp_size ranks of their own mesh axis. forward()
  // then returns this rank's sequence shard of the logits and loss() takes
  // the full labels. "split_gather" (Megatron SP: activations between tp
  // regions sharded along the sequence, all-gather before column-parallel,
  // reduce-scatter after row-parallel) and "ring" (the same with the
  // collectives chunked around the ring, overlapped with the matmuls) need
  // tp_size > 1 and use the tp group as the sp group (sp_size 1 or tp_size,
  // as Colossal-AI); forward() returns the full sequence as plain tp does.
  int sp_size = 1;
  bool enable_sequence_parallelism = false;
  std::string sequence_parallelism_mode;
  // ring_attn: two-level rings, inner rings of this many consecutive sp ranks
  // (a node) and an outer ring between them. 0 = one ring over all sp ranks.
  int inner_ring_size = 0;
  // 1: optimizer state and fp32 masters sharded over dp (any tp, pp, sp);
  // 2: gradients too, without a pipeline only.
  int zero_stage = 0;
  std::string precision = "fp32";            // fp32 | bf16 | fp16 (fp32 masters, loss scaling)
  double max_norm = 0.0;                     // > 0: clip to this global norm (counted once per element)
  double norm_type = 2.0;                    // 2 or infinity
  amp::LossScalerOptions loss_scaler = {};   // fp16
  // true: forward returns this rank's vocab slice of the logits and loss() is
  // the vocab-parallel cross-entropy; false: logits are gathered (true vocab).
  bool parallel_output = true;
  int64_t make_vocab_size_divisible_by = 64;                  // vocab padded to a multiple of this x tp
  bool dp_outside = true;                                     // mesh (dp, tp): tp ranks adjacent; false: (tp, dp)
  std::optional<parallel::plan::ShardingPlan> custom_policy;  // default: the model's plan
  double bucket_cap_mb = 25.0;                                // dp gradient buckets
  // Throws ConfigError naming the bad value and a valid alternative.
  void validate() const;
  // split_gather / ring: the sequence is sharded over the tp group (no sp axis).
  bool sequence_over_tp() const {
    return enable_sequence_parallelism &&
           (sequence_parallelism_mode == "split_gather" || sequence_parallelism_mode == "ring");
  }
  // The size of the mesh's sp axis: sp_size for ring_attn / all_to_all, else 1.
  int sp_axis_size() const { return sequence_over_tp() ? 1 : sp_size; }
};

// The wrapped model HybridParallelPlugin returns.
class HybridParallelModel : public ModelWrapper {
 public:
  // grad_group: the ranks gradients are averaged over (dp, or dp x sp);
  // sp_group: null, or the sequence-parallel group with its mode (and ring
  // attention's inner ring size). With split_gather / ring (sharded.sequence)
  // the parameters replicated over tp see only their rank's tokens: their
  // gradients are reduced over partial_grad_group (dp x tp), summed over tp.
  HybridParallelModel(std::shared_ptr<models::CausalLM> model, parallel::plan::ShardedModel sharded,
                      cluster::ProcessGroupPtr grad_group, bool parallel_output, double bucket_cap_mb,
                      cluster::ProcessGroupPtr sp_group = nullptr,
                      parallel::sequence::SequenceParallelMode sp_mode =
                          parallel::sequence::SequenceParallelMode::RingAttention,
                      int64_t inner_ring_size = 0, cluster::ProcessGroupPtr partial_grad_group = nullptr);
  // input_ids: (B, T) int64 -> logits (B, T, V_padded/tp) with parallel_output, else (B, T, V).
  // With ring_attn / all_to_all: (B, T_local, ...), this rank's shard (layout.h).
  // With split_gather / ring: the full (B, T, ...); T not divisible by tp is
  // padded inside (causal: real tokens never see the padding) and trimmed.
  at::Tensor forward(const at::Tensor& input_ids, const models::TokenLayout& layout = {}) override;
  // logits from forward, labels (B, T) -> scalar: vocab-parallel when the logits are.
  // With sequence parallelism labels are the full (B, T) on every sp rank.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels,
                  std::optional<int64_t> num_items = std::nullopt) override;
  // Where the model runs whole on this rank (no tp, sp or pp), the model's
  // head fused into the loss, as DDP's (no (B, T, V) logits); otherwise
  // loss(forward(...)).
  at::Tensor forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                          std::optional<int64_t> num_items = std::nullopt,
                          const models::TokenLayout& layout = {}) override;
  models::CausalLM& unwrap() override { return *model_; }
  // Without ZeRO the dp reducers follow it; with ZeRO (no pipeline) the zero
  // optimizer's reduce-scatter does.
  void set_grad_sync(bool enabled) override;
  // ZeRO reduces the gradients itself: the dp reducers go (their hooks with
  // them, before the zero optimizer installs its own).
  void release_grad_reducers();
  const parallel::plan::ShardedModel& sharded() const { return sharded_; }
  // ring_attn / all_to_all: the group forward()'s logits are sequence-sharded
  // over, and how; null when forward() returns the whole sequence.
  cluster::ProcessGroup* sequence_shard_group() const { return sp_group_.get(); }
  parallel::sequence::SequenceLayout sequence_shard_layout() const { return parallel::sequence::layout_of(sp_mode_); }
  // Pipeline parallelism (hybrid_parallel_pipeline.cpp): this rank's stages,
  // set by the plugin with pp_size > 1 (forward() is refused then); null without.
  void attach_pipeline(std::unique_ptr<HybridPipeline> pipeline);
  HybridPipeline* pipeline() const { return pipeline_.get(); }
  // Statistics every stage adds to and the last folds into each microbatch's
  // loss (MoeHybridParallelPlugin's router losses); none by default.
  void set_pipeline_carry(HybridPipeline::PipelineCarry carry) { pipeline_carry_ = std::move(carry); }
  PipelineOutput execute_pipeline(const PipelineBatch& batch, const PipelineCriterion& criterion,
                                  const std::function<at::Tensor(const at::Tensor&)>& scale_loss, bool return_loss,
                                  bool return_outputs) override;
 private:
  std::shared_ptr<models::CausalLM> model_;
  parallel::plan::ShardedModel sharded_;
  bool parallel_output_;
  std::unique_ptr<GradReducer> reducer_;
  std::unique_ptr<GradReducer> partial_reducer_;  // split_gather / ring: tp-replicated parameters
  cluster::ProcessGroupPtr sp_group_;
  parallel::sequence::SequenceParallelMode sp_mode_;
  int64_t inner_ring_size_;

  std::unique_ptr<HybridPipeline> pipeline_;
  HybridPipeline::PipelineCarry pipeline_carry_;
  // Final hidden (B, T, C) -> logits as forward() returns them (pipeline's last stage).
  at::Tensor pipeline_logits(const at::Tensor& hidden);

  // split_gather / ring forward up to the logits (B, T, V_local).
  at::Tensor forward_sequence_sharded(const at::Tensor& input_ids, const models::TokenLayout& layout);
};

class HybridParallelPlugin : public Plugin {
 public:
  // world: the ranks to lay the mesh over (default: the cluster's world).
  explicit HybridParallelPlugin(HybridParallelPluginOptions options, cluster::ProcessGroupPtr world = nullptr);
  ~HybridParallelPlugin() override;

  std::string name() const override { return "hybrid_parallel"; }
  std::vector<std::string> supported_precisions() const override { return {"fp32", "bf16", "fp16"}; }
  bool control_precision() const override { return true; }
  bool pipeline_parallel() const override { return options_.pp_size > 1; }
  bool holds_whole_model() const override { return options_.tp_size == 1 && options_.pp_size == 1; }
  cluster::ProcessGroupPtr dp_group() const override { return mesh_->group("dp"); }
  cluster::ProcessGroupPtr tp_group() const { return mesh_->group("tp"); }
  // The pipeline group; null unless pp_size > 1.
  cluster::ProcessGroupPtr pp_group() const { return options_.pp_size > 1 ? mesh_->group("pp") : nullptr; }
  // The ranks holding disjoint parts of the gradients (global norm, fp16
  // overflow): tp, or pp x tp with a pipeline.
  cluster::ProcessGroupPtr norm_group() const {
    return options_.pp_size > 1 ? mesh_->group({"pp", "tp"}) : mesh_->group("tp");
  }
  // The sequence-parallel group: the sp axis for ring_attn / all_to_all with
  // sp_size > 1, the tp group for split_gather / ring, else null.
  cluster::ProcessGroupPtr sp_group() const;
  const cluster::ProcessGroupMesh& mesh() const { return *mesh_; }
  const HybridParallelPluginOptions& options() const { return options_; }
  // The model this plugin wrapped (its checkpoint IO is handed the generic one).
  const WrappedModel<HybridParallelModel>& boosted() const { return boosted_; }

  // Shards the full model (same weights on every rank: built with one seed, or
  // broadcast here from dp rank 0), casts it to the precision, hooks dp reduction.
  // Lazy init: each rank reads only its tp slices of its pipeline stage's
  // parameters from the source (in bf16/fp16 directly where the source holds
  // that dtype, else fp32), never the whole model.
  bool take_param_source(const models::ParamSource& source, c10::Device device) override {
    param_source_ = source;
    lazy_device_ = device;
    return true;
  }
  std::shared_ptr<ModelWrapper> wrap_model(std::shared_ptr<models::CausalLM> model) override;
  // Clipping over tp (replicated elements counted once), fp32 masters for bf16/fp16.
  std::unique_ptr<optim::Optimizer> wrap_optimizer(ModelWrapper& model,
                                                   std::unique_ptr<optim::Optimizer> optimizer) override;
  PluginCheckpointIO* checkpoint_io() override;

 private:
  // How many ranks of norm_group() hold each element of a parameter: its tp
  // replicas, twice for a tied embedding held by the first and last stage.
  int64_t norm_replicas(const HybridParallelModel& model, const std::string& name) const;
  // zero_stage > 0 (hybrid_parallel_zero.cpp): `optimizer` inside a
  // LowLevelZeroOptimizer over dp.
  std::unique_ptr<optim::Optimizer> wrap_zero_optimizer(HybridParallelModel& model,
                                                        std::unique_ptr<optim::Optimizer> optimizer);

  HybridParallelPluginOptions options_;
  std::unique_ptr<cluster::ProcessGroupMesh> mesh_;
  // Between wrap_model and wrap_optimizer (bf16/fp16), by parameter; undefined
  // where the parameter was read in its working dtype (nothing was rounded).
  std::vector<at::Tensor> fp32_originals_;
  models::ParamSource param_source_;
  c10::Device lazy_device_ = c10::kCPU;
  WrappedModel<HybridParallelModel> boosted_{"hybrid_parallel"};
  std::unique_ptr<PluginCheckpointIO> io_;
};

// The plugin's checkpoint IO (hybrid_parallel_checkpoint.cpp): full HF model
// directories and full optimizer state, gathered over tp and written by world
// rank 0; loads slice them for this rank's layout, so a tp=2 save loads with
// tp=1, under DDP, or into transformers.
std::unique_ptr<PluginCheckpointIO> make_hybrid_parallel_checkpoint_io(const HybridParallelPlugin& plugin);

}  // namespace colossus::booster
