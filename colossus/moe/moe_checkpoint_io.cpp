// Checkpoint IO of MoeHybridParallelPlugin. The model is one Hugging Face
// directory: experts gathered over ep, world rank 0 writes
// (expert_checkpoint.h), so it loads with any ep_size and into transformers;
// each rank loads only the tensors it holds. The optimizer state is gathered
// per shard group (dense over dp, experts over moe_dp) and written by moe_dp
// rank 0 of each ep rank as `optimizer_ep<r>` (safetensors, the state JSON and
// ep_size in its metadata): it resumes on any layout with the same ep_size (any
// moe_dp, zero_stage 0-2, since all use the Booster's unsharded format);
// another ep_size is refused, because the state's parameter indices would name
// other experts.
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster_impl.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/moe/expert_checkpoint.h"
#include "colossus/moe/moe_hybrid_parallel_plugin.h"
#include "colossus/zero/low_level/low_level_zero_optimizer.h"

#include <fmt/format.h>

#include <filesystem>

namespace colossus::moe {

namespace {

namespace fs = std::filesystem;

constexpr const char* kEpSizeKey = "colossus.moe.ep_size";

std::string optimizer_prefix(int ep_rank) { return fmt::format("optimizer_ep{}", ep_rank); }

MoeHybridParallelModel& moe_model(booster::ModelWrapper& model, const char* what) {
  auto* moe = dynamic_cast<MoeHybridParallelModel*>(&model);
  if (!moe) {
    throw ConfigError(
        fmt::format("{}: the model was not wrapped by MoeHybridParallelPlugin; "
                    "pass Boosted::model",
                    what));
  }
  return *moe;
}

// The metadata of `dir/<prefix>` (single file, or the first shard of its
// index).
std::map<std::string, std::string> metadata_of(const std::string& dir, const std::string& prefix) {
  const fs::path single = fs::path(dir) / checkpoint::hf::single_file_name(prefix);
  const fs::path index = fs::path(dir) / checkpoint::hf::index_file_name(prefix);
  std::string source = single.string();
  if (!fs::exists(single)) {
    if (!fs::exists(index)) {
      throw CheckpointError(
          fmt::format("load_optimizer: '{}' holds neither {} nor {}; "
                      "MoeHybridParallelPlugin reads the per-ep-rank "
                      "optimizer files its save_optimizer writes",
                      dir, single.filename().string(), index.filename().string()));
    }
    const auto weight_map = checkpoint::hf::read_index(index.string()).weight_map;
    if (weight_map.empty()) throw CheckpointError(fmt::format("load_optimizer: '{}' lists no tensors", index.string()));
    source = (fs::path(dir) / weight_map.begin()->second).string();
  }
  return checkpoint::SafetensorsFile::open(source).metadata();
}

class MoeCheckpointIO : public booster::PluginCheckpointIO {
 public:
  explicit MoeCheckpointIO(MoeHybridParallelPlugin& plugin) : plugin_(plugin) {}

  void save_model(booster::ModelWrapper& model, const std::string& dir, const booster::SaveOptions&) override {
    auto& moe = moe_model(model, "save_model");
    if (moe.zero_optimizer) moe.zero_optimizer->wait_for_params();
    auto world = plugin_.dp_group();
    std::exception_ptr error;
    try {
      // Collective over ep (every rank gathers); one rank of the job writes.
      save_expert_parallel_pretrained(moe.mixtral(), *moe.ep_group(), dir, world->rank() == 0);
    } catch (...) {
      error = std::current_exception();
    }
    booster::agree_on_success(*world, error, fmt::format("save_model('{}')", dir));
  }

