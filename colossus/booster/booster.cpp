// The Booster's options, boost() (device, precision, optimizer wrapping,
// plugin wrapping, scheduler rebinding) and the training-step helpers. The
// collective checkpoint functions live in booster_checkpoint.cpp.
#include "colossus/booster/booster.h"
#include "colossus/lora/inject.h"

#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster_impl.h"
#include "colossus/booster/clip_grad_optimizer.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/core/precision.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

namespace colossus::booster {

namespace {

const std::vector<std::string> kPrecisions = {"fp32", "bf16", "fp16"};

amp::NormReducer norm_reducer_over(const cluster::ProcessGroupPtr& group) {
  if (!group || group->size() == 1) return {};
  return [group](const at::Tensor& local, double norm_type) {
    at::Tensor total = local.clone();
    group->all_reduce(total, std::isinf(norm_type) ? cluster::ReduceOp::Max : cluster::ReduceOp::Sum).wait();
    return total;
  };
}

std::function<bool(bool)> overflow_reducer_over(const cluster::ProcessGroupPtr& group) {
  if (!group || group->size() == 1) return {};
  return [group](bool local_overflow) {
    return group->all_reduce_scalar(local_overflow ? 1.0 : 0.0, cluster::ReduceOp::Max) > 0.0;
  };
}

// Casts floating parameters and buffers in place (set_data keeps every handle
// to them, the optimizer's included, pointing at the cast tensor).
void cast_floating(models::CausalLM& model, c10::ScalarType dtype) {
  at::NoGradGuard no_grad;
  auto cast = [&](at::Tensor& t) {
    if (at::isFloatingType(t.scalar_type()) && t.scalar_type() != dtype) t.set_data(t.detach().to(dtype));
  };
  for (auto& item : model.named_parameters(/*recurse=*/true)) cast(item.value());
  for (auto& item : model.named_buffers(/*recurse=*/true)) cast(item.value());
}

void check_optimizer_holds_model(const models::CausalLM& model, const optim::Optimizer& optimizer) {
  std::unordered_set<const c10::TensorImpl*> owned;
  for (const auto& p : model.parameters(/*recurse=*/true)) owned.insert(p.unsafeGetTensorImpl());
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      if (!owned.contains(groups[g].params[i].unsafeGetTensorImpl())) {
        throw ConfigError(
            fmt::format("Booster::boost: parameter {} of {}'s param group {} is not a parameter of the "
                        "model; build the optimizer on model->parameters() of the model being boosted",
                        i, optimizer.name(), g));
      }
    }
  }
}

// Every master from its (already rank-consistent) model parameter.
void reset_masters_from_params(amp::MixedPrecisionOptimizer& optimizer) {
  at::NoGradGuard no_grad;
  size_t flat = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params) {
      const at::Tensor& master = optimizer.master_params()[flat++];
      if (!master.is_same(param)) master.copy_(param);
    }
  }
}

// Every master from the source's values of its parameter (a lazy model
// materialised in bf16/fp16: the masters keep the source's full precision).
void masters_from_source(amp::MixedPrecisionOptimizer& optimizer, const models::CausalLM& model,
                         const models::ParamSource& source) {
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) names[item.value().unsafeGetTensorImpl()] = item.key();
  at::NoGradGuard no_grad;
  size_t flat = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params) {
      const at::Tensor& master = optimizer.master_params()[flat++];
      if (master.is_same(param)) continue;
      master.copy_(source(names.at(param.unsafeGetTensorImpl()), param));
    }
  }
}

}  // namespace

void BoosterOptions::validate() const {
  if (std::find(kPrecisions.begin(), kPrecisions.end(), mixed_precision) == kPrecisions.end()) {
    throw ConfigError(fmt::format("booster: mixed_precision='{}' is unknown; use one of {}", mixed_precision,
                                  fmt::join(kPrecisions, ", ")));
  }
  if (!(max_norm >= 0.0) || !std::isfinite(max_norm)) {
    throw ConfigError(
        fmt::format("booster: max_norm={} is invalid; use 0 (no clipping) or a positive norm, e.g. 1.0", max_norm));
  }
  if (!(norm_type > 0.0)) {
    throw ConfigError(fmt::format("booster: norm_type={} is invalid; use 2 or infinity", norm_type));
  }
  if (mixed_precision == "fp16") loss_scaler.validate();
}

