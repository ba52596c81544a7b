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
// Every call is collective over the world; an error anywhere throws on all.
#include "colossus/amp/mixed_precision_optimizer.h"
#include "colossus/booster/booster_impl.h"
#include "colossus/booster/hybrid_parallel_plugin.h"
#include "colossus/checkpoint/file_io.h"
#include "colossus/checkpoint/hf_index.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/cluster/launch.h"
#include "colossus/core/errors.h"
#include "colossus/core/precision.h"
#include "colossus/models/pretrained.h"
#include "colossus/zero/low_level/low_level_zero_optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <filesystem>
#include <set>
#include <unordered_map>

namespace colossus::booster {

namespace {

namespace fs = std::filesystem;

std::string hf_dtype(c10::ScalarType dtype) {
  if (auto name = precision_of(dtype)) return hf_dtype_name(*name);
  throw CheckpointError(fmt::format("save_model: no Hugging Face torch_dtype for {}", c10::toString(dtype)));
}

// "state.12.exp_avg" / "master.12" -> 12; -1 when the name has no index.
int64_t param_index(const std::string& name) {
  const auto first = name.find('.');
  if (first == std::string::npos) return -1;
  const auto second = name.find('.', first + 1);
  const std::string digits =
      name.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// The optimizer state JSON without the step counts of `indices` (at the top
// level and in a mixed-precision wrapper's "inner" state): a pipeline rank
// gets no moments for another stage's parameters, and a step count without
// moments reads as an incomplete checkpoint.
std::string without_steps_of(const std::string& json_text, const std::set<int64_t>& indices) {
  if (indices.empty()) return json_text;
  auto j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return json_text;  // the optimizer reports it
  for (auto* level : {&j, j.contains("inner") ? &j["inner"] : nullptr}) {
    if (level == nullptr || !level->is_object() || !level->contains("state") || !(*level)["state"].is_object()) continue;
    for (int64_t index : indices) (*level)["state"].erase(std::to_string(index));
  }
  return j.dump();
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
      checkpoint::NamedTensors tensors;
      for (const auto& item : hybrid.unwrap().named_parameters(/*recurse=*/true)) {
        const std::string& name = item.key();
        tensors.emplace_back(name, full_of(hybrid, name, from_stage(hybrid, name, item.value().detach())));
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
        if (hybrid.pipeline() && !hybrid.pipeline()->holds(item.key())) continue;
        // Floating-point precisions convert; an integer tensor into a float
        // parameter is no precision change (as models::load_state_dict).
        const auto stored = it->second.scalar_type(), wanted = item.value().scalar_type();
        if (stored != wanted && !(at::isFloatingType(stored) && at::isFloatingType(wanted))) {
          throw CheckpointError(fmt::format("load_model('{}'): {} is {} in the checkpoint, the model needs {}; only "
                                            "floating-point precisions convert",
                                            dir, item.key(), c10::toString(stored), c10::toString(wanted)));
        }
        at::Tensor local = slice_of(hybrid, item.key(), it->second.to(wanted));
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
      const auto names = param_names(hybrid, optimizer);
      optim::OptimizerState state = optimizer.state_dict();
      if (hybrid.pipeline() != nullptr) state = merge_over_pp(hybrid, names, std::move(state));
      checkpoint::NamedTensors full;
      for (auto& [name, tensor] : state.tensors) full.emplace_back(name, full_state(hybrid, names, name, tensor));
      if (world.rank() == 0) {
        checkpoint::ShardOptions shard{.max_shard_bytes = options.size_per_shard_mb * (int64_t{1} << 20),
                                       .prefix = kOptimizerPrefix};
        shard.metadata[kOptimizerStateKey] = state.json;
        checkpoint::save_sharded(dir, full, shard);
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
      const auto names = param_names(hybrid, optimizer);
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
      optim::OptimizerState state;
      std::set<int64_t> other_stages;
      for (auto& [name, tensor] : checkpoint::load_state_dict(dir, kOptimizerPrefix)) {
        const int64_t index = param_index(name);
        // Pipeline: another stage steps this parameter (its JSON step count
        // goes too, below).
        if (hybrid.pipeline() != nullptr && index >= 0 && index < static_cast<int64_t>(names.size()) &&
            hybrid.pipeline()->placements().contains(names[index].first) &&
            !hybrid.pipeline()->holds(names[index].first)) {
          other_stages.insert(index);
          continue;
        }
        const bool sharded = index >= 0 && index < static_cast<int64_t>(names.size()) &&
                             hybrid.sharded().specs.contains(names[index].first);
        if (sharded) {
          const auto& spec = hybrid.sharded().specs.at(names[index].first);
          // Only state shaped like the parameter is split (a scalar stays whole).
          if (tensor.dim() > spec.dim && tensor.size(spec.dim) == spec.true_size) {
            state.tensors.emplace_back(name, parallel::plan::slice_for_rank(tensor, spec, tp_rank()));
            continue;
          }
        }
        state.tensors.emplace_back(name, tensor);
      }
      state.json = without_steps_of(json->second, other_stages);
      optimizer.load_state_dict(state);
    } catch (...) {
      error = std::current_exception();
    }
    agree_on_success(*plugin_.mesh().world(), error, fmt::format("load_optimizer('{}')", dir));
  }

 private:
  int tp_rank() const { return plugin_.tp_group()->rank(); }

  // Pipeline: the owning stage's tensor, broadcast over pp (every rank then
  // holds it for the tp gather); without a pipeline, `local` itself.
  at::Tensor from_stage(HybridParallelModel& hybrid, const std::string& name, const at::Tensor& local) {
    auto* pipeline = hybrid.pipeline();
    if (pipeline == nullptr) return local;
    const auto it = pipeline->placements().find(name);
    if (it == pipeline->placements().end()) return local;
    auto pp = plugin_.pp_group();
    at::Tensor tensor = it->second.pp_rank == pp->rank() ? local.contiguous()
                                                         : at::empty(it->second.local_shape, local.options());
    pp->broadcast(tensor, it->second.pp_rank).wait();
    return tensor;
  }

  // Every rank's `mine`, in rank order (lengths first, then padded bytes).
  std::vector<std::string> all_gather_strings(cluster::ProcessGroup& group, const std::string& mine) {
    const auto device = group.device();
    at::Tensor length = at::full({1}, static_cast<int64_t>(mine.size()), at::TensorOptions(at::kLong).device(device));
    std::vector<at::Tensor> lengths;
    for (int r = 0; r < group.size(); ++r) lengths.push_back(at::empty_like(length));
    group.all_gather(lengths, length).wait();
    int64_t longest = 1;
    for (auto& l : lengths) longest = std::max(longest, l.cpu().item<int64_t>());
    at::Tensor bytes = at::zeros({longest}, at::kByte);
    std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), mine.size());
    bytes = bytes.to(device);
    std::vector<at::Tensor> all;
    for (int r = 0; r < group.size(); ++r) all.push_back(at::empty_like(bytes));
    group.all_gather(all, bytes).wait();
    std::vector<std::string> out;
    for (int r = 0; r < group.size(); ++r) {
      at::Tensor host = all[static_cast<size_t>(r)].cpu();
      out.emplace_back(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()),
                       static_cast<size_t>(lengths[static_cast<size_t>(r)].cpu().item<int64_t>()));
    }
    return out;
  }

