// MoeHybridParallelPlugin: data parallelism with expert parallelism inside it,
// optionally composed with tensor and pipeline parallelism for the dense part.
// The mesh is (moe_dp, ep[, pp][, tp]) (or (ep, moe_dp, ...) with
// moe_dp_outside = false); dp = moe_dp x ep. Experts are sharded over ep and
// kept whole on every tp rank (replicated over tp, like the router); each
// expert's gradient is averaged over moe_dp (the ranks holding it), the dense
// part's over dp. tp_size > 1 shards attention, embedding and head by
// parallel::plan::mixtral_plan (HybridParallelModel does the forward and the
// vocab-parallel loss); pp_size > 1 splits the blocks over pp with
// HybridParallelPlugin's stage manager and schedules (booster.execute_pipeline).
// zero_stage 1/2 shards optimizer state (and gradients; stage 2 without pp)
// with one LowLevelZeroOptimizer: the dense part over dp, the experts over
// moe_dp; with tp/pp its norm also sums over tp x pp (replicas counted once)
// and with pp the schedule hands it the gradients once per step.
// The plugin owns precision (fp32, bf16, fp16 with fp32 masters) and clipping
// (max_norm; each element counted once although dense parameters are
// replicated over dp and tp, experts over moe_dp and tp). Checkpoints: the
// model as one HF directory (tp slices and pp stages gathered whole; loads
// with any layout and into transformers), the optimizer as one file per ep
// rank in the layout-free form (resumes on any tp x pp x zero layout; another
// ep_size maps it by parameter name). Router losses with pp ride to the last
// stage (router_loss_carry.h). ZeRO-2 with pp is a ConfigError (the schedule
// reduces once per step, so stage 2 would save nothing over stage 1).
#pragma once
#include "colossus/amp/loss_scaler.h"
#include "colossus/booster/grad_reducer.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/booster/plugin.h"
#include "colossus/booster/wrapped_model.h"
#include "colossus/cluster/mesh.h"
#include "colossus/models/mixtral.h"

#include <memory>
#include <string>
#include <vector>