Booster::Booster(std::shared_ptr<Plugin> plugin, BoosterOptions options)
    : plugin_(std::move(plugin)), options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  if (!plugin_) throw ConfigError("Booster: the plugin is null; pass e.g. std::make_shared<DDPPlugin>()");
  options_.validate();
  std::vector<std::string> controlled, ignored;
  if (plugin_->control_precision()) {
    if (options_.mixed_precision != "fp32") {
      controlled.push_back("precision");
      ignored.push_back(fmt::format("mixed_precision='{}'", options_.mixed_precision));
    }
  } else {
    const auto supported = plugin_->supported_precisions();
    if (std::find(supported.begin(), supported.end(), options_.mixed_precision) == supported.end()) {
      throw ConfigError(fmt::format("booster: plugin '{}' does not support mixed_precision='{}'; it supports {}",
                                    plugin_->name(), options_.mixed_precision, fmt::join(supported, ", ")));
    }
  }
  if (plugin_->control_device() && options_.device) {
    controlled.push_back("device");
    ignored.push_back(fmt::format("device={}", options_.device->str()));
  }
  // One line, on rank 0: the same on every rank, and a config mistake, not a failure.
  if (!ignored.empty()) {
    impl_->log.warning(
        fmt::format("plugin '{}' controls the {}; ignoring the booster's {} (set it in the plugin's "
                    "options instead)",
                    plugin_->name(), fmt::join(controlled, " and "), fmt::join(ignored, " and ")));
  }
}

Booster::~Booster() {
  for (auto* writer : {&impl_->model_writer, &impl_->optimizer_writer}) {
    try {
      writer->wait();
    } catch (const std::exception& e) {
      impl_->log.error(fmt::format("an asynchronous checkpoint save failed and nobody waited for it: {}", e.what()));
    }
  }
}

c10::Device Booster::device() const {
  if (options_.device && !plugin_->control_device()) return *options_.device;
  try {
    return cluster::current_cluster().device;
  } catch (const DistError&) {
    return c10::Device(c10::kCPU);  // not launched: a single CPU process
  }
}

Boosted Booster::boost(std::shared_ptr<models::CausalLM> model, std::unique_ptr<optim::Optimizer> optimizer,
                       std::shared_ptr<optim::LRScheduler> lr_scheduler, std::shared_ptr<data::DataLoader> dataloader,
                       const models::ParamSource& param_source) {
  if (!model) throw ConfigError("Booster::boost: the model is null");
  if (!optimizer) throw ConfigError("Booster::boost: the optimizer is null; pass e.g. std::make_unique<AdamW>(...)");
  check_optimizer_holds_model(*model, *optimizer);
  if (!optimizer->state_dict().tensors.empty()) {
    throw ConfigError(
        fmt::format("Booster::boost: {} has already stepped; boost it before its first step "
                    "(load a checkpoint with load_optimizer after boosting)",
                    optimizer->name()));
  }
  const bool own_precision = !plugin_->control_precision();
  const bool own_mixed = own_precision && options_.mixed_precision != "fp32";
  const auto working_dtype =
      own_mixed ? scalar_type_of(parse_precision(options_.mixed_precision, "booster: mixed_precision")) : at::kFloat;
  // A lazy model read whole here: straight into the working dtype on the
  // device, one parameter at a time; the masters then come from the source.
  bool materialized_here = false, taken_by_plugin = false;
  if (models::is_lazy(*model)) {
    if (!param_source) {
      throw ConfigError(
          "Booster::boost: the model is on the meta device (lazy init) but no param_source says where its values "
          "come from; pass models::checkpoint_source(model, dir) or models::seeded_source(model, seed)");
    }
    taken_by_plugin = plugin_->take_param_source(param_source, device());
    if (!taken_by_plugin) {
      models::materialize(*model, param_source, plugin_->control_device() ? c10::Device(c10::kCPU) : device(),
                          working_dtype);
      materialized_here = true;
    }
  }
  // (A model the plugin materialises is still on the meta device here.)
  if (!plugin_->control_device() && !taken_by_plugin) model->to(device());

  std::shared_ptr<optim::Optimizer> boosted_optimizer;
  std::shared_ptr<amp::MixedPrecisionOptimizer> mixed;
  const auto partition = plugin_->grad_partition_group();
  if (own_mixed) {
    // The masters must start at the exact fp32 values, not their bf16/fp16
    // rounding: keep the originals (in the optimizer's flat order) across the
    // cast, or read them from the source of a lazy model.
    std::vector<at::Tensor> originals;
    if (!materialized_here) {
      for (const auto& group : optimizer->param_groups()) {
        for (const auto& param : group.params) originals.push_back(param.detach().clone());
      }
    }
    cast_floating(*model, working_dtype);
    mixed = std::make_shared<amp::MixedPrecisionOptimizer>(
        std::move(optimizer), amp::MixedPrecisionOptions{.precision = options_.mixed_precision,
                                                         .loss_scaler = options_.loss_scaler,
                                                         .max_norm = options_.max_norm,
                                                         .norm_type = options_.norm_type,
                                                         .norm_reducer = norm_reducer_over(partition),
                                                         .overflow_reducer = overflow_reducer_over(partition)});
    if (materialized_here) {
      masters_from_source(*mixed, *model, param_source);
    } else {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < originals.size(); ++i) mixed->master_params()[i].copy_(originals[i]);
    }
    boosted_optimizer = mixed;
  } else if (own_precision && options_.max_norm > 0.0) {
    boosted_optimizer = std::make_shared<ClipGradOptimizer>(
        std::move(optimizer), ClipGradOptions{.max_norm = options_.max_norm,
                                              .norm_type = options_.norm_type,
                                              .norm_reducer = norm_reducer_over(partition)});
  }

  auto wrapped = plugin_->wrap_model(model);
  // Plugins that shard optimizer state or own precision wrap it themselves.
  if (!boosted_optimizer) boosted_optimizer = plugin_->wrap_optimizer(*wrapped, std::move(optimizer));
  if (mixed) {
    // Wrapping may overwrite parameters (DDP broadcasts rank 0's), leaving a
    // rank's masters behind. If that happened on any rank, all ranks restart
    // their masters from the (now identical) parameters, so they cannot drift.
    int64_t changed = mixed->follow_parameters();
    if (auto group = plugin_->dp_group()) {
      changed = static_cast<int64_t>(group->all_reduce_scalar(static_cast<double>(changed), cluster::ReduceOp::Sum));
    }
    if (changed > 0) {
      reset_masters_from_params(*mixed);
      impl_->log.warning(
          fmt::format("plugin '{}' changed {} parameter(s) while wrapping the model (ranks built "
                      "different weights?); the fp32 masters start from the {} values instead of "
                      "the fp32 originals. Build the model with the same seed on every rank.",
                      plugin_->name(), changed, options_.mixed_precision));
    }
  }
  // Loading weights into the model later moves the optimizer's own copies too.
  wrapped->attach_optimizer(boosted_optimizer);
  if (lr_scheduler) lr_scheduler->attach(*boosted_optimizer);
  return Boosted{.model = std::move(wrapped),
                 .optimizer = std::move(boosted_optimizer),
                 .lr_scheduler = std::move(lr_scheduler),
                 .dataloader = std::move(dataloader)};
}