  // Objects merge key by key (the first writer of a key wins): each stage's
  // "state" lists only the parameters it steps.
  static void merge_json(nlohmann::json& into, const nlohmann::json& from) {
    if (!into.is_object() || !from.is_object()) return;
    for (const auto& [key, value] : from.items()) {
      if (!into.contains(key)) {
        into[key] = value;
      } else {
        merge_json(into[key], value);
      }
    }
  }

  // The pp rank whose state tensor `name` is: the stage holding its parameter
  // (a tied embedding's first stage); pp rank 0 for state of no parameter.
  int owner_of(HybridParallelModel& hybrid, const std::vector<std::pair<std::string, std::vector<int64_t>>>& names,
               const std::string& name) {
    const int64_t index = param_index(name);
    if (index < 0 || index >= static_cast<int64_t>(names.size())) return 0;
    const auto& placements = hybrid.pipeline()->placements();
    const auto it = placements.find(names[static_cast<size_t>(index)].first);
    return it == placements.end() ? 0 : it->second.pp_rank;
  }

  // Every stage's optimizer state on every pp rank (collective over pp): the
  // JSON merged, each tensor broadcast from its owner. Every rank ends with
  // the same tensor list in the same order, as the tp gather needs.
  optim::OptimizerState merge_over_pp(HybridParallelModel& hybrid,
                                      const std::vector<std::pair<std::string, std::vector<int64_t>>>& names,
                                      optim::OptimizerState local) {
    auto pp = plugin_.pp_group();
    nlohmann::json manifest = {{"json", local.json}, {"tensors", nlohmann::json::array()}};
    std::map<std::string, at::Tensor> mine;
    for (auto& [name, tensor] : local.tensors) {
      if (owner_of(hybrid, names, name) != pp->rank()) continue;
      manifest["tensors"].push_back(
          {{"name", name}, {"shape", tensor.sizes().vec()}, {"dtype", static_cast<int>(tensor.scalar_type())}});
      mine.emplace(name, tensor);
    }
    optim::OptimizerState merged;
    nlohmann::json json;
    const auto manifests = all_gather_strings(*pp, manifest.dump());
    for (int r = 0; r < pp->size(); ++r) {
      const auto other = nlohmann::json::parse(manifests[static_cast<size_t>(r)]);
      const auto state = nlohmann::json::parse(other.at("json").get<std::string>());
      if (r == 0) {
        json = state;
      } else {
        merge_json(json, state);
      }
      for (const auto& entry : other.at("tensors")) {
        const auto name = entry.at("name").get<std::string>();
        at::Tensor tensor;
        if (r == pp->rank()) {
          tensor = mine.at(name).contiguous();
        } else {
          const auto device = mine.empty() ? pp->device() : mine.begin()->second.device();
          tensor = at::empty(entry.at("shape").get<std::vector<int64_t>>(),
                             at::TensorOptions(static_cast<c10::ScalarType>(entry.at("dtype").get<int>())).device(device));
        }
        pp->broadcast(tensor, r).wait();
        merged.tensors.emplace_back(name, tensor);
      }
    }
    merged.json = json.dump();
    return merged;
  }

