// Booster: the one object a training script talks to, as Colossal-AI's. It
// takes a plugin (how the model is laid out over ranks) and boosts a model,
// optimizer, LR scheduler and dataloader into their distributed forms; then
// backward (with loss scaling), gradient accumulation (no_sync) and every
// checkpoint save/load go through it, so a script does not change when the
// plugin does.
#pragma once
#include "colossus/amp/loss_scaler.h"
#include "colossus/booster/plugin.h"
#include "colossus/data/data_loader.h"
#include "colossus/lora/lora_config.h"
#include "colossus/optim/lr_scheduler.h"
#include "colossus/optim/optimizer.h"

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace colossus::booster {

struct BoosterOptions {
  // "fp32", or "bf16"/"fp16": the model's parameters are cast to that dtype and
  // the optimizer steps fp32 master copies (amp::MixedPrecisionOptimizer),
  // fp16 with dynamic loss scaling. Ignored, with one warning, when the plugin
  // controls precision (it takes its own precision option).
  std::string mixed_precision = "fp32";
  amp::LossScalerOptions loss_scaler = {};
  double max_norm = 0.0;   // > 0: clip gradients to this global norm before each step
  double norm_type = 2.0;  // 2 or infinity
  // Where the model runs; unset means the cluster's device (cuda:LOCAL_RANK or
  // cpu). Ignored, with one warning, when the plugin controls the device.
  std::optional<c10::Device> device = std::nullopt;
  void validate() const;
};

// What boost() returns. `optimizer` is the one to step and zero (it may wrap
// the one passed in: fp32 masters, sharding); the scheduler drives it.
struct Boosted {
  std::shared_ptr<ModelWrapper> model;
  std::shared_ptr<optim::Optimizer> optimizer;
  std::shared_ptr<optim::LRScheduler> lr_scheduler;  // null if none was given
  std::shared_ptr<data::DataLoader> dataloader;      // null if none was given
};


class Booster {
 public:
  explicit Booster(std::shared_ptr<Plugin> plugin, BoosterOptions options = {});
  ~Booster();
  Booster(const Booster&) = delete;
  Booster& operator=(const Booster&) = delete;

  // Moves the model to the device and precision, wraps it with the plugin,
  // wraps the optimizer (fp32 masters when mixed precision) and rebinds the
  // scheduler to the wrapped optimizer. `optimizer` must hold `model`'s
  // parameters and not have stepped. `lr_scheduler` may be null; it must
  // have been built on `optimizer`. A lazy model (models::create_lazy_model)
  // needs `param_source`: each rank then reads only what its plugin keeps
  // (Plugin::take_param_source), in the final dtype, never the whole model in
  // fp32 first; with mixed precision the fp32 masters come from the source.
  Boosted boost(std::shared_ptr<models::CausalLM> model, std::unique_ptr<optim::Optimizer> optimizer,
                std::shared_ptr<optim::LRScheduler> lr_scheduler = nullptr,
                std::shared_ptr<data::DataLoader> dataloader = nullptr, const models::ParamSource& param_source = {});

  // Colossal-AI's booster.enable_lora: LoRA adapters on `model` before it is
  // boosted (lora::apply_lora: the base frozen, fp32 adapters trained); build
  // the optimizer afterwards, on the parameters that still train. Returns the
  // applied config ("all-linear" resolved). ConfigError when this plugin
  // cannot train adapters yet (hybrid_parallel: the tensor-parallel sharder
  // does not split them) or the config is invalid.
  lora::LoraConfig enable_lora(models::CausalLM& model, const lora::LoraConfig& config, uint64_t seed = 0);

  // A dataloader sharded over the plugin's data-parallel group: this rank
  // reads 1/dp of each epoch, shuffled by (seed, epoch) identically on all ranks.
  std::shared_ptr<data::DataLoader> prepare_dataloader(std::shared_ptr<const data::TokenDataset> dataset,
                                                       data::DataLoaderOptions options, uint64_t seed = 0,
                                                       bool shuffle = true);

  // loss.backward(), scaled by the optimizer's loss scale (fp16).
  void backward(const at::Tensor& loss, optim::Optimizer& optimizer);

  // Pipeline parallelism (HybridParallelPlugin with pp_size > 1): takes the
  // next batch from data_iter, runs forward and backward over its
  // microbatches in the plugin's schedule (criterion: each microbatch's share
  // of the batch loss, or the model's loss when empty), scales losses for
  // fp16, and synchronises gradients. Then step the optimizer as usual. The
  // loss is returned on every rank, the logits on the last stage's ranks.
  PipelineOutput execute_pipeline(const PipelineDataIter& data_iter, ModelWrapper& model,
                                  const PipelineCriterion& criterion, optim::Optimizer& optimizer,
                                  bool return_loss = true, bool return_outputs = false);

  // While the guard lives, backward only accumulates gradients locally; the
  // first backward after it synchronises the sums (gradient accumulation).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(ModelWrapper& model);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    ModelWrapper& model_;
  };
  NoSyncGuard no_sync(ModelWrapper& model) { return NoSyncGuard(model); }

  // Every save/load below is collective: all ranks of the plugin's dp group
  // call it. With a replicating plugin (DDP) dp rank 0 writes and the others
  // wait for it; all ranks read. An error on any rank throws on every rank.
  //
  // Model: a Hugging Face directory (config.json + model.safetensors or shards
  // + index) that transformers' from_pretrained reads. Loading is strict and
  // names any missing, unexpected or mis-shaped tensor. With bf16/fp16 the
  // fp32 masters follow the loaded weights, except where they already round to
  // them (a resumed run that also loads the optimizer keeps exact masters).
  void save_model(ModelWrapper& model, const std::string& dir, const SaveOptions& options = {});
  void load_model(ModelWrapper& model, const std::string& dir);
  // Optimizer state (fp32 masters and moments) as safetensors + JSON, so a
  // resumed run continues bit for bit: dir/optimizer.safetensors (or
  // optimizer-0000k-of-0000n.safetensors + optimizer.safetensors.index.json),
  // the JSON in every file's metadata so tensors and JSON commit together.
  // `dir` may be the model's directory: the file names do not collide.
  void save_optimizer(optim::Optimizer& optimizer, const std::string& dir, const SaveOptions& options = {});
  void load_optimizer(optim::Optimizer& optimizer, const std::string& dir);
  // Scheduler state as one JSON file (written atomically).
  void save_lr_scheduler(const optim::LRScheduler& scheduler, const std::string& path);
  void load_lr_scheduler(optim::LRScheduler& scheduler, const std::string& path);
  // Blocks until every use_async save has reached disk; rethrows its error
  // (on every rank: collective). Call it before treating a checkpoint as done.
  void wait_for_saves();

  Plugin& plugin() { return *plugin_; }
  const BoosterOptions& options() const { return options_; }
  c10::Device device() const;

 private:
  struct Impl;
  std::shared_ptr<Plugin> plugin_;
  BoosterOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace colossus::booster
