// GeminiPlugin: options, model/optimizer wrapping and checkpoint IO.
// Checkpoints: the model is a full HF directory (every chunk gathered for the
// save, dp rank 0 writes, then released), so it loads with any number of ranks,
// into DDP/ZeRO and into transformers; loading reads the full tensors on every
// rank and keeps only the rank's shards. The optimizer state is gathered into
// the unsharded format the Booster writes for DDP (as low_level_zero's).
#include "colossus/booster/gemini_plugin.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "colossus/booster/booster_impl.h"
#include "colossus/booster/ddp_plugin.h"
#include "colossus/booster/rank_shards.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/zero/optimizer_state.h"

namespace colossus::booster {

namespace {

namespace fs = std::filesystem;

// The per-rank sharded save of an optimizer this plugin boosted; refused for others.
optim::OptimizerState rank_state_of(const optim::Optimizer& optimizer, const std::string& what) {
  auto state = optimizer.rank_state_dict();  // collective
  if (!state) {
    throw ConfigError(fmt::format("{}: {} is not the optimizer the gemini plugin boosted; pass Boosted::optimizer",
                                  what, optimizer.name()));
  }
  return std::move(*state);
}

class GeminiCheckpointIO : public PluginCheckpointIO {
 public:
  GeminiCheckpointIO(cluster::ProcessGroupPtr group, const WrappedModel<GeminiModel>& boosted)
      : group_(std::move(group)), boosted_(boosted) {}

  void save_model(ModelWrapper& model, const std::string& dir, const SaveOptions& options) override {
    if (options.size_per_shard_mb <= 0) {
      throw ConfigError(fmt::format("save_model('{}'): size_per_shard_mb={} must be positive, e.g. 1024", dir,
                                    options.size_per_shard_mb));
    }
    auto& ddp = boosted_.of(model, "save_model").ddp();
    const std::string what = fmt::format("save_model('{}')", dir);
    // Phi-3's checkpoints fuse q/k/v and gate/up, which per-rank shards may
    // split between ranks: its model is written whole by rank 0.
    if (!options.shard || models::checkpoint_fuses_projections(model.unwrap().config())) {
      ddp.with_all_gathered([&] {
        write_on_rank0(*group_, what, [&] {
          models::save_pretrained(model.unwrap(), dir, {.max_shard_bytes = options.size_per_shard_mb << 20});
        });
      });
      return;
    }
    // One chunk whole at a time; each rank keeps the parameters it writes.
    const auto& params = ddp.params();
    const int rank = group_->rank(), dp = group_->size();
    std::vector<at::Tensor> mine(params.size());
    ddp.for_each_gathered([&](size_t c) {
      for (size_t k : ddp.chunks()[c].layout.params) {
        if (zero::writer_rank(ddp.layout(), k, dp) == rank) mine[k] = params[k].second.detach().cpu().clone();
      }
    });
    checkpoint::NamedTensors tensors;
    for (size_t k = 0; k < params.size(); ++k) {
      if (!ddp.layout().slots[k].managed && rank == 0) mine[k] = params[k].second.detach();
      if (mine[k].defined()) tensors.emplace_back(params[k].first, mine[k]);
    }
    write_on_rank0(*group_, what, [&] { write_model_config(model.unwrap().config(), ddp.dtype(), dir); });
    save_rank_shards(*group_, {.file_rank = rank, .file_count = dp}, dir, "model", tensors, {}, what);
  }

  void load_model(ModelWrapper& model, const std::string& dir) override {
    auto& ddp = boosted_.of(model, "load_model").ddp();
    read_on_all(*group_, fmt::format("load_model('{}')", dir), [&] {
      // Mapped, not read: each rank touches only the chunks it loads.
      const auto state = models::resolve_state_dict(model.unwrap(), checkpoint::load_state_dict(dir), dir);
      ddp.load_params([&](const std::string& name) { return state.at(name); });
    });
  }