  at::Tensor full_of(HybridParallelModel& hybrid, const std::string& name, const at::Tensor& local) {
    auto it = hybrid.sharded().specs.find(name);
    if (it == hybrid.sharded().specs.end()) return local.detach();
    return parallel::plan::gather_full(local, it->second, *plugin_.tp_group());
  }
  at::Tensor slice_of(HybridParallelModel& hybrid, const std::string& name, const at::Tensor& full) {
    auto it = hybrid.sharded().specs.find(name);
    if (it == hybrid.sharded().specs.end()) return full;
    if (full.dim() <= it->second.dim || full.size(it->second.dim) != it->second.true_size) {
      throw CheckpointError(fmt::format("load_model: {} has shape {}, expected {} along dim {}", name,
                                        c10::str(full.sizes()), it->second.true_size, it->second.dim));
    }
    return parallel::plan::slice_for_rank(full, it->second, tp_rank());
  }

  // (parameter name, local shape) of each optimizer parameter, flat order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> param_names(HybridParallelModel& hybrid,
                                                                        const optim::Optimizer& optimizer) {
    std::unordered_map<const c10::TensorImpl*, std::string> by_impl;
    for (const auto& item : hybrid.unwrap().named_parameters(/*recurse=*/true)) {
      by_impl[item.value().unsafeGetTensorImpl()] = item.key();
    }
    std::vector<std::pair<std::string, std::vector<int64_t>>> names;
    for (const auto& group : optimizer.param_groups()) {
      for (const auto& p : group.params) {
        auto it = by_impl.find(p.unsafeGetTensorImpl());
        const std::string name = it == by_impl.end() ? std::string() : it->second;
        names.emplace_back(name, p.sizes().vec());
        // Pipeline: another stage's parameter is empty here, but its state
        // arrives from its owner (merge_over_pp) with the local (tp) shape,
        // which the tp gather must recognise.
        if (hybrid.pipeline() != nullptr) {
          const auto placement = hybrid.pipeline()->placements().find(name);
          if (placement != hybrid.pipeline()->placements().end()) names.back().second = placement->second.local_shape;
        }
      }
    }
    return names;
  }

  at::Tensor full_state(HybridParallelModel& hybrid,
                        const std::vector<std::pair<std::string, std::vector<int64_t>>>& names, const std::string& name,
                        const at::Tensor& tensor) {
    const int64_t index = param_index(name);
    if (index < 0 || index >= static_cast<int64_t>(names.size())) return tensor;
    if (tensor.sizes().vec() != names[index].second) return tensor;  // not shaped like the parameter
    return full_of(hybrid, names[index].first, tensor);
  }

  const HybridParallelPlugin& plugin_;
};

}  // namespace

std::unique_ptr<PluginCheckpointIO> make_hybrid_parallel_checkpoint_io(const HybridParallelPlugin& plugin) {
  return std::make_unique<HybridParallelCheckpointIO>(plugin);
}

}  // namespace colossus::booster
