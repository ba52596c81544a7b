// LowLevelZeroPlugin: ZeRO stage 1/2 data parallelism, with Colossal-AI's
// options. The model is replicated (parameters in flat per-bucket buffers);
// optimizer state (stage 1) and gradients (stage 2) are sharded over dp ranks
// by zero::LowLevelZeroOptimizer, which also owns precision and clipping.
#pragma once
#include "colossus/amp/loss_scaler.h"
#include "colossus/booster/plugin.h"
#include "colossus/booster/wrapped_model.h"
#include "colossus/zero/low_level/low_level_zero_optimizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace colossus::booster {

struct LowLevelZeroPluginOptions {
  int stage = 1;                   // 1: optimizer state sharded; 2: gradients too
  std::string precision = "fp16";  // "fp16" (loss-scaled), "bf16" or "fp32"
  // Dynamic loss scaling (fp16), Colossal-AI's defaults (2^32 to start and at most).
  amp::LossScalerOptions loss_scaler = {.initial_scale = 4294967296.0, .max_scale = 4294967296.0};
  double max_norm = 0.0;                  // > 0: clip to this global norm
  double norm_type = 2.0;                 // 2 or infinity
  double reduce_bucket_size_in_m = 12.0;  // million elements per reduce-scatter bucket
  std::string communication_dtype;        // "" (the parameters' dtype), "fp32", "bf16" or "fp16"
  bool fp8_communication = false;         // gradients reduce-scattered, parameters all-gathered in FP8 e4m3
  bool overlap_communication = true;      // reduce-scatter while backward runs
  bool overlap_allgather = false;         // all-gather updated params while the next forward is prepared
  bool cpu_offload = false;               // fp32 masters, optimizer state and its update on CPU
  bool master_weights = true;             // false: bf16/fp16 shards are stepped directly
  // > 1: state is sharded over world/extra_dp_size ranks and replicated over
  // extra_dp_size groups of them (gradients averaged over all).
  int extra_dp_size = 1;
  // Throws ConfigError naming the bad value and a valid alternative.
  void validate() const;
  zero::LowLevelZeroOptions zero_options() const;
};

// The wrapped model: forward waits for the last step's all-gather.
class LowLevelZeroModel : public ModelWrapper {
 public:
  explicit LowLevelZeroModel(std::shared_ptr<models::CausalLM> model) : model_(std::move(model)) {}
  // input_ids: (B, T) int64 -> logits (B, T, V)
  at::Tensor forward(const at::Tensor& input_ids, const models::TokenLayout& layout = {}) override;
  at::Tensor forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                          std::optional<int64_t> num_items = std::nullopt,
                          const models::TokenLayout& layout = {}) override;
  models::CausalLM& unwrap() override { return *model_; }
  void set_grad_sync(bool enabled) override;
  // Blocks until the attached optimizer's last update reached the parameters.
  void wait_for_params() const;
  // The parameters take the masters' values in their own dtype (a model save
  // under fp8_communication writes the weights, not their e4m3 roundings).
  void gather_exact_params() const;

 private:
  std::shared_ptr<models::CausalLM> model_;
};

class LowLevelZeroPlugin : public Plugin {
 public:
  // group: the data-parallel ranks (default: the cluster's world).
  explicit LowLevelZeroPlugin(LowLevelZeroPluginOptions options = {}, cluster::ProcessGroupPtr group = nullptr);
  ~LowLevelZeroPlugin() override;

  std::string name() const override { return "low_level_zero"; }
  std::vector<std::string> supported_precisions() const override { return {"fp32", "bf16", "fp16"}; }
  bool control_precision() const override { return true; }
  cluster::ProcessGroupPtr dp_group() const override { return group_; }
  cluster::ProcessGroupPtr grad_partition_group() const override { return shard_group_; }
  // Lazy init: the ZeRO optimizer fills each bucket (and its master shard)
  // from the source, so no rank builds the whole model in fp32 first.
  bool take_param_source(const models::ParamSource& source, c10::Device device) override {
    param_source_ = source;
    lazy_device_ = device;
    return true;
  }
  std::shared_ptr<ModelWrapper> wrap_model(std::shared_ptr<models::CausalLM> model) override;
  // Returns a zero::LowLevelZeroOptimizer around `optimizer`.
  std::unique_ptr<optim::Optimizer> wrap_optimizer(ModelWrapper& model,
                                                   std::unique_ptr<optim::Optimizer> optimizer) override;
  PluginCheckpointIO* checkpoint_io() override { return io_.get(); }
  const LowLevelZeroPluginOptions& options() const { return options_; }

 private:
  LowLevelZeroPluginOptions options_;
  models::ParamSource param_source_;
  c10::Device lazy_device_ = c10::kCPU;
  cluster::ProcessGroupPtr group_;        // all data-parallel ranks
  cluster::ProcessGroupPtr shard_group_;  // the ranks state is sharded over
  cluster::ProcessGroupPtr extra_group_;  // replicas of one shard (null when extra_dp_size is 1)
  WrappedModel<LowLevelZeroModel> boosted_{"low_level_zero"};
  std::unique_ptr<PluginCheckpointIO> io_;
};

}  // namespace colossus::booster
