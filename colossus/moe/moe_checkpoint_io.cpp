// Checkpoint IO of MoeHybridParallelPlugin. The model is one Hugging Face
// directory: experts gathered over ep, world rank 0 writes
// (expert_checkpoint.h), so it loads with any ep_size and into transformers;
// each rank loads only the tensors it holds. The optimizer state is gathered
// per shard group (dense over dp, experts over moe_dp) and written by moe_dp
// rank 0 of each ep rank as `optimizer_ep<r>` (safetensors, the state JSON,
// ep_size and the optimizer's parameter names in its metadata). The same
// ep_size reads its own file (any moe_dp, zero_stage 0-2: the format is the
// Booster's unsharded one); another ep_size reads every file and maps the
// state by parameter name, because the indices name other experts there.
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster_impl.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/moe/expert_checkpoint.h"
#include "colossus/moe/moe_hybrid_parallel_plugin.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <optional>

namespace colossus::moe {

namespace {

namespace fs = std::filesystem;

constexpr const char* kEpSizeKey = "colossus.moe.ep_size";
constexpr const char* kParamNamesKey = "colossus.moe.param_names";

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

// "state.<i>.<slot>" / "master.<i>" -> (i, "state.<slot>" / "master"); false otherwise.
bool parse_tensor_name(const std::string& name, size_t& index, std::string& kind) {
  const bool master = name.rfind("master.", 0) == 0;
  if (!master && name.rfind("state.", 0) != 0) return false;
  const size_t begin = name.find('.') + 1, end = master ? name.size() : name.find('.', begin);
  if (end == std::string::npos) return false;
  try {
    index = std::stoul(name.substr(begin, end - begin));
  } catch (const std::logic_error&) {
    return false;
  }
  kind = master ? "master" : "state" + name.substr(end);
  return true;
}

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("load_optimizer: {} does not parse: {}", what, e.what()));
  }
}

// The state saved with `saved_ep` ep ranks, remapped onto `names` (this rank's
// optimizer, flat order; `group_sizes` its param groups): each parameter's
// tensors and step count are found by name in whichever file holds them.
optim::OptimizerState remap_by_name(const std::string& dir, int64_t saved_ep, const std::vector<std::string>& names,
                                    const std::vector<size_t>& group_sizes) {
  struct Entry {
    std::map<std::string, at::Tensor> tensors;  // "state.<slot>" / "master"
    std::optional<int64_t> step;
  };
  std::map<std::string, Entry> by_name;
  nlohmann::json base;  // file 0's JSON: hyper-parameters, loss scaler
  for (int64_t r = 0; r < saved_ep; ++r) {
    const std::string prefix = optimizer_prefix(static_cast<int>(r));
    const auto metadata = metadata_of(dir, prefix);
    const auto names_json = metadata.find(kParamNamesKey);
    const auto state_json = metadata.find(booster::kOptimizerStateKey);
    if (names_json == metadata.end() || state_json == metadata.end()) {
      throw CheckpointError(
          fmt::format("load_optimizer('{}'): {} lacks '{}' or '{}'; it cannot move to another ep_size", dir, prefix,
                      kParamNamesKey, booster::kOptimizerStateKey));
    }
    const auto saved_names = parse_json(names_json->second, prefix).get<std::vector<std::string>>();
    nlohmann::json j = parse_json(state_json->second, prefix);
    const nlohmann::json& inner = j.contains("inner") ? j["inner"] : j;
    for (const auto& [key, value] : inner.at("state").items()) {
      by_name[saved_names.at(std::stoul(key))].step = value.at("step").get<int64_t>();
    }
    for (auto& [tensor_name, tensor] : checkpoint::load_state_dict(dir, prefix)) {
      size_t index = 0;
      std::string kind;
      if (!parse_tensor_name(tensor_name, index, kind) || index >= saved_names.size()) {
        throw CheckpointError(
            fmt::format("load_optimizer('{}'): {} holds '{}', not state.<i>.<slot> or master.<i> of "
                        "its {} parameters",
                        dir, prefix, tensor_name, saved_names.size()));
      }
      by_name[saved_names[index]].tensors[kind] = tensor;
    }
    if (r == 0) base = std::move(j);
  }
  optim::OptimizerState out;
  nlohmann::json& inner = base.contains("inner") ? base["inner"] : base;
  auto& groups = inner.at("param_groups");
  if (groups.size() != group_sizes.size()) {
    throw CheckpointError(fmt::format("load_optimizer('{}'): the state has {} param groups, this optimizer {}", dir,
                                      groups.size(), group_sizes.size()));
  }
  for (size_t g = 0; g < group_sizes.size(); ++g) groups[g]["num_params"] = group_sizes[g];
  inner["state"] = nlohmann::json::object();
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = by_name.find(names[i]);
    if (it == by_name.end()) continue;  // never stepped
    if (it->second.step) inner["state"][std::to_string(i)] = {{"step", *it->second.step}};
    for (const auto& [kind, tensor] : it->second.tensors) {
      out.tensors.emplace_back(
          kind == "master" ? fmt::format("master.{}", i) : fmt::format("state.{}{}", i, kind.substr(5)), tensor);
    }
  }
  out.json = base.dump();
  return out;
}

