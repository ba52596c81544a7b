// MoeHybridParallelPlugin: options, the mesh, model wrapping (expert sharding,
// tp sharding and pipeline stages, the zero_stage 0 reducers, the bf16/fp16
// cast) and optimizer wrapping (pruning to this rank's parameters, then
// clipping + masters or ZeRO).
#include "colossus/moe/moe_hybrid_parallel_plugin.h"

#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/booster/tp_clip_optimizer.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/moe/expert_parallel.h"
#include "colossus/moe/router_loss_carry.h"
#include "colossus/moe/shard_experts.h"
#include "colossus/parallel/plan/plan.h"
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

// Casts the floating parameters (set_data: the optimizer's handles follow)
// and buffers to the precision's dtype; returns the fp32 values before the
// cast, by named_parameters order (empty for fp32).
std::vector<at::Tensor> cast_to_precision(models::CausalLM& model, const std::string& precision) {
  std::vector<at::Tensor> originals;
  if (precision == "fp32") return originals;
  const auto dtype = dtype_of(precision);
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    at::Tensor& p = item.value();
    originals.push_back(p.detach().clone());
    if (at::isFloatingType(p.scalar_type())) p.set_data(p.detach().to(dtype));
  }
  cast_floating_buffers(model, dtype);
  return originals;
}

}  // namespace

booster::HybridParallelPluginOptions MoeHybridParallelPluginOptions::hybrid_options() const {
  booster::HybridParallelPluginOptions options{.tp_size = static_cast<int>(tp_size),
                                              .pp_size = static_cast<int>(pp_size),
                                              .pp_style = pp_style,
                                              .num_model_chunks = num_model_chunks,
                                              .num_microbatches = num_microbatches,
                                              .microbatch_size = microbatch_size,
                                              .num_layers_per_stage = num_layers_per_stage,
                                              .overlap_p2p = overlap_p2p,
                                              .precision = precision,
                                              .max_norm = max_norm,
                                              .norm_type = norm_type,
                                              .loss_scaler = loss_scaler,
                                              .make_vocab_size_divisible_by = make_vocab_size_divisible_by,
                                              .bucket_cap_mb = bucket_cap_mb};
  options.gradient_checkpointing_ratio = gradient_checkpointing_ratio;
  return options;
}

