// MoeHybridParallelPlugin: options, the mesh, model wrapping (expert sharding,
// the zero_stage 0 reducers, the bf16/fp16 cast) and optimizer wrapping
// (pruning to this rank's parameters, then clipping + masters or ZeRO).
#include "colossus/moe/moe_hybrid_parallel_plugin.h"

#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/booster/tp_clip_optimizer.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/moe/expert_parallel.h"
#include "colossus/moe/shard_experts.h"
#include "colossus/zero/low_level/low_level_zero_optimizer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace colossus::moe {

namespace {

c10::ScalarType dtype_of(const std::string& precision) {
  return precision == "bf16" ? at::kBFloat16 : precision == "fp16" ? at::kHalf : at::kFloat;
}

void cast_floating_buffers(models::CausalLM& model, c10::ScalarType dtype) {
  at::NoGradGuard no_grad;
  for (auto& item : model.named_buffers(/*recurse=*/true)) {
    at::Tensor& buffer = item.value();
    if (at::isFloatingType(buffer.scalar_type()) && buffer.scalar_type() != dtype) buffer.set_data(buffer.to(dtype));
  }
}

}  // namespace

void MoeHybridParallelPluginOptions::validate() const {
  if (tp_size != 1) {
    throw ConfigError(
        fmt::format("moe_hybrid_parallel.tp_size is {} but only 1 has landed "
                    "(the dense attention part is not tensor-parallel "
                    "here yet); use tp_size = 1 with ep_size and zero_stage, "
                    "or HybridParallelPlugin for tp on dense models",
                    tp_size));
  }
  if (pp_size != 1) {
    throw ConfigError(
        fmt::format("moe_hybrid_parallel.pp_size is {} but only 1 has landed "
                    "(no pipeline schedule drives expert-parallel "
                    "blocks yet); use pp_size = 1 with ep_size and zero_stage",
                    pp_size));
  }
  if (ep_size < 1) throw ConfigError(fmt::format("moe_hybrid_parallel.ep_size is {} but must be >= 1", ep_size));
  if (zero_stage < 0 || zero_stage > 2) {
    throw ConfigError(
        fmt::format("moe_hybrid_parallel.zero_stage is {}; use 0 (all-reduce), 1 "
                    "(optimizer state sharded) or 2 (gradients "
                    "too): ZeRO-3 is the gemini plugin, which has no expert parallelism",
                    zero_stage));
  }
  if (precision != "fp32" && precision != "bf16" && precision != "fp16") {
    throw ConfigError(
        fmt::format("moe_hybrid_parallel.precision is '{}'; use 'fp32', 'bf16' "
                    "or 'fp16' (fp32 masters either way)",
                    precision));
  }
  if (!(max_norm >= 0.0) || !std::isfinite(max_norm)) {
    throw ConfigError(
        fmt::format("moe_hybrid_parallel.max_norm is {}; use 0 "
                    "(no clipping) or a positive norm, e.g. 1.0",
                    max_norm));
  }
  if (!(norm_type > 0.0)) {
    throw ConfigError(fmt::format("moe_hybrid_parallel.norm_type is {}; use 2 or infinity", norm_type));
  }
  if (!(bucket_cap_mb > 0)) {
    throw ConfigError(fmt::format("moe_hybrid_parallel.bucket_cap_mb is {} but must be > 0, e.g. 25", bucket_cap_mb));
  }
  if (!(reduce_bucket_size_in_m > 0) || !std::isfinite(reduce_bucket_size_in_m)) {
    throw ConfigError(
        fmt::format("moe_hybrid_parallel.reduce_bucket_size_in_m "
                    "is {} but must be > 0, e.g. 12",
                    reduce_bucket_size_in_m));
  }
  if (precision == "fp16") loss_scaler.validate();
}

