#include "colossus/booster/hybrid_parallel_plugin.h"

#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/booster/tp_clip_optimizer.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/lora/tensor_parallel.h"
#include "colossus/models/activation_checkpoint.h"
#include "colossus/parallel/tensor/comm.h"
#include "colossus/parallel/tensor/layers.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/full.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <optional>
#include <unordered_map>

namespace colossus::booster {

void HybridParallelPluginOptions::validate() const {
  if (tp_size < 1) throw ConfigError(fmt::format("hybrid_parallel.tp_size = {} must be >= 1", tp_size));
  validate_pipeline_options(*this);
  if (!(gradient_checkpointing_ratio >= 0.0 && gradient_checkpointing_ratio <= 1.0)) {
    throw ConfigError(fmt::format(
        "hybrid_parallel.gradient_checkpointing_ratio = {} must be in [0, 1]; use 1.0 (every block) or 0 (off)",
        gradient_checkpointing_ratio));
  }
  models::parse_checkpoint_granularity(gradient_checkpointing_granularity);  // throws naming the value
  if (gradient_checkpointing_ratio > 0.0 && pp_size > 1 && pp_style == "zero_bubble") {
    throw ConfigError(
        "hybrid_parallel: gradient_checkpointing_ratio > 0 with pp_style 'zero_bubble' is not supported (the rerun "
        "computes weight gradients in B); use pp_style '1f1b' or 'interleaved'");
  }
  if (sp_size < 1) throw ConfigError(fmt::format("hybrid_parallel.sp_size = {} must be >= 1", sp_size));
  if (!enable_sequence_parallelism && (sp_size != 1 || !sequence_parallelism_mode.empty())) {
    throw ConfigError(
        fmt::format("hybrid_parallel: sequence parallelism (sp_size = {}, sequence_parallelism_mode = '{}') needs "
                    "enable_sequence_parallelism = true and mode 'ring_attn' or 'all_to_all'; or use sp_size = 1 "
                    "without a mode",
                    sp_size, sequence_parallelism_mode));
  }
  if (enable_sequence_parallelism) {
    const auto& mode = sequence_parallelism_mode;
    if (mode != "ring_attn" && mode != "all_to_all" && mode != "split_gather" && mode != "ring") {
      throw ConfigError(
          fmt::format("hybrid_parallel.sequence_parallelism_mode = '{}' is unknown; use 'ring_attn', 'all_to_all', "
                      "'split_gather' or 'ring'",
                      mode));
    }
    if (sequence_over_tp()) {
      if (tp_size < 2) {
        throw ConfigError(
            fmt::format("hybrid_parallel.sequence_parallelism_mode = '{}' shards activations over the tensor-parallel "
                        "group, so it needs tp_size > 1 (got {}); use tp_size >= 2, or mode 'ring_attn' / "
                        "'all_to_all' with sp_size",
                        mode, tp_size));
      }
      if (sp_size != 1 && sp_size != tp_size) {
        throw ConfigError(
            fmt::format("hybrid_parallel.sp_size = {}: mode '{}' uses the tp group as its sequence group (as "
                        "Colossal-AI), so sp_size must be 1 or tp_size = {}",
                        sp_size, mode, tp_size));
      }
    }
  }
  if (inner_ring_size != 0) {
    if (!enable_sequence_parallelism || sequence_parallelism_mode != "ring_attn") {
      throw ConfigError(fmt::format(
          "hybrid_parallel.inner_ring_size = {} applies to sequence_parallelism_mode 'ring_attn' only; use 0",
          inner_ring_size));
    }
    if (inner_ring_size < 0 || sp_size % inner_ring_size != 0) {
      throw ConfigError(
          fmt::format("hybrid_parallel.inner_ring_size = {} does not divide sp_size = {}; use a divisor of {} (or 0 "
                      "for one ring)",
                      inner_ring_size, sp_size, sp_size));
    }
  }
  if (zero_stage < 0 || zero_stage > 2) {
    throw ConfigError(fmt::format(
        "hybrid_parallel.zero_stage = {} is unknown; use 0 (all-reduce), 1 (optimizer state sharded over dp) or 2 "
        "(gradients too, without a pipeline)",
        zero_stage));
  }
  if (precision != "fp32" && precision != "bf16" && precision != "fp16") {
    throw ConfigError(fmt::format("hybrid_parallel.precision = '{}' is unknown; use fp32, bf16 or fp16", precision));
  }
  if (!(max_norm >= 0.0) || !std::isfinite(max_norm)) {
    throw ConfigError(
        fmt::format("hybrid_parallel.max_norm = {} is invalid; use 0 (no clipping) or e.g. 1.0", max_norm));
  }
  if (!(norm_type > 0.0))
    throw ConfigError(fmt::format("hybrid_parallel.norm_type = {}; use 2 or infinity", norm_type));
  if (make_vocab_size_divisible_by < 1) {
    throw ConfigError(fmt::format("hybrid_parallel.make_vocab_size_divisible_by = {} must be >= 1 (default 64)",
                                  make_vocab_size_divisible_by));
  }
  if (!(bucket_cap_mb > 0))
    throw ConfigError(fmt::format("hybrid_parallel.bucket_cap_mb = {} must be positive", bucket_cap_mb));
  if (precision == "fp16") loss_scaler.validate();
}

HybridParallelModel::HybridParallelModel(std::shared_ptr<models::CausalLM> model, parallel::plan::ShardedModel sharded,
                                         cluster::ProcessGroupPtr grad_group, bool parallel_output,
                                         double bucket_cap_mb, cluster::ProcessGroupPtr sp_group,
                                         parallel::sequence::SequenceParallelMode sp_mode, int64_t inner_ring_size,
                                         cluster::ProcessGroupPtr partial_grad_group)
    : model_(std::move(model)),
      sharded_(std::move(sharded)),
      parallel_output_(parallel_output),
      sp_group_(std::move(sp_group)),
      sp_mode_(sp_mode),
      inner_ring_size_(inner_ring_size) {
  GradReducer::NamedParams named, replicated;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    // On sequence shards a tp-replicated parameter (norms, row-parallel
    // biases, GPT-2's wpe) sees only this rank's tokens; a head-local one
    // (Qwen3's q/k norms) only this rank's heads.
    auto& bucket = sharded_.grad_partial_over_tp(item.key()) ? replicated : named;
    bucket.emplace_back(item.key(), item.value());
  }
  if (!replicated.empty() && !partial_grad_group) {
    throw ConfigError("HybridParallelModel: gradients summed over tp (sequence shards, head-local parameters) need "
                      "the dp x tp group");
  }
  reducer_ = std::make_unique<GradReducer>(std::move(named), std::move(grad_group),
                                           GradReducerOptions{.bucket_cap_mb = bucket_cap_mb});
  if (!replicated.empty()) {
    const double dp = static_cast<double>(partial_grad_group->size() / sharded_.tp_group->size());
    partial_reducer_ = std::make_unique<GradReducer>(
        std::move(replicated), std::move(partial_grad_group),
        GradReducerOptions{.bucket_cap_mb = bucket_cap_mb, .sum_scale = 1.0 / dp});
  }
}