void MoeHybridParallelPluginOptions::validate() const {
  if (!(gradient_checkpointing_ratio >= 0.0 && gradient_checkpointing_ratio <= 1.0)) {
    throw ConfigError(fmt::format("moe_hybrid_parallel.gradient_checkpointing_ratio = {} must be in [0, 1]; use 1.0 "
                                  "(every block) or 0 (off)",
                                  gradient_checkpointing_ratio));
  }
  if (tp_size < 1) {
    throw ConfigError(fmt::format("moe_hybrid_parallel.tp_size is {} but must be >= 1, e.g. 1 or 2", tp_size));
  }
  if (pp_size < 1) {
    throw ConfigError(fmt::format("moe_hybrid_parallel.pp_size is {} but must be >= 1, e.g. 1 or 2", pp_size));
  }
  if (pp_size > 1 && zero_stage == 2) {
    // As HybridParallelPlugin: the microbatches' backwards interleave, so the
    // gradients are reduced once per schedule and stage 2 would save nothing.
    throw ConfigError(
        fmt::format("moe_hybrid_parallel.zero_stage is 2 with pp_size = {}: a pipeline reduces gradients once per "
                    "schedule, so they cannot be sharded while backward runs; use zero_stage = 1 with pp_size > 1, "
                    "or zero_stage = 2 with pp_size = 1 (any tp_size)",
                    pp_size));
  }
  if (pp_size > 1) {
    try {
      booster::validate_pipeline_options(hybrid_options());
    } catch (const ConfigError& e) {
      // Its messages name hybrid_parallel's keys, which are ours too.
      throw ConfigError(fmt::format("moe_hybrid_parallel: {}", e.what()));
    }
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
                                               const MoeHybridParallelPluginOptions& options,
                                               std::shared_ptr<booster::HybridParallelModel> tp_pp)
    : model_(std::move(model)),
      tp_pp_(std::move(tp_pp)),
      dp_group_(std::move(dp_group)),
      ep_group_(std::move(ep_group)),
      moe_dp_group_(std::move(moe_dp_group)) {
  if (tp_pp_) {
    // Broadcast, expert sharding, tp sharding and the cast are done; the
    // HybridParallelModel's reducer (over a group of one) stays off.
    tp_pp_->set_grad_sync(false);
    // With a pipeline, gradients are averaged once after each schedule; with
    // ZeRO its shard groups reduce them.
    if (tp_pp_->pipeline() || options.zero_stage > 0) return;
  } else {
    // Every rank starts from rank 0's values, then keeps its experts.
    booster::broadcast_tensors(model_->parameters(), *dp_group_);
    shard_experts(*model_, ep_group_);
    if (options.gradient_checkpointing_ratio > 0.0) {
      models::enable_activation_checkpointing(*model_, options.gradient_checkpointing_ratio);
    }
    // ZeRO casts into its flat buffers itself and reduces from its own hooks.
    if (options.zero_stage > 0) return;
    fp32_originals = cast_to_precision(*model_, options.precision);
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

void MoeHybridParallelModel::wait_for_params() const {
  if (auto optimizer = attached_optimizer()) optimizer->wait_for_params();
}

at::Tensor MoeHybridParallelModel::forward(const at::Tensor& input_ids, const models::TokenLayout& layout) {
  // The router losses would count padding as routed tokens (transformers
  // weighs them by the attention mask); until they do, padded and packed
  // rows are refused here.
  if (!layout.empty()) {
    throw ConfigError("moe_hybrid_parallel: padded or packed rows (a TokenLayout) are not supported yet; train MoE "
                      "models on unpadded causal rows (data.packing off, equal-length sequences)");
  }
  if (tp_pp_) return tp_pp_->forward(input_ids);
  wait_for_params();
  return model_->forward(input_ids);
}

at::Tensor MoeHybridParallelModel::loss(const at::Tensor& logits, const at::Tensor& labels,
                                        std::optional<int64_t> num_items) {
  // Under a pipeline the last stage holds only its layers' router logits; the
  // schedule adds the router losses from the carried statistics instead.
  if (tp_pp_ && tp_pp_->pipeline()) return tp_pp_->loss(logits, labels, num_items);
  if (tp_pp_) return model_->add_router_losses(tp_pp_->loss(logits, labels, num_items));
  return model_->moe_loss(logits, labels, num_items);
}

void MoeHybridParallelModel::set_grad_sync(bool enabled) {
  if (dense_reducer_) dense_reducer_->set_sync_enabled(enabled);
  if (expert_reducer_) expert_reducer_->set_sync_enabled(enabled);
  if (auto optimizer = attached_optimizer()) optimizer->set_grad_sync(enabled);
}

booster::PipelineOutput MoeHybridParallelModel::execute_pipeline(
    const booster::PipelineBatch& batch, const booster::PipelineCriterion& criterion,
    const std::function<at::Tensor(const at::Tensor&)>& scale_loss, bool return_loss, bool return_outputs) {
  if (!tp_pp_ || !tp_pp_->pipeline()) {
    throw ConfigError(
        "execute_pipeline: this MoeHybridParallelPlugin has pp_size = 1; use forward + loss + booster.backward, "
        "or pp_size > 1");
  }
  booster::PipelineOutput out = tp_pp_->execute_pipeline(batch, criterion, scale_loss, return_loss, return_outputs);
  // ZeRO: the pipeline handed the gradients to its shard groups already.
  if (zero_after_schedule_) return out;
  // This stage's gradients (other stages' parameters are empty): the dense
  // ones averaged over dp, an expert's over moe_dp; an expert's gradient
  // already sums the ep group's tokens (the all-to-all's backward), so 1/ep
  // makes it the average over dp. Names in the same order on every rank of a
  // group (the experts' are the same within moe_dp).
  std::vector<at::Tensor> dense, experts;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    const at::Tensor& grad = item.value().grad();
    if (!grad.defined() || item.value().numel() == 0) continue;
    (is_expert_parameter(item.key()) ? experts : dense).push_back(grad);
  }
  booster::average_gradients(dense, *dp_group_);
  booster::average_gradients(experts, *moe_dp_group_);
  const double ep = static_cast<double>(ep_group_->size());
  if (ep > 1) {
    at::NoGradGuard no_grad;
    for (auto& grad : experts) grad.div_(ep);
  }
  return out;
}

MoeHybridParallelPlugin::MoeHybridParallelPlugin(MoeHybridParallelPluginOptions options, cluster::ProcessGroupPtr world)
    : options_(std::move(options)), world_(world ? std::move(world) : cluster::current_cluster().world) {
  options_.validate();
  const int64_t w = world_->size(), tp = options_.tp_size, pp = options_.pp_size;
  if (w % (tp * pp) != 0) {
    throw ConfigError(
        fmt::format("moe_hybrid_parallel: tp_size = {} x pp_size = {} does not divide the {} ranks; use sizes "
                    "whose product divides {} (e.g. tp_size = 2, pp_size = 1)",
                    tp, pp, w, w));
  }
  const int64_t dp = w / (tp * pp);
  if (dp % options_.ep_size != 0) {
    throw ConfigError(
        has_tp_pp() ? fmt::format("moe_hybrid_parallel.ep_size is {} but must divide the dp size {} (world size {} "
                                  "/ tp_size {} / pp_size {}); use an ep_size dividing {}",
                                  options_.ep_size, dp, w, tp, pp, dp)
                    : fmt::format("moe_hybrid_parallel.ep_size is {} but must divide the dp size (world size "
                                  "{}); use an ep_size dividing {} (e.g. 1), or run on a multiple of {} ranks",
                                  options_.ep_size, w, w, options_.ep_size));
  }
  const int moe_dp = static_cast<int>(dp / options_.ep_size), ep = static_cast<int>(options_.ep_size);
  cluster::MeshAxes axes = options_.moe_dp_outside ? cluster::MeshAxes{{"moe_dp", moe_dp}, {"ep", ep}}
                                                   : cluster::MeshAxes{{"ep", ep}, {"moe_dp", moe_dp}};
  // As HybridParallelPlugin's (dp, pp, tp): pp inside dp, tp innermost (a tp
  // group's ranks adjacent); only when used, so tp = pp = 1 keeps the mesh.
  if (pp > 1) axes.push_back({"pp", static_cast<int>(pp)});
  if (tp > 1) axes.push_back({"tp", static_cast<int>(tp)});
  // The mesh lays out a copy of the world: an axis spanning every rank may be
  // the root group itself, and the experts' reducer, the dispatch all-to-all
  // and the dense reducer (on world_) must each own their communicator, or
  // their interleaved collectives would mismatch across ranks.
  auto layout_root = world_->split(0, world_->rank(), "moe_hybrid_parallel");
  mesh_ = std::make_unique<cluster::ProcessGroupMesh>(layout_root, std::move(axes));
  norm_group_ = world_->split(0, world_->rank(), "moe_hybrid_parallel_norm");
  // The multi-axis group dp_group() hands out, created here (a collective
  // split), so no getter makes a hidden collective.
  std::vector<std::vector<std::string>> multi_axis;
  if (has_tp_pp()) multi_axis.push_back({"moe_dp", "ep"});
  if (tp > 1 && pp > 1) multi_axis.push_back({"pp", "tp"});
  mesh_->create_groups_and_seal(multi_axis);
  if (has_tp_pp()) {
    self_group_ = world_->split(world_->rank(), 0, "moe_hybrid_parallel_self");
  }
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
  std::shared_ptr<MoeHybridParallelModel> wrapped;
  if (has_tp_pp()) {
    wrapped = wrap_tp_pp(std::move(mixtral));
  } else {
    // The dense reducer (or ZeRO's dense buckets) gets its own communicator too.
    auto dense_group = world_->split(0, world_->rank(), "moe_hybrid_parallel_dense");
    wrapped = std::make_shared<MoeHybridParallelModel>(std::move(mixtral), dense_group, ep_group(), moe_dp_group(),
                                                       options_);
  }
  boosted_.set(wrapped);
  return wrapped;
}

std::shared_ptr<MoeHybridParallelModel> MoeHybridParallelPlugin::wrap_tp_pp(
    std::shared_ptr<models::MixtralForCausalLM> mixtral) {
  // As HybridParallelPlugin::wrap_model: rank 0's full weights everywhere,
  // then this rank's experts, its tp slices, its pipeline stage, the cast.
  booster::broadcast_tensors(mixtral->parameters(), *world_);
  shard_experts(*mixtral, ep_group());
  auto tp = tp_group() ? tp_group() : self_group_;
  auto sharded = parallel::plan::shard_model(
      *mixtral, parallel::plan::mixtral_plan(), tp,
      parallel::plan::ShardOptions{.make_vocab_size_divisible_by = options_.make_vocab_size_divisible_by});
  // After sharding, so the wrappers adopt this rank's experts and tp layers.
  if (options_.gradient_checkpointing_ratio > 0.0) {
    models::enable_activation_checkpointing(*mixtral, options_.gradient_checkpointing_ratio);
  }
  std::unique_ptr<booster::HybridPipeline> pipeline;
  if (options_.pp_size > 1) {
    // grad_group null: this plugin averages dense and expert gradients itself.
    pipeline = std::make_unique<booster::HybridPipeline>(*mixtral, pp_group(), nullptr,
                                                         booster::pipeline_options_of(options_.hybrid_options()));
  }
  fp32_originals_ = cast_to_precision(*mixtral, options_.precision);
  auto tp_pp = std::make_shared<booster::HybridParallelModel>(mixtral, std::move(sharded), self_group_,
                                                              /*parallel_output=*/true, options_.bucket_cap_mb);
  if (pipeline) {
    tp_pp->attach_pipeline(std::move(pipeline));
    // Every stage's router statistics ride with the hidden state to the last
    // stage, which adds the losses (router_loss_carry.h).
    if (mixtral->has_router_losses()) tp_pp->set_pipeline_carry(router_loss_carry(*mixtral));
  }
  // The dense reducer gets a communicator of its own (see the constructor).
  auto dp_dense = dp_group()->split(0, dp_group()->rank(), "moe_hybrid_parallel_dense_dp");
  return std::make_shared<MoeHybridParallelModel>(std::move(mixtral), dp_dense, ep_group(), moe_dp_group(), options_,
                                                  std::move(tp_pp));
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
    std::vector<int64_t> norm_replicas;
    for (const auto& [name, p] : named) {
      group_of.push_back(is_expert_parameter(name) ? 1 : 0);
      // tp: a replicated element (norms, router, experts) is held by every
      // tp rank; the norm over tp x pp counts it once.
      norm_replicas.push_back(moe->tp_pp() ? moe->tp_pp()->sharded().replicas(name) : 1);
    }
    if (moe->tp_pp()) {
      // Before ZeRO sets its gradient hooks: a reducer's destructor clears
      // whatever hook its parameters hold.
      moe->tp_pp()->release_grad_reducers();
      // bf16/fp16: back to the exact fp32 values, which ZeRO takes as masters
      // before casting again (as without tp/pp, where nothing was cast).
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < named.size() && i < fp32_originals_.size(); ++i) {
        if (at::isFloatingType(named[i].second.scalar_type())) named[i].second.set_data(fp32_originals_[i]);
      }
      fp32_originals_.clear();
    }
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
            .overlap_communication = options_.overlap_communication,
            // Slices over tp and stages over pp hold different gradients.
            .model_parallel_group = model_parallel_group(),
            .norm_replicas = std::move(norm_replicas)});
    cast_floating_buffers(moe->unwrap(), dtype_of(options_.precision));
    if (auto* tp_pp = moe->tp_pp(); tp_pp && tp_pp->pipeline()) {
      // Microbatch backwards interleave: gradients accumulate and go to the
      // shard groups once after each schedule.
      zero->set_grad_sync(false);
      tp_pp->pipeline()->set_zero_optimizer(zero.get());
      moe->reduce_after_schedule_by_zero();
    }
    return zero;
  }

  // Dense elements are held by every dp rank, an expert's by its moe_dp ranks,
  // and both by every tp rank unless tp-sharded (pp stages hold disjoint
  // parts): weighting by 1/replicas over the whole world counts each element
  // once.
  const std::vector<at::Tensor>& fp32_originals = moe->tp_pp() ? fp32_originals_ : moe->fp32_originals;
  const int64_t dp = dp_group()->size();
  std::vector<int64_t> replicas;
  std::vector<at::Tensor> originals;
  for (const auto& group : optimizer->param_groups()) {
    for (const auto& p : group.params) {
      const size_t index = index_of.at(p.unsafeGetTensorImpl());
      const std::string& name = named[index].first;
      const int64_t tp_replicas = moe->tp_pp() ? moe->tp_pp()->sharded().replicas(name) : 1;
      replicas.push_back((is_expert_parameter(name) ? moe_dp : dp) * tp_replicas);
      if (!fp32_originals.empty()) originals.push_back(fp32_originals[index]);
    }
  }
  // Expert gradients differ across ep ranks, slices across tp, stages across
  // pp: the norm and the overflow flag are reduced over the whole world.
  auto wrapped = booster::wrap_clip_and_masters(std::move(optimizer),
                                                booster::ClipAndMastersOptions{.precision = options_.precision,
                                                                               .loss_scaler = options_.loss_scaler,
                                                                               .max_norm = options_.max_norm,
                                                                               .norm_type = options_.norm_type,
                                                                               .replicas = std::move(replicas),
                                                                               .norm_group = norm_group_,
                                                                               .originals = std::move(originals)});
  moe->fp32_originals.clear();
  fp32_originals_.clear();
  return std::move(wrapped.optimizer);
}

}  // namespace colossus::moe
