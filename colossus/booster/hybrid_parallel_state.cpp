#include "colossus/booster/hybrid_parallel_state.h"

#include "colossus/core/errors.h"
#include "colossus/parallel/plan/plan.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>

namespace colossus::booster {

namespace {

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
void merge_json(nlohmann::json& into, const nlohmann::json& from) {
  if (!into.is_object() || !from.is_object()) return;
  for (const auto& [key, value] : from.items()) {
    if (!into.contains(key)) {
      into[key] = value;
    } else {
      merge_json(into[key], value);
    }
  }
}

}  // namespace

int64_t optimizer_param_index(const std::string& name) {
  const auto first = name.find('.');
  if (first == std::string::npos) return -1;
  const auto second = name.find('.', first + 1);
  const std::string digits =
      name.substr(first + 1, second == std::string::npos ? std::string::npos : second - first - 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// A pipeline rank gets no moments for another stage's parameters, and a step
// count without moments reads as an incomplete checkpoint.
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

HybridParallelState::HybridParallelState(HybridParallelModel& model, cluster::ProcessGroupPtr tp,
                                         cluster::ProcessGroupPtr pp)
    : model_(model), tp_(std::move(tp)), pp_(std::move(pp)) {}

at::Tensor HybridParallelState::from_stage(const std::string& name, const at::Tensor& local) {
  auto* pipeline = model_.pipeline();
  if (pipeline == nullptr) return local;
  const auto it = pipeline->placements().find(name);
  if (it == pipeline->placements().end()) return local;
  at::Tensor tensor =
      it->second.pp_rank == pp_->rank() ? local.contiguous() : at::empty(it->second.local_shape, local.options());
  pp_->broadcast(tensor, it->second.pp_rank).wait();
  return tensor;
}

at::Tensor HybridParallelState::full_parameter(const std::string& name, const at::Tensor& local) {
  at::Tensor staged = from_stage(name, local.detach());
  auto it = model_.sharded().specs.find(name);
  if (it == model_.sharded().specs.end()) return staged;
  return parallel::plan::gather_full(staged, it->second, *tp_);
}

at::Tensor HybridParallelState::slice_parameter(const std::string& name, const at::Tensor& full) const {
  auto it = model_.sharded().specs.find(name);
  if (it == model_.sharded().specs.end()) return full;
  if (full.dim() <= it->second.dim || full.size(it->second.dim) != it->second.true_size) {
    throw CheckpointError(fmt::format("load_model: {} has shape {}, expected {} along dim {}", name,
                                      c10::str(full.sizes()), it->second.true_size, it->second.dim));
  }
  return parallel::plan::slice_for_rank(full, it->second, tp_->rank());
}

bool HybridParallelState::holds(const std::string& name) const {
  return model_.pipeline() == nullptr || model_.pipeline()->holds(name);
}

HybridParallelState::ParamNames HybridParallelState::param_names(const optim::Optimizer& optimizer) const {
  std::unordered_map<const c10::TensorImpl*, std::string> by_impl;
  for (const auto& item : model_.unwrap().named_parameters(/*recurse=*/true)) {
    by_impl[item.value().unsafeGetTensorImpl()] = item.key();
  }
  ParamNames names;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params) {
      auto it = by_impl.find(p.unsafeGetTensorImpl());
      const std::string name = it == by_impl.end() ? std::string() : it->second;
      names.emplace_back(name, p.sizes().vec());
      // Pipeline: another stage's parameter is empty here, but its state
      // arrives from its owner (merge_over_pp) with the local (tp) shape,
      // which the tp gather must recognise.
      if (model_.pipeline() != nullptr) {
        const auto placement = model_.pipeline()->placements().find(name);
        if (placement != model_.pipeline()->placements().end()) names.back().second = placement->second.local_shape;
      }
    }
  }
  return names;
}

// The stage holding the parameter of state tensor `state_name` (a tied
// embedding's first stage); pp rank 0 for state of no parameter.
int HybridParallelState::owner_of(const ParamNames& names, const std::string& state_name) const {
  const int64_t index = optimizer_param_index(state_name);
  if (index < 0 || index >= static_cast<int64_t>(names.size())) return 0;
  const auto& placements = model_.pipeline()->placements();
  const auto it = placements.find(names[static_cast<size_t>(index)].first);
  return it == placements.end() ? 0 : it->second.pp_rank;
}

// Every rank ends with the same tensor list in the same order, as the tp
// gather needs.
optim::OptimizerState HybridParallelState::merge_over_pp(const ParamNames& names, optim::OptimizerState local) {
  nlohmann::json manifest = {{"json", local.json}, {"tensors", nlohmann::json::array()}};
  std::map<std::string, at::Tensor> mine;
  for (auto& [name, tensor] : local.tensors) {
    if (owner_of(names, name) != pp_->rank()) continue;
    manifest["tensors"].push_back(
        {{"name", name}, {"shape", tensor.sizes().vec()}, {"dtype", static_cast<int>(tensor.scalar_type())}});
    mine.emplace(name, tensor);
  }
  optim::OptimizerState merged;
  nlohmann::json json;
  const auto manifests = all_gather_strings(*pp_, manifest.dump());
  for (int r = 0; r < pp_->size(); ++r) {
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
      if (r == pp_->rank()) {
        tensor = mine.at(name).contiguous();
      } else {
        const auto device = mine.empty() ? pp_->device() : mine.begin()->second.device();
        tensor = at::empty(entry.at("shape").get<std::vector<int64_t>>(),
                           at::TensorOptions(static_cast<c10::ScalarType>(entry.at("dtype").get<int>())).device(device));
      }
      pp_->broadcast(tensor, r).wait();
      merged.tensors.emplace_back(name, tensor);
    }
  }
  merged.json = json.dump();
  return merged;
}

