// HybridParallelPlugin's checkpoint IO. Saves gather every tp-sharded tensor
// (parameters, and optimizer state shaped like them) into the full tensor with
// the true vocab (padding trimmed); world rank 0 writes a Hugging Face model
// directory and an optimizer file in the replicated layout. Loads read the full
// tensors on every rank and slice this rank's part (padding added back), so
// any tp x dp layout, DDP and transformers read what any other layout wrote.
// With pp > 1 each stage steps only its own parameters, so the optimizer file
// is merged over pp (each tensor from the stage holding its parameter; global
// parameter indices, which do not depend on the layout) and a load keeps the
// entries of the parameters this stage holds.
// The gathering and slicing is HybridParallelState (hybrid_parallel_state.h).
// Every call is collective over the world; an error anywhere throws on all.
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster_impl.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/booster/hybrid_parallel_state.h"
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/core/precision.h"
#include "colossus/models/pretrained.h"
#include "colossus/zero/low_level/low_level_zero_optimizer.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <set>

namespace colossus::booster {

namespace {

namespace fs = std::filesystem;

std::string hf_dtype(c10::ScalarType dtype) {
  if (auto name = precision_of(dtype)) return hf_dtype_name(*name);
  throw CheckpointError(fmt::format("save_model: no Hugging Face torch_dtype for {}", c10::toString(dtype)));
}

class HybridParallelCheckpointIO : public PluginCheckpointIO {
 public:
  explicit HybridParallelCheckpointIO(const HybridParallelPlugin& plugin) : plugin_(plugin) {}

  void save_model(ModelWrapper& model, const std::string& dir, const SaveOptions& options) override {
    auto& hybrid = plugin_.boosted().of(model, "save_model");
    auto& world = *plugin_.mesh().world();
    std::exception_ptr error;
    try {
      if (options.size_per_shard_mb <= 0) {
        throw ConfigError(
            fmt::format("save_model('{}'): size_per_shard_mb={} must be positive", dir, options.size_per_shard_mb));
      }
      // Gathered whole by parameter name, then named as the checkpoint names
      // them (Phi-3 fuses q/k/v and gate/up only once they are whole).
      auto layout = state_of(hybrid);
      checkpoint::NamedTensors tensors;
      for (const auto& item : hybrid.unwrap().named_parameters(/*recurse=*/true)) {
        tensors.emplace_back(item.key(), layout.full_parameter(item.key(), item.value()));
      }
      tensors = models::checkpoint_tensors(hybrid.unwrap().config(), std::move(tensors));
      if (world.rank() == 0) {
        // Written now even with use_async: the gather already cost a full copy.
        checkpoint::save_sharded(dir, tensors, {.max_shard_bytes = options.size_per_shard_mb * (int64_t{1} << 20)});
        models::ModelConfig config = hybrid.unwrap().config();
        std::visit(
            [&](auto& c) {
              c.extra.erase("dtype");
              c.extra["torch_dtype"] = fmt::format("\"{}\"", hf_dtype(tensors.front().second.scalar_type()));
            },
            config);
        const std::string path = (fs::path(dir) / "config.json").string();
        checkpoint::io::TempFile out(path, checkpoint::io::temp_path_for(path));
        const std::string json = models::config_to_json(config);
        out.write(json.data(), json.size());
        out.publish();
      }
    } catch (...) {
      error = std::current_exception();
    }
    agree_on_success(world, error, fmt::format("save_model('{}')", dir));
  }

