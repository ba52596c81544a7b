// LowLevelZeroPlugin: options, model/optimizer wrapping and checkpoint IO.
// Checkpoints: the model is a full HF directory (parameters are whole on every
// rank after the all-gather, dp rank 0 writes); the optimizer state is
// gathered into the unsharded format the Booster writes for DDP, so it loads
// with any dp size, into DDP, and DDP checkpoints load here (resharding is a
// cut of whole tensors at load).
#include "colossus/booster/low_level_zero_plugin.h"

#include "colossus/booster/booster_impl.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/booster/rank_shards.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/cluster/launch.h"
#include "colossus/cluster/mesh.h"
#include "colossus/core/errors.h"
#include "colossus/core/precision.h"
#include "colossus/models/pretrained.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

namespace colossus::booster {

namespace {

namespace fs = std::filesystem;

// The per-rank sharded save of an optimizer this plugin boosted; refused for others.
optim::OptimizerState rank_state_of(const optim::Optimizer& optimizer, const std::string& what) {
  auto state = optimizer.rank_state_dict();  // collective over the shard group
  if (!state) {
    throw ConfigError(fmt::format("{}: {} is not the optimizer the low_level_zero plugin boosted; pass "
                                  "Boosted::optimizer",
                                  what, optimizer.name()));
  }
  return std::move(*state);
}

class LowLevelZeroCheckpointIO : public PluginCheckpointIO {
 public:
  // group: all dp ranks; shard_group: the ranks state is sharded over;
  // extra_group: replicas of one shard (null when extra_dp_size is 1).
  LowLevelZeroCheckpointIO(cluster::ProcessGroupPtr group, cluster::ProcessGroupPtr shard_group,
                           cluster::ProcessGroupPtr extra_group, const WrappedModel<LowLevelZeroModel>& boosted)
      : group_(std::move(group)),
        shard_group_(std::move(shard_group)),
        extra_group_(std::move(extra_group)),
        boosted_(boosted) {}

  void save_model(ModelWrapper& model, const std::string& dir, const SaveOptions& options) override {
    if (options.size_per_shard_mb <= 0) {
      throw ConfigError(fmt::format("save_model('{}'): size_per_shard_mb={} must be positive, e.g. 1024", dir,
                                    options.size_per_shard_mb));
    }
    auto& zero_model = boosted_.of(model, "save_model");
    zero_model.gather_exact_params();
    const std::string what = fmt::format("save_model('{}')", dir);
    if (options.shard) {
      // Parameters are whole on every rank: each writes its share as it is.
      checkpoint::NamedTensors params = models::state_dict(model.unwrap());  // checkpoint names (Phi-3 fused)
      const auto writers = writer_ranks_by_bytes(params, shard_group_->size());
      checkpoint::NamedTensors mine;
      for (size_t k = 0; k < params.size(); ++k)
        if (writers[k] == shard_group_->rank()) mine.push_back(params[k]);
      write_on_rank0(*group_, what, [&] {
        write_model_config(model.unwrap().config(), params.front().second.scalar_type(), dir);
      });
      save_rank_shards(*group_, rank_shard(), dir, "model", mine, {}, what);
      return;
    }
    // Parameters are whole on every rank: rank 0 writes them as they are
    // (use_async is served synchronously: the write is the whole cost).
    write_on_rank0(*group_, what, [&] {
      models::save_pretrained(model.unwrap(), dir, {.max_shard_bytes = options.size_per_shard_mb << 20});
    });
  }

  void load_model(ModelWrapper& model, const std::string& dir) override {
    read_on_all(*group_, fmt::format("load_model('{}')", dir), [&] {
      const fs::path single = fs::path(dir) / checkpoint::hf::single_file_name("model");
      const std::string source =
          fs::exists(single) ? single.string() : (fs::path(dir) / checkpoint::hf::index_file_name("model")).string();
      boosted_.of(model, "load_model").wait_for_params();
      models::load_state_dict(model.unwrap(), checkpoint::load_state_dict(dir), source);
    });
  }