void HybridParallelModel::set_grad_sync(bool enabled) {
  // Under a pipeline the schedule reduces once per step (execute_pipeline
  // turns these back off), with or without ZeRO.
  if (!pipeline_) {
    if (auto optimizer = attached_optimizer()) optimizer->set_grad_sync(enabled);
  }
  if (reducer_) reducer_->set_sync_enabled(enabled);
  if (partial_reducer_) partial_reducer_->set_sync_enabled(enabled);
}

void HybridParallelModel::release_grad_reducers() {
  reducer_.reset();
  partial_reducer_.reset();
}

at::Tensor HybridParallelModel::forward_sequence_sharded(const at::Tensor& input_ids,
                                                         const models::TokenLayout& layout) {
  // Megatron-style: the embedding reduce-scatters this rank's (B, T_pad/tp, C)
  // shard, blocks keep it between tp regions (their parallel layers gather /
  // reduce-scatter the sequence), the head gathers it back. Padding sits at
  // the end, so causal attention keeps it away from real tokens; its
  // positions are clamped to T - 1 (no table grows past the true length).
  models::CausalLM& m = *model_;
  models::check_input_ids(input_ids);
  auto& tp = *sharded_.tp_group;
  const int64_t seq_len = input_ids.size(1), padded = (seq_len + tp.size() - 1) / tp.size() * tp.size();
  const int64_t local_len = padded / tp.size();
  at::Tensor ids = padded == seq_len ? input_ids : at::constant_pad_nd(input_ids, {0, padded - seq_len}, 0);
  at::Tensor positions = at::arange(padded, input_ids.options()).clamp_max(seq_len - 1);
  int64_t position_limit = seq_len;
  at::Tensor document_mask;
  models::VarlenSegments varlen;
  if (!layout.empty()) {
    // Per-row positions and documents; the padding tail is a padding document
    // (id -1, it sees itself only) at the row's last position.
    layout.check_against(input_ids);
    const models::TokenLayout local = layout.to(input_ids.device());
    at::Tensor row_positions = local.positions(input_ids.size(0), seq_len, input_ids.device());
    if (padded != seq_len) {
      row_positions = at::cat({row_positions, row_positions.narrow(1, seq_len - 1, 1).expand({-1, padded - seq_len})}, 1);
    }
    positions = row_positions;
    if (local.position_ids.defined()) position_limit = local.position_limit;
    models::TokenLayout padded_layout{.document_ids = local.document_ids};
    if (!padded_layout.document_ids.defined()) padded_layout.document_ids = at::zeros_like(input_ids);
    if (padded != seq_len) padded_layout.document_ids = at::constant_pad_nd(padded_layout.document_ids, {0, padded - seq_len}, -1);
    document_mask = padded_layout.attention_mask();
    if (input_ids.is_cuda()) varlen = models::varlen_segments(padded_layout.document_ids);
  }
  at::Tensor hidden = m.embed_at(ids, positions.narrow(-1, tp.rank() * local_len, local_len), position_limit);
  if (hidden.size(1) != local_len) {
    throw ConfigError(fmt::format("split_gather: the embedding returned {} tokens, not this rank's {} of {}; the "
                                  "plan must shard the embedding with VocabParallelEmbedding",
                                  hidden.size(1), local_len, padded));
  }
  models::BlockContext context = m.block_context_at(hidden, positions, position_limit);
  context.document_mask = document_mask;
  context.varlen = varlen;
  hidden = m.final_norm(m.forward_blocks(hidden, context, 0, m.blocks().size()));
  at::Tensor logits = sharded_.tied_head ? m.soft_cap_logits(parallel::tensor::vocab_parallel_logits(
                                             hidden, m.embedding().weight, tp, sharded_.sequence))
                                         : m.head(hidden);
  return padded == seq_len ? logits : logits.narrow(1, 0, seq_len);
}