class MoeCheckpointIO : public booster::PluginCheckpointIO {
 public:
  explicit MoeCheckpointIO(MoeHybridParallelPlugin& plugin) : plugin_(plugin) {}

  // tp / pp shards are not gathered here yet.
  void refuse_tp_pp(const std::string& what, const std::string& dir) const {
    if (!plugin_.has_tp_pp()) return;
    throw ConfigError(fmt::format("moe_hybrid_parallel: {}('{}') with tp_size = {} and pp_size = {} is not "
                                  "supported yet (the tp slices and pipeline stages are not gathered); checkpoint "
                                  "with tp_size = pp_size = 1 (any ep_size and zero_stage)",
                                  what, dir, plugin_.options().tp_size, plugin_.options().pp_size));
  }

  void save_model(booster::ModelWrapper& model, const std::string& dir, const booster::SaveOptions&) override {
    refuse_tp_pp("save_model", dir);
    auto& moe = moe_model(model, "save_model");
    moe.wait_for_params();
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
    refuse_tp_pp("load_model", dir);
    auto& moe = moe_model(model, "load_model");
    booster::read_on_all(*plugin_.dp_group(), fmt::format("load_model('{}')", dir), [&] {
      std::vector<std::string> names;  // the dense part and this rank's experts
      for (const auto& item : moe.unwrap().named_parameters(/*recurse=*/true)) names.push_back(item.key());
      moe.wait_for_params();
      auto state = checkpoint::load_tensors(dir, names);
      models::load_state_dict(moe.unwrap(), state, dir);
    });
  }

  void save_optimizer(optim::Optimizer& optimizer, const std::string& dir,
                      const booster::SaveOptions& options) override {
    refuse_tp_pp("save_optimizer", dir);
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
        shard_options.metadata[kParamNamesKey] = nlohmann::json(plugin_.optimizer_param_names()).dump();
        checkpoint::save_sharded(dir, state.tensors, shard_options);
      } catch (...) {
        error = std::current_exception();
      }
    }
    booster::agree_on_success(*plugin_.dp_group(), error, fmt::format("save_optimizer('{}')", dir));
  }

  void load_optimizer(optim::Optimizer& optimizer, const std::string& dir) override {
    refuse_tp_pp("load_optimizer", dir);
    auto ep = plugin_.ep_group();
    booster::read_on_all(*plugin_.dp_group(), fmt::format("load_optimizer('{}')", dir), [&] {
      const auto first = metadata_of(dir, optimizer_prefix(0));
      const auto saved_ep = first.find(kEpSizeKey);
      if (saved_ep == first.end()) {
        throw CheckpointError(
            fmt::format("load_optimizer('{}'): {} has no '{}' metadata; it was not written by "
                        "MoeHybridParallelPlugin",
                        dir, optimizer_prefix(0), kEpSizeKey));
      }
      if (saved_ep->second != std::to_string(ep->size())) {
        std::vector<size_t> group_sizes;
        for (const auto& group : optimizer.param_groups()) group_sizes.push_back(group.params.size());
        const auto state =
            remap_by_name(dir, std::stoll(saved_ep->second), plugin_.optimizer_param_names(), group_sizes);
        try {
          optimizer.load_state_dict(state);
        } catch (const CheckpointError& e) {
          throw CheckpointError(
              fmt::format("load_optimizer('{}', saved with ep_size {}): {}", dir, saved_ep->second, e.what()));
        }
        return;
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