MoeHybridParallelModel::MoeHybridParallelModel(std::shared_ptr<models::MixtralForCausalLM> model,
                                               cluster::ProcessGroupPtr dp_group, cluster::ProcessGroupPtr ep_group,
                                               cluster::ProcessGroupPtr moe_dp_group,
                                               const MoeHybridParallelPluginOptions& options)
    : model_(std::move(model)),
      dp_group_(std::move(dp_group)),
      ep_group_(std::move(ep_group)),
      moe_dp_group_(std::move(moe_dp_group)) {
  // Every rank starts from rank 0's values, then keeps its experts.
  booster::broadcast_tensors(model_->parameters(), *dp_group_);
  shard_experts(*model_, ep_group_);
  // ZeRO casts into its flat buffers itself and reduces from its own hooks.
  if (options.zero_stage > 0) return;
  if (options.precision != "fp32") {
    const auto dtype = dtype_of(options.precision);
    at::NoGradGuard no_grad;
    for (auto& item : model_->named_parameters(/*recurse=*/true)) {
      at::Tensor& p = item.value();
      fp32_originals.push_back(p.detach().clone());
      // set_data: the optimizer's handles follow the cast tensor.
      if (at::isFloatingType(p.scalar_type())) p.set_data(p.detach().to(dtype));
    }
    cast_floating_buffers(*model_, dtype);
  }
  booster::GradReducer::NamedParams dense, experts;
  const double ep = static_cast<double>(ep_group_->size());
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (is_expert_parameter(item.key())) {
      // An expert's gradient already sums the ep group's ranks (the
      // all-to-all's backward); averaging over moe_dp then dividing by ep
      // averages over dp.
      at::Tensor p = item.value();
      if (ep > 1) p.register_hook([ep](const at::Tensor& grad) { return grad / ep; });
      experts.emplace_back(item.key(), p);
    } else {
      dense.emplace_back(item.key(), item.value());
    }
  }
  const booster::GradReducerOptions reducer{.bucket_cap_mb = options.bucket_cap_mb, .find_unused_parameters = false};
  dense_reducer_ = std::make_unique<booster::GradReducer>(std::move(dense), dp_group_, reducer);
  expert_reducer_ = std::make_unique<booster::GradReducer>(std::move(experts), moe_dp_group_, reducer);
}

at::Tensor MoeHybridParallelModel::forward(const at::Tensor& input_ids) {
  if (zero_optimizer) zero_optimizer->wait_for_params();
  return model_->forward(input_ids);
}

void MoeHybridParallelModel::set_grad_sync(bool enabled) {
  if (dense_reducer_) dense_reducer_->set_sync_enabled(enabled);
  if (expert_reducer_) expert_reducer_->set_sync_enabled(enabled);
  if (zero_optimizer) zero_optimizer->set_grad_sync(enabled);
}

MoeHybridParallelPlugin::MoeHybridParallelPlugin(MoeHybridParallelPluginOptions options, cluster::ProcessGroupPtr world)
    : options_(std::move(options)), world_(world ? std::move(world) : cluster::current_cluster().world) {
  options_.validate();
  const int64_t w = world_->size();
  if (w % options_.ep_size != 0) {
    throw ConfigError(
        fmt::format("moe_hybrid_parallel.ep_size is {} but must "
                    "divide the dp size (world size {})",
                    options_.ep_size, w));
  }
  const int moe_dp = static_cast<int>(w / options_.ep_size), ep = static_cast<int>(options_.ep_size);
  cluster::MeshAxes axes = options_.moe_dp_outside ? cluster::MeshAxes{{"moe_dp", moe_dp}, {"ep", ep}}
                                                   : cluster::MeshAxes{{"ep", ep}, {"moe_dp", moe_dp}};
  // The mesh lays out a copy of the world: an axis spanning every rank may be
  // the root group itself, and the experts' reducer, the dispatch all-to-all
  // and the dense reducer (on world_) must each own their communicator, or
  // their interleaved collectives would mismatch across ranks.
  auto layout_root = world_->split(0, world_->rank(), "moe_hybrid_parallel");
  mesh_ = std::make_unique<cluster::ProcessGroupMesh>(layout_root, std::move(axes));
  norm_group_ = world_->split(0, world_->rank(), "moe_hybrid_parallel_norm");
  io_ = make_moe_checkpoint_io(*this);
}

MoeHybridParallelPlugin::~MoeHybridParallelPlugin() = default;

std::shared_ptr<booster::ModelWrapper> MoeHybridParallelPlugin::wrap_model(std::shared_ptr<models::CausalLM> model) {
  auto mixtral = std::dynamic_pointer_cast<models::MixtralForCausalLM>(model);
  if (!mixtral) {
    throw ConfigError(
        fmt::format("MoeHybridParallelPlugin needs a Mixtral "
                    "model (model_type mixtral); got {}",
                    model ? models::model_type(model->config()) : std::string("null")));
  }
  validate_ep(mixtral->mixtral_config().num_local_experts, options_.ep_size);
  // The dense reducer (or ZeRO's dense buckets) gets its own communicator too.
  auto dense_group = world_->split(0, world_->rank(), "moe_hybrid_parallel_dense");
  return std::make_shared<MoeHybridParallelModel>(std::move(mixtral), dense_group, ep_group(), moe_dp_group(),
                                                  options_);
}