  void save_optimizer(optim::Optimizer& optimizer, const std::string& dir, const SaveOptions& options) override {
    if (options.size_per_shard_mb <= 0) {
      throw ConfigError(
          fmt::format("save_optimizer('{}'): size_per_shard_mb={} must be "
                      "positive, e.g. 1024",
                      dir, options.size_per_shard_mb));
    }
    const std::string what = fmt::format("save_optimizer('{}')", dir);
    if (options.shard) {
      optim::OptimizerState state = rank_state_of(optimizer, what);
      save_rank_shards(*group_, {.file_rank = group_->rank(), .file_count = group_->size()}, dir, kOptimizerPrefix,
                       state.tensors, {{kOptimizerStateKey, state.json}}, what);
      return;
    }
    optim::OptimizerState state = optimizer.state_dict();  // collective
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
  cluster::ProcessGroupPtr group_;
  const WrappedModel<GeminiModel>& boosted_;
};

bool is_fraction(double x) { return x >= 0.0 && x <= 1.0; }

}  // namespace

void GeminiPluginOptions::validate() const {
  if (gemini.placement_policy != "static" && gemini.placement_policy != "auto") {
    throw ConfigError(
        fmt::format("gemini: placement_policy='{}' is unknown; use 'static' or 'auto'", gemini.placement_policy));
  }
  if (gemini.precision != "fp16" && gemini.precision != "bf16" && gemini.precision != "fp32") {
    throw ConfigError(fmt::format("gemini: precision='{}' is unknown; use 'fp16', 'bf16' or 'fp32'", gemini.precision));
  }
  for (const auto& [name, value] : {std::pair<const char*, double>{"shard_param_frac", gemini.shard_param_frac},
                                    {"offload_optim_frac", gemini.offload_optim_frac},
                                    {"offload_param_frac", gemini.offload_param_frac},
                                    {"gpu_margin_mem_ratio", gemini.gpu_margin_mem_ratio.value_or(0.0)}}) {
    if (!is_fraction(value)) {
      throw ConfigError(fmt::format("gemini: {}={} must be in [0, 1], e.g. {}", name, value,
                                    std::string(name) == "shard_param_frac" ? "1.0" : "0.0"));
    }
  }
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"warmup_non_model_data_ratio", gemini.warmup_non_model_data_ratio},
        {"steady_cuda_cap_ratio", gemini.steady_cuda_cap_ratio}}) {
    if (!(value > 0.0 && value <= 1.0)) {
      throw ConfigError(fmt::format("gemini: {}={} must be in (0, 1], e.g. 0.8", name, value));
    }
  }
  if (gemini.placement_policy == "auto") {
    // Colossal-AI ignores these under auto; a setting that does nothing is
    // refused here.
    if (gemini.shard_param_frac != 1.0 || gemini.offload_optim_frac != 0.0 || gemini.offload_param_frac != 0.0) {
      throw ConfigError(
          fmt::format("gemini: shard_param_frac={} / offload_optim_frac={} / "
                      "offload_param_frac={} only apply to "
                      "placement_policy='static'; under 'auto' the traced warm-up decides "
                      "(leave them at 1.0 / 0.0 / 0.0)",
                      gemini.shard_param_frac, gemini.offload_optim_frac, gemini.offload_param_frac));
    }
  } else if (gemini.gpu_margin_mem_ratio) {
    throw ConfigError(
        fmt::format("gemini: gpu_margin_mem_ratio={} only applies to "
                    "placement_policy='auto'; use offload_optim_frac "
                    "under 'static'",
                    *gemini.gpu_margin_mem_ratio));
  }
  if (gemini.offload_param_frac > 0.0 && gemini.shard_param_frac < 1.0) {
    throw ConfigError(
        fmt::format("gemini: offload_param_frac={} needs shard_param_frac=1.0 "
                    "(got {}): a chunk kept gathered on every rank "
                    "has no shard to offload",
                    gemini.offload_param_frac, gemini.shard_param_frac));
  }
  if (gemini.max_prefetch < 0) throw ConfigError(fmt::format("gemini: max_prefetch={} must be >= 0, e.g. 0", gemini.max_prefetch));
  if (!(search_range_m >= 0.0) || !std::isfinite(search_range_m)) {
    throw ConfigError(fmt::format("gemini: search_range_m={} must be >= 0, e.g. 32", search_range_m));
  }
  if (!(min_chunk_size_m >= 0.0) || !std::isfinite(min_chunk_size_m)) {
    throw ConfigError(fmt::format("gemini: min_chunk_size_m={} must be >= 0, e.g. 32", min_chunk_size_m));
  }
  if (hidden_dim < 0)
    throw ConfigError(fmt::format("gemini: hidden_dim={} must be >= 0 (0: search by 1024)", hidden_dim));
  if (!(gemini.max_norm >= 0.0) || !std::isfinite(gemini.max_norm)) {
    throw ConfigError(fmt::format("gemini: max_norm={} is invalid; use 0 (no clipping) or e.g. 1.0", gemini.max_norm));
  }
  if (!(gemini.norm_type > 0.0))
    throw ConfigError(fmt::format("gemini: norm_type={} is invalid; use 2 or infinity", gemini.norm_type));
  if (!gemini.master_weights && gemini.precision == "fp16") {
    throw ConfigError(
        "gemini: master_weights=false with precision='fp16' "
        "would step fp16 shards with a loss scale; use bf16 "
        "or keep master_weights=true");
  }
  if (gemini.fp8_communication && gemini.precision == "fp16") {
    // As low_level_zero: loss-scaled fp16 gradients lose too much through e4m3.
    throw ConfigError("gemini: fp8_communication with precision 'fp16' is not supported; use precision 'bf16' (or "
                      "'fp32') with fp8_communication, or fp16 without it");
  }
  if (!is_fraction(gemini.nvme_offload_fraction)) {
    throw ConfigError(
        fmt::format("gemini: nvme_offload_fraction={} must be in [0, 1], e.g. 0.5", gemini.nvme_offload_fraction));
  }
  if (gemini.nvme_offload_fraction > 0.0) {
    if (gemini.nvme_offload_dir.empty()) {
      throw ConfigError(fmt::format(
          "gemini: nvme_offload_fraction={} needs nvme_offload_dir, e.g. '/local_nvme/gemini'", gemini.nvme_offload_fraction));
    }
    if (gemini.placement_policy != "static" || gemini.offload_optim_frac <= 0.0) {
      throw ConfigError(fmt::format(
          "gemini: nvme_offload_fraction={} moves host-offloaded optimizer state to files, so it needs "
          "placement_policy='static' with offload_optim_frac > 0 (got '{}', {}); e.g. offload_optim_frac=1.0",
          gemini.nvme_offload_fraction, gemini.placement_policy, gemini.offload_optim_frac));
    }
  }
  gemini.loss_scaler.validate();
}

