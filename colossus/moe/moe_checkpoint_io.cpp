// Checkpoint IO of MoeHybridParallelPlugin. The model is one Hugging Face
// directory: experts gathered over ep, tp slices and pp stages made whole
// (booster::HybridParallelState), world rank 0 writes (expert_checkpoint.h),
// so it loads with any ep / tp / pp and into transformers; each rank loads
// only the tensors (and tp slices) its stage holds. The optimizer state is
// gathered per shard group (dense over dp, experts over moe_dp), merged over
// pp and gathered over tp, and written by one rank per ep rank as
// `optimizer_ep<r>` (safetensors, the state JSON, ep_size and the
// optimizer's parameter names in its metadata). The same ep_size and
// parameter list read their own file (any moe_dp, tp, pp, zero_stage 0-2: the
// format is the Booster's unsharded one); otherwise every file is read and
// the state mapped by parameter name, because the indices name other experts
// there. Every call agrees over the world: an error anywhere throws on all.
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster_impl.h"
#include "colossus/booster/hybrid_parallel_state.h"
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

  void save_model(booster::ModelWrapper& model, const std::string& dir, const booster::SaveOptions&) override {
    auto& moe = moe_model(model, "save_model");
    moe.wait_for_params();
    auto world = plugin_.world();
    std::exception_ptr error;
    try {
      auto layout = layout_of(moe);
      WholeParameter whole;
      if (layout) whole = [&](const std::string& name, const at::Tensor& local) { return layout->full_parameter(name, local); };
      // Collective over ep (and pp, tp); one rank of the job writes.
      save_expert_parallel_pretrained(moe.mixtral(), *moe.ep_group(), dir, world->rank() == 0, whole);
    } catch (...) {
      error = std::current_exception();
    }
    booster::agree_on_success(*world, error, fmt::format("save_model('{}')", dir));
  }

  void load_model(booster::ModelWrapper& model, const std::string& dir) override {
    auto& moe = moe_model(model, "load_model");
    booster::read_on_all(*plugin_.world(), fmt::format("load_model('{}')", dir), [&] {
      const auto layout = layout_of(moe);
      std::vector<std::string> names;  // the dense part and this rank's experts (of its stage)
      for (const auto& item : moe.unwrap().named_parameters(/*recurse=*/true)) {
        if (!layout || layout->holds(item.key())) names.push_back(item.key());
      }
      moe.wait_for_params();
      auto state = checkpoint::load_tensors(dir, names);
      if (!layout) {
        models::load_state_dict(moe.unwrap(), state, dir);
        return;
      }
      at::NoGradGuard no_grad;
      auto params = moe.unwrap().named_parameters(/*recurse=*/true);
      for (const auto& name : names) {
        at::Tensor& param = *params.find(name);
        const auto it = state.find(name);
        if (it == state.end()) throw CheckpointError(fmt::format("load_model('{}'): {} is missing", dir, name));
        if (!at::isFloatingType(it->second.scalar_type()) && it->second.scalar_type() != param.scalar_type()) {
          throw CheckpointError(fmt::format("load_model('{}'): {} is {} in the checkpoint, the model needs {}", dir,
                                            name, c10::toString(it->second.scalar_type()),
                                            c10::toString(param.scalar_type())));
        }
        const at::Tensor local = layout->slice_parameter(name, it->second.to(param.scalar_type()));
        if (local.sizes() != param.sizes()) {
          throw CheckpointError(fmt::format("load_model('{}'): {} has shape {} in the checkpoint, the model needs {}",
                                            dir, name, c10::str(it->second.sizes()), c10::str(param.sizes())));
        }
        param.copy_(local);
      }
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
    auto& moe = plugin_.boosted().current("save_optimizer");
    auto ep = plugin_.ep_group();
    std::exception_ptr error;
    try {
      // Collective under ZeRO (gathers over dp and moe_dp), then over pp and
      // tp: every rank takes part.
      optim::OptimizerState state = optimizer.state_dict();
      auto layout = layout_of(moe);
      if (layout) state = layout->full_optimizer_state(layout->param_names(optimizer), std::move(state));
      // One writer per ep rank: the rest of its moe_dp x pp x tp ranks hold the same state.
      const bool writes = plugin_.moe_dp_group()->rank() == 0 && (!plugin_.tp_group() || plugin_.tp_group()->rank() == 0) &&
                          (!plugin_.pp_group() || plugin_.pp_group()->rank() == 0);
      if (writes) {
        checkpoint::ShardOptions shard_options{.max_shard_bytes = options.size_per_shard_mb << 20,
                                               .prefix = optimizer_prefix(ep->rank())};
        shard_options.metadata[booster::kOptimizerStateKey] = std::move(state.json);
        shard_options.metadata[kEpSizeKey] = std::to_string(ep->size());
        shard_options.metadata[kParamNamesKey] = nlohmann::json(plugin_.optimizer_param_names()).dump();
        checkpoint::save_sharded(dir, state.tensors, shard_options);
      }
    } catch (...) {
      error = std::current_exception();
    }
    booster::agree_on_success(*plugin_.world(), error, fmt::format("save_optimizer('{}')", dir));
  }

  void load_optimizer(optim::Optimizer& optimizer, const std::string& dir) override {
    auto ep = plugin_.ep_group();
    booster::read_on_all(*plugin_.world(), fmt::format("load_optimizer('{}')", dir), [&] {
      auto& moe = plugin_.boosted().current("load_optimizer");
      const auto first = metadata_of(dir, optimizer_prefix(0));
      const auto saved_ep = first.find(kEpSizeKey);
      if (saved_ep == first.end()) {
        throw CheckpointError(
            fmt::format("load_optimizer('{}'): {} has no '{}' metadata; it was not written by "
                        "MoeHybridParallelPlugin",
                        dir, optimizer_prefix(0), kEpSizeKey));
      }
      const std::string prefix = optimizer_prefix(ep->rank());
      optim::OptimizerState state;
      // This ep rank's own file, when the ep_size is the same (read once).
      std::map<std::string, std::string> metadata;
      if (saved_ep->second == std::to_string(ep->size())) metadata = ep->rank() == 0 ? first : metadata_of(dir, prefix);
      if (!metadata.empty() && same_names(metadata, prefix)) {
        const auto json = metadata.find(booster::kOptimizerStateKey);
        if (json == metadata.end()) {
          throw CheckpointError(
              fmt::format("load_optimizer('{}'): {} has no '{}' metadata", dir, prefix, booster::kOptimizerStateKey));
        }
        state.json = json->second;
        for (auto& [name, tensor] : checkpoint::load_state_dict(dir, prefix)) state.tensors.emplace_back(name, tensor);
      } else {
        std::vector<size_t> group_sizes;
        for (const auto& group : optimizer.param_groups()) group_sizes.push_back(group.params.size());
        state = remap_by_name(dir, std::stoll(saved_ep->second), plugin_.optimizer_param_names(), group_sizes);
      }
      if (auto layout = layout_of(moe)) state = layout->local_optimizer_state(layout->param_names(optimizer), std::move(state));
      try {
        optimizer.load_state_dict(state);
      } catch (const CheckpointError& e) {
        throw CheckpointError(
            fmt::format("load_optimizer('{}', saved with ep_size {}): {}", dir, saved_ep->second, e.what()));
      }
    });
  }

 private:
  MoeHybridParallelPlugin& plugin_;

  // tp / pp: the whole-model view of the sharded, staged model.
  std::optional<booster::HybridParallelState> layout_of(MoeHybridParallelModel& moe) const {
    if (moe.tp_pp() == nullptr) return std::nullopt;
    return booster::HybridParallelState(*moe.tp_pp(), plugin_.tp_group_or_self(), plugin_.pp_group());
  }

  // Whether `prefix` (its metadata) was saved for this optimizer's parameter
  // list (same names, same order): its indices then are this optimizer's.
  bool same_names(const std::map<std::string, std::string>& metadata, const std::string& prefix) const {
    const auto names = metadata.find(kParamNamesKey);
    return names != metadata.end() &&
           parse_json(names->second, prefix).get<std::vector<std::string>>() == plugin_.optimizer_param_names();
  }
};

}  // namespace

std::unique_ptr<booster::PluginCheckpointIO> make_moe_checkpoint_io(MoeHybridParallelPlugin& plugin) {
  return std::make_unique<MoeCheckpointIO>(plugin);
}

}  // namespace colossus::moe
