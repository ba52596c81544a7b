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

#include "colossus/amp/loss_scaler.h"
#include "colossus/booster/plugin.h"
#include "colossus/booster/wrapped_model.h"
#include "colossus/zero/gemini/gemini_ddp.h"
#include "colossus/zero/gemini/gemini_optimizer.h"

namespace colossus::booster {

struct GeminiPluginOptions {
  std::string placement_policy = "static";  // "static" or "auto"
  // static only: share of chunks sharded (the rest stay gathered on every
  // rank), and shares of the sharded chunks whose optimizer side (fp32
  // master, gradient, optimizer state) / parameter shard live in host memory.
  double shard_param_frac = 1.0;
  double offload_optim_frac = 0.0;
  double offload_param_frac = 0.0;
  // auto only: non-model share of device memory assumed in the warm-up step,
  // share of device capacity chunks may use after it, share of the margin left
  // after the parameter shards that optimizer shards may take.
  double warmup_non_model_data_ratio = 0.8;
  double steady_cuda_cap_ratio = 0.9;
  double gpu_margin_mem_ratio = 0.0;
  std::string precision = "fp16";             // "fp16" (loss-scaled), "bf16" or "fp32"
  bool master_weights = true;                 // false: the bf16/fp16 shards are stepped directly
  bool pin_memory = false;                    // host shards pinned (CUDA)
  int max_prefetch = 0;                       // chunks all-gathered ahead of use
  bool enable_gradient_accumulation = false;  // backward several times per step (no_sync allowed)
  // Chunk size search, in millions (2^20) of elements, as Colossal-AI's;
  // hidden_dim > 0 steps the search by it instead of 1024.
  double search_range_m = 32.0;
  double min_chunk_size_m = 32.0;
  int64_t hidden_dim = 0;
  // Dynamic loss scaling (fp16), Colossal-AI's GeminiPlugin defaults (2^16 to start, at most 2^32).
  amp::LossScalerOptions loss_scaler = {.initial_scale = 65536.0, .max_scale = 4294967296.0};
  double max_norm = 0.0;            // > 0: clip to this global norm (over the shards)
  double norm_type = 2.0;           // 2 or infinity
  // NVMe offload (static only, as Colossal-AI's HybridAdam nvme_offload_*):
  // this share of the chunks offload_optim_frac put on the host keep their
  // optimizer moments in files under nvme_offload_dir between steps (read
  // before and written after each chunk's step on a small IO thread pool,
  // the next chunk prefetched). Needs an elementwise optimizer.
  double nvme_offload_fraction = 0.0;
  std::string nvme_offload_dir = "";
  // C++ only (no config key): device memory figures for the auto policy
  // (default: metrics::device_memory(), the CUDA allocator's).
  std::function<std::optional<metrics::DeviceMemory>()> memory_probe = {};
  // C++ only (the trainer's `lazy_init` key sets it): where the values of a
  // model built on the meta device (models::create_lazy_model) come from;
  // each rank materialises only its chunk shards (models::seeded_source gives
  // eager init's values, models::checkpoint_source a checkpoint's).
  models::ParamSource param_source = {};
  // Throws ConfigError naming the bad value (or combination) and what to use.
  void validate() const;
  zero::gemini::GeminiOptions gemini_options() const;
};

// The wrapped model: forward runs through the chunk schedule.
class GeminiModel : public ModelWrapper {
 public:
  explicit GeminiModel(std::unique_ptr<zero::gemini::GeminiDDP> ddp) : ddp_(std::move(ddp)) {}
  // input_ids: (B, T) int64 -> logits (B, T, V)
  at::Tensor forward(const at::Tensor& input_ids) override { return ddp_->forward(input_ids); }
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