at::Tensor HybridParallelModel::forward(const at::Tensor& input_ids, const models::TokenLayout& layout) {
  if (pipeline_) {
    throw ConfigError("HybridParallelModel::forward: with pp_size > 1 a step is booster.execute_pipeline(...)");
  }
  models::CausalLM& m = *model_;
  at::Tensor hidden;
  at::Tensor logits;
  if (sharded_.sequence != parallel::tensor::SequenceSharding::None) {
    logits = forward_sequence_sharded(input_ids, layout);
  } else if (sp_group_) {
    // This rank's sequence shard at its global positions; every block's
    // attention core runs as ring/Ulysses attention over the sp group.
    namespace ps = parallel::sequence;
    models::check_input_ids(input_ids);
    const auto sharding = ps::layout_of(sp_mode_);
    const int64_t seq_len = input_ids.size(1), sp = sp_group_->size();
    at::Tensor local_ids = ps::shard_sequence(input_ids, 1, sp, sp_group_->rank(), sharding);
    ps::SequenceParallelAttention attention(*sp_group_, sp_mode_, seq_len, inner_ring_size_);
    at::Tensor positions;
    int64_t position_limit = seq_len;
    if (layout.empty()) {
      positions = ps::local_position_tensor(seq_len, *sp_group_, sharding, input_ids.device());
    } else {
      // Padded or packed rows: each token at its own position; Ulysses attends
      // over the whole sequence under the rows' document mask, the ring masks
      // each block by the document ids.
      layout.check_against(input_ids);
      const models::TokenLayout local = layout.to(input_ids.device());
      positions = ps::shard_sequence(local.positions(input_ids.size(0), seq_len, input_ids.device()), 1, sp,
                                     sp_group_->rank(), sharding);
      if (local.position_ids.defined()) position_limit = local.position_limit;
      if (local.document_ids.defined()) {
        if (sp_mode_ == ps::SequenceParallelMode::RingAttention) {
          const int64_t padded = ps::padded_length(seq_len, sp, sharding);
          attention.document_ids = at::constant_pad_nd(local.document_ids, {0, padded - seq_len}, -1);
        } else {
          attention.document_mask = ps::padded_document_mask(local.attention_mask(), sp);
        }
      }
    }
    hidden = m.embed_at(local_ids, positions, position_limit);
    models::BlockContext context = m.block_context_at(hidden, positions, position_limit);
    context.attention = &attention;
    hidden = m.final_norm(m.forward_blocks(hidden, context, 0, m.blocks().size()));
  } else {
    hidden = m.embed_layout(input_ids, layout);
    const models::BlockContext context = m.layout_context(hidden, layout);
    hidden = m.final_norm(m.forward_blocks(hidden, context, 0, m.blocks().size()));
  }
  // A tied head reads the embedding's vocab shard; the model's own head would
  // skip the copy-to-region its backward needs, so the wrapper computes it.
  if (!logits.defined()) {
    logits = sharded_.tied_head
                 ? m.soft_cap_logits(parallel::tensor::vocab_parallel_logits(hidden, m.embedding().weight,
                                                                             *sharded_.tp_group))
                 : m.head(hidden);
  }
  if (!sharded_.vocab_parallel_logits || parallel_output_) return logits;
  return parallel::tensor::gather_last_dim(logits, *sharded_.tp_group).narrow(-1, 0, sharded_.vocab.true_vocab);
}