  void load_model(ModelWrapper& model, const std::string& dir) override {
    auto& hybrid = plugin_.boosted().of(model, "load_model");
    std::exception_ptr error;
    try {
      const auto state = models::model_tensors(hybrid.unwrap().config(), checkpoint::load_state_dict(dir), dir);
      const auto layout = state_of(hybrid);
      const bool tied = hybrid.unwrap().tied_embeddings();
      std::vector<std::string> missing, unexpected;
      std::set<std::string> known;
      at::NoGradGuard no_grad;
      for (auto& item : hybrid.unwrap().named_parameters(/*recurse=*/true)) {
        known.insert(item.key());
        auto it = state.find(item.key());
        if (it == state.end()) {
          missing.push_back(item.key());
          continue;
        }
        // Pipeline: other stages' parameters are empty here; their owners load them.
        if (!layout.holds(item.key())) continue;
        // Floating-point precisions convert; an integer tensor into a float
        // parameter is no precision change (as models::load_state_dict).
        const auto stored = it->second.scalar_type(), wanted = item.value().scalar_type();
        if (stored != wanted && !(at::isFloatingType(stored) && at::isFloatingType(wanted))) {
          throw CheckpointError(fmt::format("load_model('{}'): {} is {} in the checkpoint, the model needs {}; only "
                                            "floating-point precisions convert",
                                            dir, item.key(), c10::toString(stored), c10::toString(wanted)));
        }
        at::Tensor local = layout.slice_parameter(item.key(), it->second.to(wanted));
        if (local.sizes() != item.value().sizes()) {
          throw CheckpointError(fmt::format("load_model('{}'): {} has shape {} in the checkpoint, the model needs {}",
                                            dir, item.key(), c10::str(it->second.sizes()),
                                            c10::str(item.value().sizes())));
        }
        item.value().copy_(local);
      }
      for (const auto& [name, _] : state) {
        const bool tolerated =
            (tied && name == "lm_head.weight") || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
        if (!known.contains(name) && !tolerated) unexpected.push_back(name);
      }
      if (!missing.empty() || !unexpected.empty()) {
        throw CheckpointError(fmt::format("load_model('{}'): missing [{}], unexpected [{}]", dir,
                                          fmt::join(missing, ", "), fmt::join(unexpected, ", ")));
      }
    } catch (...) {
      error = std::current_exception();
    }
    agree_on_success(*plugin_.mesh().world(), error, fmt::format("load_model('{}')", dir));
  }

  void save_optimizer(optim::Optimizer& optimizer, const std::string& dir, const SaveOptions& options) override {
    auto& world = *plugin_.mesh().world();
    std::exception_ptr error;
    try {
      auto& hybrid = plugin_.boosted().current("save_optimizer");
      auto layout = state_of(hybrid);
      const auto state = layout.full_optimizer_state(layout.param_names(optimizer), optimizer.state_dict());
      if (world.rank() == 0) {
        checkpoint::ShardOptions shard{.max_shard_bytes = options.size_per_shard_mb * (int64_t{1} << 20),
                                       .prefix = kOptimizerPrefix};
        shard.metadata[kOptimizerStateKey] = state.json;
        checkpoint::save_sharded(dir, state.tensors, shard);
      }
    } catch (...) {
      error = std::current_exception();
    }
    agree_on_success(world, error, fmt::format("save_optimizer('{}')", dir));
  }

  void load_optimizer(optim::Optimizer& optimizer, const std::string& dir) override {
    std::exception_ptr error;
    try {
      auto& hybrid = plugin_.boosted().current("load_optimizer");
      const std::string single = (fs::path(dir) / checkpoint::hf::single_file_name(kOptimizerPrefix)).string();
      std::string source = single;
      if (!fs::exists(single)) {
        const auto index =
            checkpoint::hf::read_index((fs::path(dir) / checkpoint::hf::index_file_name(kOptimizerPrefix)).string());
        if (index.weight_map.empty())
          throw CheckpointError(fmt::format("load_optimizer('{}'): the index lists no tensors", dir));
        source = (fs::path(dir) / index.weight_map.begin()->second).string();
      }
      const auto file = checkpoint::SafetensorsFile::open(source);
      const auto json = file.metadata().find(kOptimizerStateKey);
      if (json == file.metadata().end()) {
        throw CheckpointError(fmt::format("load_optimizer: '{}' was not written by save_optimizer (no '{}' metadata)",
                                          source, kOptimizerStateKey));
      }
      optim::OptimizerState full{.json = json->second};
      for (auto& [name, tensor] : checkpoint::load_state_dict(dir, kOptimizerPrefix)) full.tensors.emplace_back(name, tensor);
      const auto layout = state_of(hybrid);
      const auto state = layout.local_optimizer_state(layout.param_names(optimizer), std::move(full));
      optimizer.load_state_dict(state);
    } catch (...) {
      error = std::current_exception();
    }
    agree_on_success(*plugin_.mesh().world(), error, fmt::format("load_optimizer('{}')", dir));
  }

 private:
  HybridParallelState state_of(HybridParallelModel& hybrid) const {
    return HybridParallelState(hybrid, plugin_.tp_group(), plugin_.pp_group());
  }

  const HybridParallelPlugin& plugin_;
};

}  // namespace

std::unique_ptr<PluginCheckpointIO> make_hybrid_parallel_checkpoint_io(const HybridParallelPlugin& plugin) {
  return std::make_unique<HybridParallelCheckpointIO>(plugin);
}

}  // namespace colossus::booster
