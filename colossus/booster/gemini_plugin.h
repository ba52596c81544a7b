// GeminiPlugin: ZeRO-3 over chunks with CPU offload, with Colossal-AI's
// GeminiPlugin options. Parameters live in chunks sharded over the dp ranks
// (zero::gemini::GeminiDDP) and are gathered only around the segment that
// uses them; fp32 master shards, gradient shards and optimizer state sit where
// the placement policy says (static fractions, or auto from a traced warm-up
// step); zero::gemini::GeminiOptimizer steps them and owns precision/clipping.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossus/booster/plugin.h"
#include "colossus/booster/wrapped_model.h"
#include "colossus/zero/gemini/gemini_ddp.h"
#include "colossus/zero/gemini/gemini_optimizer.h"

namespace colossus::booster {

struct GeminiPluginOptions {
  // What GeminiDDP and GeminiOptimizer take (placement, precision, offload,
  // loss scaling, clipping, NVMe, lazy init), with Colossal-AI's GeminiPlugin
  // defaults. Its chunk_search comes from the three fields below.
  zero::gemini::GeminiOptions gemini = {};
  // Chunk size search, in millions (2^20) of elements, as Colossal-AI's;
  // hidden_dim > 0 steps the search by it instead of 1024.
  double search_range_m = 32.0;
  double min_chunk_size_m = 32.0;
  int64_t hidden_dim = 0;
  // Throws ConfigError naming the bad value (or combination) and what to use.
  void validate() const;
  zero::gemini::GeminiOptions gemini_options() const;
};

// The wrapped model: forward runs through the chunk schedule.
class GeminiModel : public ModelWrapper {
 public:
  explicit GeminiModel(std::unique_ptr<zero::gemini::GeminiDDP> ddp) : ddp_(std::move(ddp)) {}
  // input_ids: (B, T) int64 -> logits (B, T, V)
  at::Tensor forward(const at::Tensor& input_ids, const models::TokenLayout& layout = {}) override {
    return ddp_->forward(input_ids, layout);
  }
  // The head fused into the loss, as DDP's and ZeRO's: the same curve to the bit.
  at::Tensor forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                          std::optional<int64_t> num_items = std::nullopt,
                          const models::TokenLayout& layout = {}) override {
    return ddp_->forward_loss(input_ids, labels, num_items, layout);
  }
  models::CausalLM& unwrap() override { return ddp_->model(); }
  void set_grad_sync(bool enabled) override { ddp_->set_grad_sync(enabled); }
  zero::gemini::GeminiDDP& ddp() { return *ddp_; }

 private:
  std::unique_ptr<zero::gemini::GeminiDDP> ddp_;
};

class GeminiPlugin : public Plugin {
 public:
  // group: the data-parallel ranks (default: the cluster's world).
  explicit GeminiPlugin(GeminiPluginOptions options = {}, cluster::ProcessGroupPtr group = nullptr);
  ~GeminiPlugin() override;

  std::string name() const override { return "gemini"; }
  std::vector<std::string> supported_precisions() const override { return {"fp32", "bf16", "fp16"}; }
  bool control_precision() const override { return true; }
  bool holds_whole_model() const override { return false; }  // parameters live in sharded chunks
  bool control_device() const override { return true; }  // chunks are built on the device / host directly
  cluster::ProcessGroupPtr dp_group() const override { return group_; }
  cluster::ProcessGroupPtr grad_partition_group() const override { return group_; }
  // Gemini builds each rank's chunk shards from the source (unless its
  // options already name one).
  bool take_param_source(const models::ParamSource& source, c10::Device) override {
    if (!options_.gemini.param_source) options_.gemini.param_source = source;
    return true;
  }
  std::shared_ptr<ModelWrapper> wrap_model(std::shared_ptr<models::CausalLM> model) override;
  // Returns a zero::gemini::GeminiOptimizer around `optimizer`.
  std::unique_ptr<optim::Optimizer> wrap_optimizer(ModelWrapper& model,
                                                   std::unique_ptr<optim::Optimizer> optimizer) override;
  PluginCheckpointIO* checkpoint_io() override { return io_.get(); }
  const GeminiPluginOptions& options() const { return options_; }

 private:
  GeminiPluginOptions options_;
  cluster::ProcessGroupPtr group_;
  WrappedModel<GeminiModel> boosted_{"gemini"};
  std::unique_ptr<PluginCheckpointIO> io_;
};

}  // namespace colossus::booster