at::Tensor HybridParallelModel::forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                                             std::optional<int64_t> num_items, const models::TokenLayout& layout) {
  const bool whole_model = !pipeline_ && !sp_group_ && sharded_.sequence == parallel::tensor::SequenceSharding::None &&
                           !sharded_.vocab_parallel_logits && !sharded_.tied_head &&
                           (!sharded_.tp_group || sharded_.tp_group->size() == 1);
  if (!whole_model) return ModelWrapper::forward_loss(input_ids, labels, num_items, layout);
  return model_->forward_loss(input_ids, labels, num_items, layout);
}

at::Tensor HybridParallelModel::loss(const at::Tensor& logits, const at::Tensor& labels,
                                     std::optional<int64_t> num_items) {
  if (sp_group_) {
    const bool vocab_parallel = sharded_.vocab_parallel_logits && parallel_output_;
    return parallel::sequence::sequence_parallel_causal_lm_loss(
        logits, labels, *sp_group_, parallel::sequence::layout_of(sp_mode_), vocab_parallel ? &sharded_.vocab : nullptr,
        vocab_parallel ? sharded_.tp_group.get() : nullptr, num_items);
  }
  if (sharded_.vocab_parallel_logits && parallel_output_) {
    return parallel::tensor::vocab_parallel_causal_lm_loss(logits, labels, sharded_.vocab, *sharded_.tp_group,
                                                           num_items);
  }
  return models::causal_lm_loss(logits, labels, num_items);
}