  void load_model(booster::ModelWrapper& model, const std::string& dir) override {
    auto& moe = moe_model(model, "load_model");
    booster::read_on_all(*plugin_.dp_group(), fmt::format("load_model('{}')", dir), [&] {
      std::vector<std::string> names;  // the dense part and this rank's experts
      for (const auto& item : moe.unwrap().named_parameters(/*recurse=*/true)) names.push_back(item.key());
      if (moe.zero_optimizer) moe.zero_optimizer->wait_for_params();
      auto state = checkpoint::load_tensors(dir, names);
      models::load_state_dict(moe.unwrap(), state, dir);
      // Masters follow the loaded weights, or the next
      // step writes the old ones back.
      if (moe.zero_optimizer) moe.zero_optimizer->refresh_masters_from_params();
      if (moe.mixed_optimizer) booster::refresh_masters(*moe.mixed_optimizer);
    });
  }

  void save_optimizer(optim::Optimizer& optimizer, const std::string& dir,
                      const booster::SaveOptions& options) override {
    if (options.size_per_shard_mb <= 0) {
      throw ConfigError(
          fmt::format("save_optimizer('{}'): size_per_shard_mb={} must be "
                      "positive, e.g. 1024",
                      dir, options.size_per_shard_mb));
    }
    // Collective under ZeRO (gathers over dp and moe_dp): every rank takes
    // part.
    optim::OptimizerState state = optimizer.state_dict();
    auto ep = plugin_.ep_group();
    std::exception_ptr error;
    if (plugin_.moe_dp_group()->rank() == 0) {
      try {
        checkpoint::ShardOptions shard_options{.max_shard_bytes = options.size_per_shard_mb << 20,
                                               .prefix = optimizer_prefix(ep->rank())};
        shard_options.metadata[booster::kOptimizerStateKey] = std::move(state.json);
        shard_options.metadata[kEpSizeKey] = std::to_string(ep->size());
        checkpoint::save_sharded(dir, state.tensors, shard_options);
      } catch (...) {
        error = std::current_exception();
      }
    }
    booster::agree_on_success(*plugin_.dp_group(), error, fmt::format("save_optimizer('{}')", dir));
  }

  void load_optimizer(optim::Optimizer& optimizer, const std::string& dir) override {
    auto ep = plugin_.ep_group();
    booster::read_on_all(*plugin_.dp_group(), fmt::format("load_optimizer('{}')", dir), [&] {
      const auto first = metadata_of(dir, optimizer_prefix(0));
      const auto saved_ep = first.find(kEpSizeKey);
      if (saved_ep == first.end() || saved_ep->second != std::to_string(ep->size())) {
        throw CheckpointError(
            fmt::format("load_optimizer('{}'): the optimizer state was saved with "
                        "ep_size {} but this plugin has ep_size {}; "
                        "it resumes only with the same ep_size (any moe_dp or "
                        "zero_stage). Load the model with load_model "
                        "(any ep_size) and start a fresh optimizer instead",
                        dir, saved_ep == first.end() ? std::string("?") : saved_ep->second, ep->size()));
      }
      const std::string prefix = optimizer_prefix(ep->rank());
      const auto metadata = ep->rank() == 0 ? first : metadata_of(dir, prefix);
      const auto json = metadata.find(booster::kOptimizerStateKey);
      if (json == metadata.end()) {
        throw CheckpointError(
            fmt::format("load_optimizer('{}'): {} has no '{}' metadata", dir, prefix, booster::kOptimizerStateKey));
      }
      optim::OptimizerState state;
      state.json = json->second;
      for (auto& [name, tensor] : checkpoint::load_state_dict(dir, prefix)) state.tensors.emplace_back(name, tensor);
      try {
        optimizer.load_state_dict(state);
      } catch (const CheckpointError& e) {
        throw CheckpointError(fmt::format("load_optimizer('{}', {}): {}", dir, prefix, e.what()));
      }
    });
  }

 private:
  MoeHybridParallelPlugin& plugin_;
};

}  // namespace

std::unique_ptr<booster::PluginCheckpointIO> make_moe_checkpoint_io(MoeHybridParallelPlugin& plugin) {
  return std::make_unique<MoeCheckpointIO>(plugin);
}

}  // namespace colossus::moe
