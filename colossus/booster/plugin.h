// The Plugin interface: a plugin decides how a model, its optimizer and its
// data are laid out over ranks (DDP, ZeRO, hybrid parallel...). The Booster
// asks what the plugin controls and defers to it; what the plugin does not
// control (precision, device) the Booster handles itself.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/models/causal_lm.h"
#include "colossus/optim/optimizer.h"

#include <memory>
#include <string>
#include <vector>

namespace colossus::booster {

// A boosted model: forward through the plugin's wrapping (gradient hooks,
// sharding...), with the plain model underneath.
class ModelWrapper {
 public:
  virtual ~ModelWrapper() = default;
  // input_ids: (B, T) int64 -> logits (B, T, V)
  virtual at::Tensor forward(const at::Tensor& input_ids) = 0;
  virtual models::CausalLM& unwrap() = 0;
  // Gradient accumulation: while a guard is alive, backward does not
  // synchronise gradients across ranks.
  virtual void set_grad_sync(bool enabled) = 0;
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
  // The data-parallel group: the dataloader shards by it, logs count it.
  virtual cluster::ProcessGroupPtr dp_group() const = 0;
  // The ranks over which gradients are partitioned when the optimizer steps
  // (each holds a disjoint part of one whole), so the Booster's gradient norm
  // is summed and its fp16 overflow flag OR-ed over them. Null (the default,
  // DDP) when every rank holds the same whole gradients: after DDP's
  // all-reduce they are identical, so each rank's local norm and overflow
  // check already give the global answer and no collective is needed.
  virtual cluster::ProcessGroupPtr grad_partition_group() const { return nullptr; }

  virtual std::shared_ptr<ModelWrapper> wrap_model(std::shared_ptr<models::CausalLM> model) = 0;
};

}  // namespace colossus::booster