  void save_optimizer(optim::Optimizer& optimizer, const std::string& dir, const SaveOptions& options) override {
    if (options.size_per_shard_mb <= 0) {
      throw ConfigError(fmt::format("save_optimizer('{}'): size_per_shard_mb={} must be positive, e.g. 1024", dir,
                                    options.size_per_shard_mb));
    }
    const std::string what = fmt::format("save_optimizer('{}')", dir);
    if (options.shard) {
      optim::OptimizerState state = rank_state_of(optimizer, what);
      save_rank_shards(*group_, rank_shard(), dir, kOptimizerPrefix, state.tensors, {{kOptimizerStateKey, state.json}},
                       what);
      return;
    }
    optim::OptimizerState state = optimizer.state_dict();  // collective: gathers the shards
    write_on_rank0(*group_, what, [&] {
      checkpoint::ShardOptions shard_options{.max_shard_bytes = options.size_per_shard_mb << 20,
                                             .prefix = kOptimizerPrefix};
      shard_options.metadata[kOptimizerStateKey] = std::move(state.json);
      checkpoint::save_sharded(dir, state.tensors, shard_options);
    });
  }

  void load_optimizer(optim::Optimizer& optimizer, const std::string& dir) override {
    read_on_all(*group_, fmt::format("load_optimizer('{}')", dir), [&] { load_optimizer_state(optimizer, dir); });
  }

 private:
  // One file per shard rank; replicas (extra_dp) hold the same shard and
  // leave it to the first of them.
  RankShard rank_shard() const {
    return {.file_rank = shard_group_->rank(),
            .file_count = shard_group_->size(),
            .writes = !extra_group_ || extra_group_->rank() == 0};
  }