std::unique_ptr<optim::Optimizer> MoeHybridParallelPlugin::wrap_optimizer(booster::ModelWrapper& model,
                                                                          std::unique_ptr<optim::Optimizer> optimizer) {
  auto* moe = dynamic_cast<MoeHybridParallelModel*>(&model);
  if (!moe)
    throw ConfigError(
        "moe_hybrid_parallel: wrap_optimizer needs the model "
        "this plugin wrapped");
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::unordered_map<const c10::TensorImpl*, size_t> index_of;
  for (const auto& item : moe->unwrap().named_parameters(/*recurse=*/true)) {
    index_of[item.value().unsafeGetTensorImpl()] = named.size();
    named.emplace_back(item.key(), item.value());
  }
  // The optimizer was built on the whole model; shard_experts freed the other
  // ranks' experts, which it must not keep (ZeRO refuses strangers, and their
  // empty state would not load on another layout). Nothing has stepped yet,
  // so no state is indexed by the old positions.
  for (auto& group : optimizer->param_groups()) {
    std::erase_if(group.params, [&](const at::Tensor& p) { return !index_of.contains(p.unsafeGetTensorImpl()); });
  }
  optimizer_param_names_.clear();
  for (const auto& group : optimizer->param_groups()) {
    for (const auto& p : group.params)
      optimizer_param_names_.push_back(named[index_of.at(p.unsafeGetTensorImpl())].first);
  }
  const int64_t ep = ep_group()->size(), moe_dp = moe_dp_group()->size();

  if (options_.zero_stage > 0) {
    std::vector<size_t> group_of;
    for (const auto& [name, p] : named) group_of.push_back(is_expert_parameter(name) ? 1 : 0);
    // Experts' reduce-scatter averages over moe_dp; their gradients already
    // sum the ep group's tokens, so 1/ep makes it the average over dp.
    std::vector<zero::ShardGroup> groups{{.dp_group = moe->dp_group()},
                                         {.dp_group = moe_dp_group(), .grad_scale = 1.0 / static_cast<double>(ep)}};
    auto zero = std::make_unique<zero::LowLevelZeroOptimizer>(
        std::move(optimizer), std::move(named), std::move(groups), std::move(group_of),
        zero::LowLevelZeroOptions{
            .stage = options_.zero_stage,
            .precision = options_.precision,
            .loss_scaler = options_.loss_scaler,
            .max_norm = options_.max_norm,
            .norm_type = options_.norm_type,
            .bucket_numel = std::max<int64_t>(1, static_cast<int64_t>(options_.reduce_bucket_size_in_m * (1 << 20))),
            .overlap_communication = options_.overlap_communication});
    cast_floating_buffers(moe->unwrap(), dtype_of(options_.precision));
    moe->zero_optimizer = zero.get();
    return zero;
  }

  // Dense elements are held by every dp rank, an expert's by its moe_dp ranks:
  // weighting by 1/replicas over the whole world counts each element once.
  std::vector<int64_t> replicas;
  std::vector<at::Tensor> originals;
  for (const auto& group : optimizer->param_groups()) {
    for (const auto& p : group.params) {
      const size_t index = index_of.at(p.unsafeGetTensorImpl());
      replicas.push_back(is_expert_parameter(named[index].first) ? moe_dp : world_->size());
      if (!moe->fp32_originals.empty()) originals.push_back(moe->fp32_originals[index]);
    }
  }
  if (options_.max_norm > 0.0) {
    optimizer = std::make_unique<booster::TPClipOptimizer>(std::move(optimizer),
                                                           booster::TPClipOptions{.max_norm = options_.max_norm,
                                                                                  .norm_type = options_.norm_type,
                                                                                  .replicas = std::move(replicas),
                                                                                  .tp_group = norm_group_});
  }
  if (options_.precision == "fp32") return optimizer;
  // Expert gradients differ across ep ranks: an overflow anywhere skips the
  // step everywhere.
  auto overflow = [group = norm_group_](bool local) {
    if (group->size() == 1) return local;
    at::Tensor flag =
        at::full({1}, local ? 1.0f : 0.0f,
                 at::TensorOptions().device(group->backend_name() == "nccl" ? cluster::current_cluster().device
                                                                            : c10::Device(c10::kCPU)));
    group->all_reduce(flag, cluster::ReduceOp::Max).wait();
    return flag.item<float>() > 0.0f;
  };
  auto mixed = std::make_unique<amp::MixedPrecisionOptimizer>(
      std::move(optimizer),
      amp::MixedPrecisionOptions{
          .precision = options_.precision, .loss_scaler = options_.loss_scaler, .overflow_reducer = overflow});
  // Masters start at the exact fp32 values, not their bf16/fp16 rounding.
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < originals.size(); ++i) mixed->master_params()[i].copy_(originals[i]);
  moe->fp32_originals.clear();
  moe->mixed_optimizer = mixed.get();
  return mixed;
}

}  // namespace colossus::moe