namespace colossus::moe {

struct MoeHybridParallelPluginOptions {
  int64_t tp_size = 1;  // tensor parallelism of the dense part (experts stay whole)
  int64_t pp_size = 1;  // pipeline stages; a step is booster.execute_pipeline
  int64_t ep_size = 1;
  // pp_size > 1: as HybridParallelPluginOptions (1f1b, interleaved,
  // zero_bubble; microbatching; blocks per stage; p2p overlap).
  std::string pp_style = "1f1b";
  int num_model_chunks = 1;
  int64_t num_microbatches = 0;
  int64_t microbatch_size = 0;
  std::vector<int64_t> num_layers_per_stage;
  bool overlap_p2p = true;
  int64_t make_vocab_size_divisible_by = 64;  // tp_size > 1: vocab padded to a multiple of this x tp
  bool moe_dp_outside = true;  // mesh axes (moe_dp, ep): the ranks of one ep group are consecutive
  // 0: gradients all-reduced (dense over dp, experts over moe_dp); 1: optimizer
  // state sharded over the same groups (any tp, pp); 2: gradients too
  // (pp_size = 1). ZeRO-3 is refused.
  int zero_stage = 0;
  std::string precision = "fp32";           // "fp32", "bf16" or "fp16" (loss-scaled); masters stay fp32
  amp::LossScalerOptions loss_scaler = {};  // fp16 only
  double max_norm = 0.0;                    // > 0: clip to this global norm
  double norm_type = 2.0;                   // 2 or infinity
  double bucket_cap_mb = 25.0;              // zero_stage 0: all-reduce bucket size
  double reduce_bucket_size_in_m = 12.0;    // zero_stage 1/2: million elements per reduce-scatter bucket
  bool overlap_communication = true;        // zero_stage 1/2: reduce-scatter while backward runs
  // Activation checkpointing of the first round(ratio x blocks) blocks,
  // wrapped after the expert and tp sharding (as hybrid_parallel does), so
  // the wrappers adopt this rank's experts and parallel layers. 0: off.
  double gradient_checkpointing_ratio = 0.0;
  // Throws ConfigError naming the bad value and a valid alternative.
  void validate() const;
  // The tp/pp part as HybridParallelPluginOptions (pipeline checks and options).
  booster::HybridParallelPluginOptions hybrid_options() const;
};

class MoeHybridParallelModel : public booster::ModelWrapper {
 public:
  // zero_stage 0 builds the gradient reducers here; 1/2 leave reduction to
  // the optimizer attached by wrap_optimizer.
  // tp_pp: null (tp = pp = 1), or the tp-sharded model (with its pipeline
  // when pp > 1) that the plugin already broadcast, expert-sharded and cast;
  // its own dp reducer is off (this wrapper reduces dense and expert
  // gradients over their groups).
  MoeHybridParallelModel(std::shared_ptr<models::MixtralForCausalLM> model, cluster::ProcessGroupPtr dp_group,
                         cluster::ProcessGroupPtr ep_group, cluster::ProcessGroupPtr moe_dp_group,
                         const MoeHybridParallelPluginOptions& options,
                         std::shared_ptr<booster::HybridParallelModel> tp_pp = nullptr);
  // input_ids: (B, T) int64 -> logits (B, T, V); with tp > 1 this rank's vocab
  // slice (B, T, V_padded / tp). Refused with pp > 1 (use execute_pipeline).
  at::Tensor forward(const at::Tensor& input_ids, const models::TokenLayout& layout = {}) override;
  models::CausalLM& unwrap() override { return *model_; }
  models::MixtralForCausalLM& mixtral() { return *model_; }
  // The Mixtral loss: causal-LM loss (vocab-parallel with tp) + the router
  // losses the config enables.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels,
                  std::optional<int64_t> num_items = std::nullopt) override;
  void set_grad_sync(bool enabled) override;
  // pp > 1: one step's schedule (HybridPipeline), then dense gradients
  // averaged over dp, experts' over moe_dp (and divided by ep).
  booster::PipelineOutput execute_pipeline(const booster::PipelineBatch& batch,
                                           const booster::PipelineCriterion& criterion,
                                           const std::function<at::Tensor(const at::Tensor&)>& scale_loss,
                                           bool return_loss, bool return_outputs) override;
  // Null with tp = pp = 1.
  booster::HybridParallelModel* tp_pp() const { return tp_pp_.get(); }
  cluster::ProcessGroupPtr dp_group() const { return dp_group_; }
  cluster::ProcessGroupPtr ep_group() const { return ep_group_; }
  cluster::ProcessGroupPtr moe_dp_group() const { return moe_dp_group_; }

  // ZeRO with a pipeline: the schedule hands the gradients to the ZeRO
  // optimizer, so execute_pipeline does not average them itself.
  void reduce_after_schedule_by_zero() { zero_after_schedule_ = true; }

  // Blocks until the attached optimizer's last update reached the parameters.
  void wait_for_params() const;
  // zero_stage 0 with bf16/fp16: the fp32 values before the cast, by
  // named_parameters order, so the masters start exact (taken by
  // wrap_optimizer).
  std::vector<at::Tensor> fp32_originals;

 private:
  std::shared_ptr<models::MixtralForCausalLM> model_;
  std::shared_ptr<booster::HybridParallelModel> tp_pp_;
  cluster::ProcessGroupPtr dp_group_, ep_group_, moe_dp_group_;
  std::unique_ptr<booster::GradReducer> dense_reducer_, expert_reducer_;
  bool zero_after_schedule_ = false;
};

