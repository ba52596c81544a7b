// MoeHybridParallelPlugin (first cut): data parallelism over the world with
// expert parallelism inside it. The mesh is (moe_dp, ep) (or (ep, moe_dp)
// with moe_dp_outside = false): experts are sharded over ep, each expert's
// gradient is averaged over moe_dp (the ranks holding it), the dense part's
// over the whole dp (= world). Not yet: tp/pp, ZeRO for either part, expert
// checkpoint IO across ep layouts, mixed precision (fp32 only).
#pragma once
#include "colossus/booster/grad_reducer.h"
#include "colossus/booster/plugin.h"
#include "colossus/cluster/mesh.h"
#include "colossus/models/mixtral.h"

#include <memory>
#include <string>
#include <vector>

namespace colossus::moe {

struct MoeHybridParallelPluginOptions {
  int64_t ep_size = 1;
  bool moe_dp_outside = true;  // mesh axes (moe_dp, ep): the ranks of one ep group are consecutive
  double bucket_cap_mb = 25.0;
  std::string precision = "fp32";
  void validate() const;
};

class MoeHybridParallelModel : public booster::ModelWrapper {
 public:
  MoeHybridParallelModel(std::shared_ptr<models::MixtralForCausalLM> model, cluster::ProcessGroupPtr dp_group,
                         cluster::ProcessGroupPtr ep_group, cluster::ProcessGroupPtr moe_dp_group,
                         const MoeHybridParallelPluginOptions& options);
  // input_ids: (B, T) int64 -> logits (B, T, V)
  at::Tensor forward(const at::Tensor& input_ids) override { return model_->forward(input_ids); }
  models::CausalLM& unwrap() override { return *model_; }
  // The Mixtral loss: causal-LM loss + the router losses the config enables.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels,
                  std::optional<int64_t> num_items = std::nullopt) override {
    return model_->moe_loss(logits, labels, num_items);
  }
  void set_grad_sync(bool enabled) override;

 private:
  std::shared_ptr<models::MixtralForCausalLM> model_;
  std::unique_ptr<booster::GradReducer> dense_reducer_, expert_reducer_;
};

class MoeHybridParallelPlugin : public booster::Plugin {
 public:
  // world: the ranks to lay out (default: the cluster's world).
  explicit MoeHybridParallelPlugin(MoeHybridParallelPluginOptions options = {},
                                   cluster::ProcessGroupPtr world = nullptr);
  std::string name() const override { return "moe_hybrid_parallel"; }
  std::vector<std::string> supported_precisions() const override { return {"fp32"}; }
  cluster::ProcessGroupPtr dp_group() const override { return world_; }
  cluster::ProcessGroupPtr ep_group() const { return mesh_->group("ep"); }
  cluster::ProcessGroupPtr moe_dp_group() const { return mesh_->group("moe_dp"); }
  // Throws ConfigError unless `model` is a MixtralForCausalLM whose experts ep_size divides.
  std::shared_ptr<booster::ModelWrapper> wrap_model(std::shared_ptr<models::CausalLM> model) override;

 private:
  MoeHybridParallelPluginOptions options_;
  cluster::ProcessGroupPtr world_;
  std::unique_ptr<cluster::ProcessGroupMesh> mesh_;
};

}  // namespace colossus::moe