HybridParallelPlugin::HybridParallelPlugin(HybridParallelPluginOptions options, cluster::ProcessGroupPtr world)
    : options_(std::move(options)) {
  options_.validate();
  if (!world) world = cluster::current_cluster().world;
  const int sp_axis = options_.sp_axis_size(), tp_sp = options_.tp_size * sp_axis;
  if (world->size() % tp_sp != 0) {
    throw ConfigError(
        fmt::format("hybrid_parallel: tp_size = {} x sp_size = {} does not divide the {} ranks; use sizes whose "
                    "product divides {}",
                    options_.tp_size, sp_axis, world->size(), world->size()));
  }
  const int pp = options_.pp_size;
  if (world->size() % (tp_sp * pp) != 0) {
    throw ConfigError(fmt::format(
        "hybrid_parallel: tp_size = {} x sp_size = {} x pp_size = {} does not divide the {} ranks; use sizes whose "
        "product divides {}",
        options_.tp_size, sp_axis, pp, world->size(), world->size()));
  }
  const int dp = world->size() / (tp_sp * pp);
  cluster::MeshAxes axes = options_.dp_outside ? cluster::MeshAxes{{"dp", dp}, {"tp", options_.tp_size}}
                                               : cluster::MeshAxes{{"tp", options_.tp_size}, {"dp", dp}};
  // sp sits between dp and tp; only when used, so sp_size = 1 keeps the tp x dp mesh as it was.
  if (sp_axis > 1) axes.insert(axes.begin() + 1, {"sp", sp_axis});
  // pp right inside dp (outermost without dp_outside); only when used.
  if (pp > 1) axes.insert(options_.dp_outside ? axes.begin() + 1 : axes.begin(), {"pp", pp});
  mesh_ = std::make_unique<cluster::ProcessGroupMesh>(std::move(world), std::move(axes));
  // Every multi-axis group the getters hand out, created here (each is a
  // collective split), so no const getter makes a hidden collective later.
  std::vector<std::vector<std::string>> groups;
  if (pp > 1) groups.push_back({"pp", "tp"});
  if (sp_axis > 1) groups.push_back({"dp", "sp"});
  if (options_.tp_size > 1) groups.push_back({"dp", "tp"});  // gradients summed over tp
  mesh_->create_groups_and_seal(groups);
}

cluster::ProcessGroupPtr HybridParallelPlugin::sp_group() const {
  if (options_.sequence_over_tp()) return tp_group();
  return options_.sp_size > 1 ? mesh_->group("sp") : nullptr;
}

HybridParallelPlugin::~HybridParallelPlugin() = default;

namespace {

// Lazy init: this rank's part of each meta parameter from the source: its tp
// slice (sliced from the source's whole tensor, a mapped view for a
// checkpoint, so only the slice is copied), or an empty tensor for a
// parameter of another pipeline stage. In `working` where the source already
// holds that dtype (a bf16 checkpoint for bf16 training), else fp32.
void materialize_rank_part(models::CausalLM& model, const parallel::plan::ShardedModel& sharded, int tp_rank,
                           const models::ParamSource& source, c10::Device device,
                           std::optional<c10::ScalarType> working) {
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.is_meta()) continue;
    if (p.numel() == 0) {  // another stage's
      models::rebind_parameter(p, at::empty(p.sizes(), p.options().device(device)));
      continue;
    }
    const auto spec = sharded.specs.find(item.key());
    std::vector<int64_t> whole_shape(p.sizes().begin(), p.sizes().end());
    if (spec != sharded.specs.end()) whole_shape[static_cast<size_t>(spec->second.dim)] = spec->second.true_size;
    at::Tensor values = source(item.key(), at::empty(whole_shape, p.options()));
    if (values.sizes() != at::IntArrayRef(whole_shape)) {
      throw ConfigError(fmt::format("hybrid_parallel: param_source gave '{}' shape {}, the model has {}", item.key(),
                                    values.sizes(), whole_shape));
    }
    if (spec != sharded.specs.end()) values = parallel::plan::slice_for_rank(values, spec->second, tp_rank);
    const auto dtype = !at::isFloatingType(values.scalar_type()) ? values.scalar_type()
                       : working && values.scalar_type() == *working ? *working
                                                                      : at::kFloat;
    models::rebind_parameter(p, values.to(device, dtype, /*non_blocking=*/false, /*copy=*/true));
  }
}

}  // namespace