class MoeHybridParallelPlugin : public booster::Plugin {
 public:
  // world: the ranks to lay out (default: the cluster's world).
  explicit MoeHybridParallelPlugin(MoeHybridParallelPluginOptions options = {},
                                   cluster::ProcessGroupPtr world = nullptr);
  ~MoeHybridParallelPlugin() override;
  std::string name() const override { return "moe_hybrid_parallel"; }
  std::vector<std::string> supported_precisions() const override { return {"fp32", "bf16", "fp16"}; }
  // Masters and clipping need the ep/moe_dp layout, which the Booster's own
  // wrappers do not know.
  bool control_precision() const override { return true; }
  bool pipeline_parallel() const override { return options_.pp_size > 1; }
  bool holds_whole_model() const override {
    return options_.tp_size == 1 && options_.pp_size == 1 && options_.ep_size == 1;
  }
  // moe_dp x ep: the ranks that see different data (the world when tp = pp = 1).
  cluster::ProcessGroupPtr dp_group() const override { return has_tp_pp() ? mesh_->group({"moe_dp", "ep"}) : world_; }
  cluster::ProcessGroupPtr ep_group() const { return mesh_->group("ep"); }
  cluster::ProcessGroupPtr moe_dp_group() const { return mesh_->group("moe_dp"); }
  // Null unless tp_size > 1 / pp_size > 1.
  cluster::ProcessGroupPtr tp_group() const { return options_.tp_size > 1 ? mesh_->group("tp") : nullptr; }
  cluster::ProcessGroupPtr pp_group() const { return options_.pp_size > 1 ? mesh_->group("pp") : nullptr; }
  bool has_tp_pp() const { return options_.tp_size > 1 || options_.pp_size > 1; }
  // The ranks tp slices are gathered over: the tp group, or this rank alone
  // (tp_size = 1 with pp). Null with tp = pp = 1.
  cluster::ProcessGroupPtr tp_group_or_self() const { return tp_group() ? tp_group() : self_group_; }
  // Every rank this plugin lays out (checkpoint calls agree over it).
  cluster::ProcessGroupPtr world() const { return world_; }
  // The ranks holding other slices (tp) or stages (pp) of the same dp
  // replica: a norm over them sums different gradients. Null with tp = pp = 1.
  cluster::ProcessGroupPtr model_parallel_group() const {
    if (options_.tp_size > 1 && options_.pp_size > 1) return mesh_->group({"pp", "tp"});
    return options_.tp_size > 1 ? tp_group() : pp_group();
  }
  const MoeHybridParallelPluginOptions& options() const { return options_; }
  // Throws ConfigError unless `model` is a MixtralForCausalLM whose experts
  // ep_size divides.
  std::shared_ptr<booster::ModelWrapper> wrap_model(std::shared_ptr<models::CausalLM> model) override;
  // zero_stage 0: `optimizer` (pruned to this rank's parameters) with clipping
  // and fp32 masters as configured; 1/2: a zero::LowLevelZeroOptimizer around
  // it.
  std::unique_ptr<optim::Optimizer> wrap_optimizer(booster::ModelWrapper& model,
                                                   std::unique_ptr<optim::Optimizer> optimizer) override;
  booster::PluginCheckpointIO* checkpoint_io() override { return io_.get(); }
  // The wrapped optimizer's parameters by name, in its flat order (the
  // indices of its state): checkpoints map state between ep layouts by name.
  const std::vector<std::string>& optimizer_param_names() const { return optimizer_param_names_; }
  // The model this plugin wrapped (optimizer checkpoints need its layout).
  const booster::WrappedModel<MoeHybridParallelModel>& boosted() const { return boosted_; }

 private:
  MoeHybridParallelPluginOptions options_;
  cluster::ProcessGroupPtr world_;
  cluster::ProcessGroupPtr norm_group_;  // the world on a communicator of its
                                         // own: norms, overflow flags
  std::unique_ptr<cluster::ProcessGroupMesh> mesh_;
  std::unique_ptr<booster::PluginCheckpointIO> io_;
  std::vector<std::string> optimizer_param_names_;
  booster::WrappedModel<MoeHybridParallelModel> boosted_{"moe_hybrid_parallel"};
  cluster::ProcessGroupPtr self_group_;     // tp/pp: this rank alone (HybridParallelModel's idle reducer)
  std::vector<at::Tensor> fp32_originals_;  // tp/pp, bf16/fp16: between wrap_model and wrap_optimizer

  std::shared_ptr<MoeHybridParallelModel> wrap_tp_pp(std::shared_ptr<models::MixtralForCausalLM> mixtral);
};

// The checkpoint IO above (moe_checkpoint_io.cpp).
std::unique_ptr<booster::PluginCheckpointIO> make_moe_checkpoint_io(MoeHybridParallelPlugin& plugin);

}  // namespace colossus::moe