optim::OptimizerState HybridParallelState::full_optimizer_state(const ParamNames& names, optim::OptimizerState local) {
  optim::OptimizerState state = model_.pipeline() != nullptr ? merge_over_pp(names, std::move(local)) : std::move(local);
  for (auto& [name, tensor] : state.tensors) {
    const int64_t index = optimizer_param_index(name);
    if (index < 0 || index >= static_cast<int64_t>(names.size())) continue;
    const auto& [param, shape] = names[static_cast<size_t>(index)];
    if (tensor.sizes().vec() != shape) continue;  // not shaped like the parameter (a scalar)
    auto spec = model_.sharded().specs.find(param);
    if (spec != model_.sharded().specs.end()) tensor = parallel::plan::gather_full(tensor, spec->second, *tp_);
  }
  return state;
}

optim::OptimizerState HybridParallelState::local_optimizer_state(const ParamNames& names,
                                                                 optim::OptimizerState full) const {
  optim::OptimizerState state;
  std::set<int64_t> other_stages;
  for (auto& [name, tensor] : full.tensors) {
    const int64_t index = optimizer_param_index(name);
    const bool known = index >= 0 && index < static_cast<int64_t>(names.size());
    const std::string& param = known ? names[static_cast<size_t>(index)].first : std::string();
    // Pipeline: another stage steps this parameter (its step count goes too).
    if (known && model_.pipeline() != nullptr && model_.pipeline()->placements().contains(param) &&
        !model_.pipeline()->holds(param)) {
      other_stages.insert(index);
      continue;
    }
    if (known) {
      auto spec = model_.sharded().specs.find(param);
      // Only state shaped like the parameter is split (a scalar stays whole).
      if (spec != model_.sharded().specs.end() && tensor.dim() > spec->second.dim &&
          tensor.size(spec->second.dim) == spec->second.true_size) {
        state.tensors.emplace_back(name, parallel::plan::slice_for_rank(tensor, spec->second, tp_->rank()));
        continue;
      }
    }
    state.tensors.emplace_back(name, tensor);
  }
  state.json = without_steps_of(full.json, other_stages);
  return state;
}

}  // namespace colossus::booster