std::shared_ptr<ModelWrapper> HybridParallelPlugin::wrap_model(std::shared_ptr<models::CausalLM> model) {
  if (!model) throw ConfigError("HybridParallelPlugin::wrap_model: the model is null");
  if (boosted_.alive()) {
    throw ConfigError("HybridParallelPlugin: one plugin wraps one model; make a second plugin for a second model");
  }
  // Full weights must agree before slicing: dp rank 0's, over the whole world
  // (a tp group slices one copy, so its ranks must hold the same one too).
  std::vector<at::Tensor> params;
  for (const auto& p : model->parameters(/*recurse=*/true)) params.push_back(p);
  broadcast_tensors(params, *mesh_->world());
  const auto plan = options_.custom_policy ? *options_.custom_policy : parallel::plan::default_plan(*model);
  const auto sequence = !options_.sequence_over_tp()                       ? parallel::tensor::SequenceSharding::None
                        : options_.sequence_parallelism_mode == "split_gather" ? parallel::tensor::SequenceSharding::SplitGather
                                                                             : parallel::tensor::SequenceSharding::Ring;
  // LoRA layers step aside for the sharder and come back over the parallel layers.
  auto adapters = lora::detach_for_sharding(*model);
  auto sharded = parallel::plan::shard_model(
      *model, plan, tp_group(),
      parallel::plan::ShardOptions{.make_vocab_size_divisible_by = options_.make_vocab_size_divisible_by,
                                   .sequence = sequence});
  lora::attach_sharded(*model, std::move(adapters), sharded);
  // After sharding, so the wrappers adopt the tensor-parallel layers.
  if (options_.gradient_checkpointing_ratio > 0.0)
    models::enable_activation_checkpointing(
        *model, options_.gradient_checkpointing_ratio,
        models::parse_checkpoint_granularity(options_.gradient_checkpointing_granularity));
  // Pipeline stages: this rank keeps its blocks' parameters (before any cast,
  // so fp32 originals and masters of other stages' parameters are empty too).
  // Sequence shards hold the same parameters and each sees part of the
  // tokens: gradients are averaged over dp x sp (the loss scales its share by sp).
  auto grad_group = options_.sp_axis_size() > 1 ? mesh_->group({"dp", "sp"}) : dp_group();
  std::unique_ptr<HybridPipeline> pipeline;
  if (options_.pp_size > 1) {
    pipeline = std::make_unique<HybridPipeline>(*model, pp_group(), grad_group, pipeline_options_of(options_));
    std::vector<std::string> partial;
    for (const auto& item : model->named_parameters(/*recurse=*/true))
      if (sharded.grad_partial_over_tp(item.key())) partial.push_back(item.key());
    if (!partial.empty()) pipeline->set_partial_grads(std::move(partial), tp_group());
  }
  std::optional<c10::ScalarType> working_dtype;
  if (options_.precision != "fp32") working_dtype = options_.precision == "bf16" ? at::kBFloat16 : at::kHalf;
  if (param_source_) {
    materialize_rank_part(*model, sharded, tp_group()->rank(), param_source_, lazy_device_, working_dtype);
  }
  if (working_dtype) {
    const auto dtype = *working_dtype;
    at::NoGradGuard no_grad;
    fp32_originals_.clear();
    for (auto& item : model->named_parameters(/*recurse=*/true)) {
      at::Tensor& p = item.value();
      fp32_originals_.push_back(p.scalar_type() == dtype ? at::Tensor() : p.detach().clone());
      // set_data: the optimizer's handles follow the cast tensor.
      if (at::isFloatingType(p.scalar_type())) p.set_data(p.detach().to(dtype));
    }
    for (auto& item : model->named_buffers(/*recurse=*/true)) {
      at::Tensor& b = item.value();
      if (at::isFloatingType(b.scalar_type())) b.set_data(b.detach().to(dtype));
    }
  }
  const auto sp_mode = options_.sequence_parallelism_mode == "all_to_all"
                           ? parallel::sequence::SequenceParallelMode::AllToAll
                           : parallel::sequence::SequenceParallelMode::RingAttention;
  // split_gather / ring: the sp group is the tp group, which the sharded
  // layers use directly; the model gets the dp x tp group for tp-replicated
  // gradients instead.
  auto wrapped = std::make_shared<HybridParallelModel>(
      std::move(model), std::move(sharded), std::move(grad_group), options_.parallel_output, options_.bucket_cap_mb,
      options_.sequence_over_tp() ? nullptr : sp_group(), sp_mode, options_.inner_ring_size,
      options_.tp_size > 1 ? mesh_->group({"dp", "tp"}) : nullptr);
  boosted_.set(wrapped);
  if (pipeline) wrapped->attach_pipeline(std::move(pipeline));
  return wrapped;
}

