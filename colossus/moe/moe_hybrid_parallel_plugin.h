// MoeHybridParallelPlugin: data parallelism over the world with expert
// parallelism inside it. The mesh is (moe_dp, ep) (or (ep, moe_dp) with
// moe_dp_outside = false): experts are sharded over ep, each expert's gradient
// is averaged over moe_dp (the ranks holding it), the dense part's over the
// whole dp (= world). zero_stage 1/2 shards optimizer state (and gradients)
// with one LowLevelZeroOptimizer: the dense part over dp, the experts over
// moe_dp. The plugin owns precision (fp32, bf16, fp16 with fp32 masters) and
// clipping (max_norm; each element counted once although dense parameters are
// replicated over dp and experts over moe_dp). Checkpoints: the model as one
// HF directory (loads with any ep), the optimizer as one file per ep rank
// (resumes on any layout; another ep_size maps it by parameter name). Not
// yet: tp/pp.
#pragma once
#include "colossus/amp/loss_scaler.h"
#include "colossus/booster/grad_reducer.h"
#include "colossus/booster/plugin.h"
#include "colossus/cluster/mesh.h"
#include "colossus/models/mixtral.h"

#include <memory>
#include <string>
#include <vector>

namespace colossus::amp {
class MixedPrecisionOptimizer;
}
namespace colossus::zero {
class LowLevelZeroOptimizer;
}

namespace colossus::moe {

struct MoeHybridParallelPluginOptions {
  int64_t tp_size = 1;  // only 1 has landed (the dense part is not tp-sharded yet)
  int64_t pp_size = 1;  // only 1 has landed
  int64_t ep_size = 1;
  bool moe_dp_outside = true;  // mesh axes (moe_dp, ep): the ranks of one ep group are consecutive
  // 0: gradients all-reduced (dense over dp, experts over moe_dp); 1: optimizer
  // state sharded over the same groups; 2: gradients too. ZeRO-3 is refused.
  int zero_stage = 0;
  std::string precision = "fp32";           // "fp32", "bf16" or "fp16" (loss-scaled); masters stay fp32
  amp::LossScalerOptions loss_scaler = {};  // fp16 only
  double max_norm = 0.0;                    // > 0: clip to this global norm
  double norm_type = 2.0;                   // 2 or infinity
  double bucket_cap_mb = 25.0;              // zero_stage 0: all-reduce bucket size
  double reduce_bucket_size_in_m = 12.0;    // zero_stage 1/2: million elements per reduce-scatter bucket
  bool overlap_communication = true;        // zero_stage 1/2: reduce-scatter while backward runs
  // Throws ConfigError naming the bad value and a valid alternative.
  void validate() const;
};

class MoeHybridParallelModel : public booster::ModelWrapper {
 public:
  // zero_stage 0 builds the gradient reducers here; 1/2 leave reduction to
  // the optimizer attached by wrap_optimizer.
  MoeHybridParallelModel(std::shared_ptr<models::MixtralForCausalLM> model, cluster::ProcessGroupPtr dp_group,
                         cluster::ProcessGroupPtr ep_group, cluster::ProcessGroupPtr moe_dp_group,
                         const MoeHybridParallelPluginOptions& options);
  // input_ids: (B, T) int64 -> logits (B, T, V)
  at::Tensor forward(const at::Tensor& input_ids) override;
  models::CausalLM& unwrap() override { return *model_; }
  models::MixtralForCausalLM& mixtral() { return *model_; }
  // The Mixtral loss: causal-LM loss + the router losses the config enables.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels,
                  std::optional<int64_t> num_items = std::nullopt) override {
    return model_->moe_loss(logits, labels, num_items);
  }
  void set_grad_sync(bool enabled) override;
  cluster::ProcessGroupPtr dp_group() const { return dp_group_; }
  cluster::ProcessGroupPtr ep_group() const { return ep_group_; }
  cluster::ProcessGroupPtr moe_dp_group() const { return moe_dp_group_; }

  // Set by wrap_optimizer (not owned: the Booster's Boosted holds them).
  zero::LowLevelZeroOptimizer* zero_optimizer = nullptr;
  amp::MixedPrecisionOptimizer* mixed_optimizer = nullptr;
  // zero_stage 0 with bf16/fp16: the fp32 values before the cast, by
  // named_parameters order, so the masters start exact (taken by
  // wrap_optimizer).
  std::vector<at::Tensor> fp32_originals;

 private:
  std::shared_ptr<models::MixtralForCausalLM> model_;
  cluster::ProcessGroupPtr dp_group_, ep_group_, moe_dp_group_;
  std::unique_ptr<booster::GradReducer> dense_reducer_, expert_reducer_;
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
  cluster::ProcessGroupPtr dp_group() const override { return world_; }
  cluster::ProcessGroupPtr ep_group() const { return mesh_->group("ep"); }
  cluster::ProcessGroupPtr moe_dp_group() const { return mesh_->group("moe_dp"); }
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

 private:
  MoeHybridParallelPluginOptions options_;
  cluster::ProcessGroupPtr world_;
  cluster::ProcessGroupPtr norm_group_;  // the world on a communicator of its
                                         // own: norms, overflow flags
  std::unique_ptr<cluster::ProcessGroupMesh> mesh_;
  std::unique_ptr<booster::PluginCheckpointIO> io_;
  std::vector<std::string> optimizer_param_names_;
};

// The checkpoint IO above (moe_checkpoint_io.cpp).
std::unique_ptr<booster::PluginCheckpointIO> make_moe_checkpoint_io(MoeHybridParallelPlugin& plugin);

}  // namespace colossus::moe
