// The Plugin interface: a plugin decides how a model, its optimizer and its
// data are laid out over ranks (DDP, ZeRO, hybrid parallel...). The Booster
// asks what the plugin controls and defers to it; what the plugin does not
// control (precision, device) the Booster handles itself.
#pragma once
#include "colossus/booster/pipeline_batch.h"
#include "colossus/cluster/process_group.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/lazy_init.h"
#include "colossus/optim/optimizer.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace colossus::booster {

// A boosted model: forward through the plugin's wrapping (gradient hooks,
// sharding...), with the plain model underneath.
class ModelWrapper {
 public:
  virtual ~ModelWrapper() = default;
  // input_ids: (B, T) int64 -> logits (B, T, V); `layout` places the tokens
  // of padded or packed rows (models/token_layout.h), empty: causal rows.
  virtual at::Tensor forward(const at::Tensor& input_ids, const models::TokenLayout& layout = {}) = 0;
  virtual models::CausalLM& unwrap() = 0;
  // logits from forward(), labels (B, T) int64 -> the scalar causal-LM loss.
  // A plugin whose forward returns sharded logits (tensor parallel: this
  // rank's vocab slice) computes it on them; the default is the model's own.
  virtual at::Tensor loss(const at::Tensor& logits, const at::Tensor& labels,
                          std::optional<int64_t> num_items = std::nullopt) {
    return unwrap().loss(logits, labels, num_items);
  }
  // input_ids, labels: (B, T) -> loss(forward(input_ids), labels, num_items).
  // Plugins that run the model's own forward override it with the model's
  // head fused into the loss (CausalLM::forward_loss: no (B, T, V) logits).
  virtual at::Tensor forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                                  std::optional<int64_t> num_items = std::nullopt,
                                  const models::TokenLayout& layout = {}) {
    return loss(forward(input_ids, layout), labels, num_items);
  }
  // Gradient accumulation: while a guard is alive, backward does not
  // synchronise gradients across ranks.
  virtual void set_grad_sync(bool enabled) = 0;
  // One step's forward and backward over microbatches of `batch` through a
  // pipeline (Booster::execute_pipeline); gradients are synchronised when it
  // returns. scale_loss: applied to each microbatch loss before its backward.
  // Only pipeline-parallel models implement it.
  virtual PipelineOutput execute_pipeline(const PipelineBatch& batch, const PipelineCriterion& criterion,
                                          const std::function<at::Tensor(const at::Tensor&)>& scale_loss,
                                          bool return_loss, bool return_outputs);

  // The optimizer boosted with this model (Booster::boost attaches it; not owned).
  void attach_optimizer(std::weak_ptr<optim::Optimizer> optimizer) { optimizer_ = std::move(optimizer); }
  // This model's parameters were overwritten (Booster::load_model): the
  // attached optimizer's own copies of them follow (Optimizer::follow_parameters).
  void parameters_changed();

 protected:
  // The attached optimizer, or null (none attached, or already destroyed).
  std::shared_ptr<optim::Optimizer> attached_optimizer() const { return optimizer_.lock(); }

 private:
  std::weak_ptr<optim::Optimizer> optimizer_;
};

struct SaveOptions {
  int64_t size_per_shard_mb = 1024;  // HF sharded layout past this size
  // Copy tensors to host buffers now, write them on a background thread while
  // training goes on (index last); wait_for_saves() or the next save joins it.
  bool use_async = false;
  // Plugins whose state is sharded over ranks (gemini, low_level_zero): each
  // rank writes the whole tensors it owns as its own file of a sharded HF
  // layout plus an index (no rank gathers the model or the optimizer state;
  // size_per_shard_mb and use_async do not apply). Any rank count, DDP and
  // transformers load the result. false: gathered, written by rank 0.
  bool shard = false;
};

// Checkpoint IO of a plugin whose model or optimizer state is sharded over
// ranks (ZeRO, tensor parallelism): it gathers or writes per-rank shards
// itself. Every call is collective over the job. Model directories must stay
// Hugging Face directories (full tensors, true vocabulary) so any layout and
// transformers can load them; optimizer state may be per-rank shards + index,
// but a checkpoint saved with N ranks must load with M.
class PluginCheckpointIO {
 public:
  virtual ~PluginCheckpointIO() = default;
  virtual void save_model(ModelWrapper& model, const std::string& dir, const SaveOptions& options) = 0;
  virtual void load_model(ModelWrapper& model, const std::string& dir) = 0;
  virtual void save_optimizer(optim::Optimizer& optimizer, const std::string& dir, const SaveOptions& options) = 0;
  virtual void load_optimizer(optim::Optimizer& optimizer, const std::string& dir) = 0;
  // Joins background saves; rethrows their error (on every rank).
  virtual void wait_for_saves() {}
};

class Plugin {
 public:
  virtual ~Plugin() = default;
  virtual std::string name() const = 0;
  // Precisions this plugin accepts ("fp32", "bf16", "fp16").
  virtual std::vector<std::string> supported_precisions() const = 0;
  // True when the plugin places the model itself (Gemini, ...); else the
  // Booster moves it to the cluster's device.
  virtual bool control_device() const { return false; }
  // True when the plugin handles mixed precision itself (ZeRO: fp32 master
  // shards); else the Booster wraps the optimizer with master weights.
  virtual bool control_precision() const { return false; }
  // Whether a step runs through Booster::execute_pipeline (pipeline stages)
  // rather than forward + backward.
  virtual bool pipeline_parallel() const { return false; }
  // Whether every rank holds the whole model, so one rank alone can run a
  // forward (rank 0's sample at the end of training); false when parameters
  // are split over ranks (tensor or pipeline parallel, Gemini's chunks).
  virtual bool holds_whole_model() const { return true; }
  // The data-parallel group: the dataloader shards by it, logs count it.
  virtual cluster::ProcessGroupPtr dp_group() const = 0;
  // The ranks over which gradients are partitioned when the optimizer steps
  // (each holds a disjoint part of one whole), so the Booster's gradient norm
  // is summed and its fp16 overflow flag OR-ed over them. Null (the default,
  // DDP) when every rank holds the same whole gradients: after DDP's
  // all-reduce they are identical, so each rank's local norm and overflow
  // check already give the global answer and no collective is needed.
  virtual cluster::ProcessGroupPtr grad_partition_group() const { return nullptr; }

  // A lazy model (built on the meta device) is given with the source of its
  // values. A plugin that keeps only part of each rank's model (tp slices,
  // pipeline stages, ZeRO buckets, Gemini chunks) takes the source and reads
  // just that part onto `device` in wrap_model / wrap_optimizer, returning
  // true; else (the default) the Booster materialises the whole model first.
  virtual bool take_param_source(const models::ParamSource& source, c10::Device device) {
    (void)source;
    (void)device;
    return false;
  }
  virtual std::shared_ptr<ModelWrapper> wrap_model(std::shared_ptr<models::CausalLM> model) = 0;
  // Called after wrap_model: a plugin that shards optimizer state or owns
  // precision (ZeRO: fp32 master shards, clipping over the dp group) returns
  // its own optimizer around `optimizer`. The default returns it unchanged and
  // the Booster adds masters/clipping itself (unless control_precision()).
  virtual std::unique_ptr<optim::Optimizer> wrap_optimizer(ModelWrapper& model,
                                                           std::unique_ptr<optim::Optimizer> optimizer) {
    (void)model;
    return optimizer;
  }
  // Null (the default): the Booster's replicated IO, where dp rank 0 writes
  // the whole model and optimizer state.
  virtual PluginCheckpointIO* checkpoint_io() { return nullptr; }
};

}  // namespace colossus::booster