  cluster::ProcessGroupPtr group_, shard_group_, extra_group_;
  const WrappedModel<LowLevelZeroModel>& boosted_;
};

}  // namespace

void LowLevelZeroPluginOptions::validate() const {
  if (stage != 1 && stage != 2) {
    throw ConfigError(
        fmt::format("low_level_zero: stage={} is not supported; use 1 (optimizer state sharded) or 2 "
                    "(gradients too); ZeRO-3 is the gemini plugin",
                    stage));
  }
  if (!precision_named(precision)) {
    throw ConfigError(
        fmt::format("low_level_zero: precision='{}' is unknown; use 'fp16', 'bf16' or 'fp32'", precision));
  }
  if (fp8_communication && precision == "fp16") {
    // Loss-scaled fp16 gradients through e4m3 moved a 50-step curve by 6.5%
    // on 2 ranks where bf16 moved it by 0.5% (trainer_test).
    throw ConfigError("low_level_zero: fp8_communication with precision 'fp16' is not supported; use precision "
                      "'bf16' (or 'fp32') with fp8_communication, or fp16 without it");
  }
  if (!communication_dtype.empty() && !precision_named(communication_dtype)) {
    throw ConfigError(
        fmt::format("low_level_zero: communication_dtype='{}' is unknown; use '' (the parameters' "
                    "dtype), 'fp32', 'bf16' or 'fp16'",
                    communication_dtype));
  }
  if (!(reduce_bucket_size_in_m > 0.0) || !std::isfinite(reduce_bucket_size_in_m)) {
    throw ConfigError(
        fmt::format("low_level_zero: reduce_bucket_size_in_m={} must be positive, e.g. 12", reduce_bucket_size_in_m));
  }
  if (!(max_norm >= 0.0) || !std::isfinite(max_norm)) {
    throw ConfigError(fmt::format("low_level_zero: max_norm={} is invalid; use 0 (no clipping) or e.g. 1.0", max_norm));
  }
  if (!(norm_type > 0.0)) {
    throw ConfigError(fmt::format("low_level_zero: norm_type={} is invalid; use 2 or infinity", norm_type));
  }
  if (extra_dp_size < 1) {
    throw ConfigError(
        fmt::format("low_level_zero: extra_dp_size={} must be >= 1 (1: no extra replication)", extra_dp_size));
  }
  zero_options().loss_scaler.validate();
}

zero::LowLevelZeroOptions LowLevelZeroPluginOptions::zero_options() const {
  return zero::LowLevelZeroOptions{
      .stage = stage,
      .precision = precision,
      .loss_scaler = loss_scaler,
      .max_norm = max_norm,
      .norm_type = norm_type,
      .bucket_numel = std::max<int64_t>(1, static_cast<int64_t>(reduce_bucket_size_in_m * 1024 * 1024)),
      .communication_dtype = communication_dtype.empty() ? std::nullopt : std::optional(scalar_type_of(*precision_named(communication_dtype))),
      .fp8_communication = fp8_communication,
      .overlap_communication = overlap_communication,
      .overlap_allgather = overlap_allgather,
      .cpu_offload = cpu_offload,
      .master_weights = master_weights};
}

void LowLevelZeroModel::wait_for_params() const {
  if (auto optimizer = attached_optimizer()) optimizer->wait_for_params();
}

void LowLevelZeroModel::gather_exact_params() const {
  auto optimizer = attached_optimizer();
  if (auto* zero = dynamic_cast<zero::LowLevelZeroOptimizer*>(optimizer.get()); zero && zero->fp8_gathers_params()) {
    zero->gather_exact_params();
    return;
  }
  wait_for_params();
}

at::Tensor LowLevelZeroModel::forward(const at::Tensor& input_ids, const models::TokenLayout& layout) {
  wait_for_params();
  return model_->forward(input_ids, layout);
}

at::Tensor LowLevelZeroModel::forward_loss(const at::Tensor& input_ids, const at::Tensor& labels,
                                          std::optional<int64_t> num_items, const models::TokenLayout& layout) {
  wait_for_params();
  return model_->forward_loss(input_ids, labels, num_items, layout);
}

void LowLevelZeroModel::set_grad_sync(bool enabled) {
  if (auto optimizer = attached_optimizer()) optimizer->set_grad_sync(enabled);
}

LowLevelZeroPlugin::LowLevelZeroPlugin(LowLevelZeroPluginOptions options, cluster::ProcessGroupPtr group)
    : options_(std::move(options)), group_(group ? std::move(group) : cluster::current_cluster().world) {
  options_.validate();
  if (group_->size() % options_.extra_dp_size != 0) {
    throw ConfigError(
        fmt::format("low_level_zero: extra_dp_size={} does not divide the {} data-parallel ranks; use "
                    "a divisor of {}, e.g. 1",
                    options_.extra_dp_size, group_->size(), group_->size()));
  }
  shard_group_ = group_;
  if (options_.extra_dp_size > 1) {
    cluster::ProcessGroupMesh mesh(
        group_, {{"extra_dp", options_.extra_dp_size}, {"dp", group_->size() / options_.extra_dp_size}});
    shard_group_ = mesh.group("dp");
    extra_group_ = mesh.group("extra_dp");
  }
  io_ = std::make_unique<LowLevelZeroCheckpointIO>(group_, shard_group_, extra_group_, boosted_);
}

LowLevelZeroPlugin::~LowLevelZeroPlugin() = default;

std::shared_ptr<ModelWrapper> LowLevelZeroPlugin::wrap_model(std::shared_ptr<models::CausalLM> model) {
  // Every rank starts from rank 0's weights and buffers (a lazy model's
  // parameters are not broadcast: every rank reads them from one source).
  std::vector<at::Tensor> tensors;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) tensors.push_back(item.value());
  for (const auto& item : model->named_buffers(/*recurse=*/true)) tensors.push_back(item.value());
  broadcast_tensors(tensors, *group_);
  auto wrapped = std::make_shared<LowLevelZeroModel>(std::move(model));
  boosted_.set(wrapped);
  return wrapped;
}

std::unique_ptr<optim::Optimizer> LowLevelZeroPlugin::wrap_optimizer(ModelWrapper& model,
                                                                     std::unique_ptr<optim::Optimizer> optimizer) {
  boosted_.of(model, "low_level_zero: wrap_optimizer");
  zero::NamedParams named;
  for (const auto& item : model.unwrap().named_parameters(/*recurse=*/true))
    named.emplace_back(item.key(), item.value());
  auto zero_options = options_.zero_options();
  zero_options.param_source = param_source_;
  zero_options.lazy_device = lazy_device_;
  auto zero = std::make_unique<zero::LowLevelZeroOptimizer>(std::move(optimizer), std::move(named), shard_group_,
                                                            extra_group_, std::move(zero_options));
  // Buffers follow the precision as the Booster's own bf16/fp16 path casts them.
  const auto dtype = scalar_type_of(*precision_named(options_.precision));
  at::NoGradGuard no_grad;
  for (auto& item : model.unwrap().named_buffers(/*recurse=*/true)) {
    at::Tensor& buffer = item.value();
    if (at::isFloatingType(buffer.scalar_type()) && buffer.scalar_type() != dtype) buffer.set_data(buffer.to(dtype));
  }
  return zero;
}

}  // namespace colossus::booster