lora::LoraConfig Booster::enable_lora(models::CausalLM& model, const lora::LoraConfig& config, uint64_t seed) {
  if (plugin_->name() == "hybrid_parallel")
    throw ConfigError("LoRA runs under plugin ddp, low_level_zero or gemini for now, not hybrid_parallel (the "
                      "tensor-parallel sharder does not split adapters yet)");
  return lora::apply_lora(model, config, seed);
}

std::shared_ptr<data::DataLoader> Booster::prepare_dataloader(std::shared_ptr<const data::TokenDataset> dataset,
                                                              data::DataLoaderOptions options, uint64_t seed,
                                                              bool shuffle) {
  if (!dataset) throw ConfigError("Booster::prepare_dataloader: the dataset is null");
  const auto group = plugin_->dp_group();
  data::DistributedSampler sampler(dataset->size(), {.rank = group ? group->rank() : 0,
                                                     .world_size = group ? group->size() : 1,
                                                     .shuffle = shuffle,
                                                     .seed = seed,
                                                     .drop_last = true});
  return std::make_shared<data::DataLoader>(std::move(dataset), std::move(sampler), options);
}

void Booster::backward(const at::Tensor& loss, optim::Optimizer& optimizer) {
  optimizer.scale_loss(loss).backward();
}

PipelineOutput Booster::execute_pipeline(const PipelineDataIter& data_iter, ModelWrapper& model,
                                         const PipelineCriterion& criterion, optim::Optimizer& optimizer,
                                         bool return_loss, bool return_outputs) {
  if (!data_iter) throw ConfigError("Booster::execute_pipeline: data_iter is empty; pass a function yielding batches");
  const PipelineBatch batch = data_iter();
  const auto scale_loss = [&optimizer](const at::Tensor& loss) { return optimizer.scale_loss(loss); };
  return model.execute_pipeline(batch, criterion, scale_loss, return_loss, return_outputs);
}

void ModelWrapper::parameters_changed() {
  if (auto optimizer = optimizer_.lock()) optimizer->follow_parameters();
}

PipelineOutput ModelWrapper::execute_pipeline(const PipelineBatch&, const PipelineCriterion&,
                                              const std::function<at::Tensor(const at::Tensor&)>&, bool, bool) {
  throw ConfigError(
      "execute_pipeline: this model is not pipeline-parallel; use HybridParallelPlugin with pp_size > 1, or "
      "forward + loss + booster.backward");
}

Booster::NoSyncGuard::NoSyncGuard(ModelWrapper& model) : model_(model) { model_.set_grad_sync(false); }

Booster::NoSyncGuard::~NoSyncGuard() { model_.set_grad_sync(true); }

}  // namespace colossus::booster