std::unique_ptr<optim::Optimizer> HybridParallelPlugin::wrap_optimizer(ModelWrapper& model,
                                                                       std::unique_ptr<optim::Optimizer> optimizer) {
  auto& hybrid = boosted_.of(model, "HybridParallelPlugin::wrap_optimizer");
  if (options_.zero_stage > 0) return wrap_zero_optimizer(hybrid, std::move(optimizer));
  // Each optimizer parameter's replica count over tp, in the optimizer's flat order.
  std::unordered_map<const c10::TensorImpl*, std::pair<std::string, size_t>> by_impl;
  size_t index = 0;
  for (const auto& item : hybrid.unwrap().named_parameters(/*recurse=*/true)) {
    by_impl[item.value().unsafeGetTensorImpl()] = {item.key(), index++};
  }
  std::vector<int64_t> replicas;
  std::vector<at::Tensor> originals;
  for (const auto& group : optimizer->param_groups()) {
    for (const auto& param : group.params) {
      auto it = by_impl.find(param.unsafeGetTensorImpl());
      if (it == by_impl.end()) {
        throw ConfigError("HybridParallelPlugin: the optimizer holds a tensor that is not a parameter of the model");
      }
      replicas.push_back(norm_replicas(hybrid, it->second.first));
      if (!fp32_originals_.empty()) originals.push_back(fp32_originals_[it->second.second]);
    }
  }
  auto wrapped = wrap_clip_and_masters(std::move(optimizer),
                                       ClipAndMastersOptions{.precision = options_.precision,
                                                             .loss_scaler = options_.loss_scaler,
                                                             .max_norm = options_.max_norm,
                                                             .norm_type = options_.norm_type,
                                                             .replicas = std::move(replicas),
                                                             .norm_group = norm_group(),
                                                             .originals = std::move(originals)});
  fp32_originals_.clear();
  return std::move(wrapped.optimizer);
}

int64_t HybridParallelPlugin::norm_replicas(const HybridParallelModel& model, const std::string& name) const {
  // A tied embedding held by the first and the last pipeline stage counts once.
  const bool tied_twice = model.pipeline() && name == model.pipeline()->tied_name();
  return model.sharded().replicas(name) * (tied_twice ? 2 : 1);
}

PluginCheckpointIO* HybridParallelPlugin::checkpoint_io() {
  if (!io_) io_ = make_hybrid_parallel_checkpoint_io(*this);
  return io_.get();
}

}  // namespace colossus::booster