zero::gemini::GeminiOptions GeminiPluginOptions::gemini_options() const {
  constexpr double kMi = 1024.0 * 1024.0;
  zero::gemini::GeminiOptions options = gemini;
  options.chunk_search = {.min_chunk_numel = static_cast<int64_t>(std::llround(min_chunk_size_m * kMi)),
                          .search_range_numel = static_cast<int64_t>(std::llround(search_range_m * kMi)),
                          .search_interval = hidden_dim > 0 ? hidden_dim : 1024};
  return options;
}

GeminiPlugin::GeminiPlugin(GeminiPluginOptions options, cluster::ProcessGroupPtr group)
    : options_(std::move(options)), group_(group ? std::move(group) : cluster::current_cluster().world) {
  options_.validate();
  io_ = std::make_unique<GeminiCheckpointIO>(group_, boosted_);
}

GeminiPlugin::~GeminiPlugin() = default;

std::shared_ptr<ModelWrapper> GeminiPlugin::wrap_model(std::shared_ptr<models::CausalLM> model) {
  c10::Device device(c10::kCPU);
  try {
    device = cluster::current_cluster().device;
  } catch (const DistError&) {  // not launched: a single CPU process
  }
  // Every rank starts from rank 0's weights and buffers. The model stays where
  // it was built (the chunks are made from it); where the backend needs device
  // tensors, each one travels through the device on its own. Lazy (meta)
  // parameters need no broadcast: their source is the same on every rank.
  std::vector<at::Tensor> tensors;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    if (!item.value().is_meta()) tensors.push_back(item.value());
  }
  for (const auto& item : model->named_buffers(/*recurse=*/true)) tensors.push_back(item.value());
  if (group_->backend_name() == "nccl") {
    at::NoGradGuard no_grad;
    for (auto& t : tensors) {
      if (t.device() == device) {
        broadcast_tensors({t}, *group_);
        continue;
      }
      at::Tensor staged = t.to(device);
      broadcast_tensors({staged}, *group_);
      t.copy_(staged);
    }
  } else {
    broadcast_tensors(tensors, *group_);
  }
  auto wrapped = std::make_shared<GeminiModel>(
      std::make_unique<zero::gemini::GeminiDDP>(std::move(model), group_, device, options_.gemini_options()));
  boosted_.set(wrapped);
  return wrapped;
}

std::unique_ptr<optim::Optimizer> GeminiPlugin::wrap_optimizer(ModelWrapper& model,
                                                               std::unique_ptr<optim::Optimizer> optimizer) {
  return std::make_unique<zero::gemini::GeminiOptimizer>(std::move(optimizer),
                                                        boosted_.of(model, "gemini: wrap_optimizer").ddp());
}

}  // namespace colossus::booster
