// DDPPlugin: plain data parallelism, as Colossal-AI's TorchDDPPlugin. Every
// rank holds the whole model; parameters are broadcast from rank 0 when
// boosted, and gradients are averaged in buckets while backward runs.
#pragma once
#include "colossus/booster/grad_reducer.h"
#include "colossus/booster/plugin.h"

namespace colossus::booster {

struct DDPPluginOptions {
  bool broadcast_buffers = true;
  double bucket_cap_mb = 25.0;
  bool find_unused_parameters = false;
  bool check_reduction = false;  // accepted for compatibility; reduction is always checked
  bool gradient_as_bucket_view = false;
  bool static_graph = false;  // accepted; buckets are already built once and reused
  // Gradients all-reduced in FP8 with per-bucket scales (GradReducerOptions).
  bool fp8_communication = false;
  void validate() const;
};

// The wrapped model DDPPlugin returns.
class DDPModel : public ModelWrapper {
 public:
  DDPModel(std::shared_ptr<models::CausalLM> model, cluster::ProcessGroupPtr group, const DDPPluginOptions& options);
  // input_ids: (B, T) int64 -> logits (B, T, V); buffers synced from rank 0 first.
  at::Tensor forward(const at::Tensor& input_ids, const models::TokenLayout& layout = {}) override;
  at::Tensor forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                          std::optional<int64_t> num_items = std::nullopt,
                          const models::TokenLayout& layout = {}) override;
  models::CausalLM& unwrap() override { return *model_; }
  void set_grad_sync(bool enabled) override { reducer_->set_sync_enabled(enabled); }
  const GradReducer& reducer() const { return *reducer_; }

 private:
  void sync_buffers();

  std::shared_ptr<models::CausalLM> model_;
  cluster::ProcessGroupPtr group_;
  bool broadcast_buffers_;
  std::unique_ptr<GradReducer> reducer_;
};

class DDPPlugin : public Plugin {
 public:
  // group: the ranks to replicate over (default: the cluster's world).
  explicit DDPPlugin(DDPPluginOptions options = {}, cluster::ProcessGroupPtr group = nullptr);

  std::string name() const override { return "ddp"; }
  std::vector<std::string> supported_precisions() const override { return {"fp32", "bf16", "fp16"}; }
  cluster::ProcessGroupPtr dp_group() const override { return group_; }
  std::shared_ptr<ModelWrapper> wrap_model(std::shared_ptr<models::CausalLM> model) override;
  const DDPPluginOptions& options() const { return options_; }

 private:
  DDPPluginOptions options_;
  cluster::ProcessGroupPtr group_;
};

// Broadcasts every tensor from `src` over `group`, packed per dtype into flat
// buckets of up to 64 MB so a model costs a few collectives, not one per
// parameter, and at most a bucket of extra memory. Meta tensors are skipped.
void broadcast_tensors(const std::vector<at::Tensor>& tensors, cluster::ProcessGroup& group, int src = 0);

}  // namespace colossus::booster
