#include "colossus/optim/stateful_optimizer.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace colossus::optim {

std::vector<ParamGroup> single_group(std::vector<at::Tensor> params, double lr, double weight_decay) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(params);
  groups[0].lr = lr;
  groups[0].weight_decay = weight_decay;
  return groups;
}

StatefulOptimizer::StatefulOptimizer(std::vector<ParamGroup> groups, std::map<std::string, double> option_defaults)
    : Optimizer(std::move(groups)), option_defaults_(std::move(option_defaults)) {}

void StatefulOptimizer::finish_construction() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& [key, value] : groups_[g].options) {
      if (!option_defaults_.contains(key)) {
        std::vector<std::string> known;
        for (const auto& [k, v] : option_defaults_) known.push_back(k);
        throw ConfigError(fmt::format("{}: param group {} has option '{}' that {} does not know; known options: {}",
                                      name(), g, key, name(), fmt::join(known, ", ")));
      }
    }
    for (const auto& [key, value] : option_defaults_) groups_[g].options.try_emplace(key, value);
  }
  validate_all_groups();
}

void StatefulOptimizer::validate_all_groups() const {
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    if (!(group.lr >= 0.0) || !std::isfinite(group.lr)) {
      throw ConfigError(fmt::format("{}: lr={} in param group {} is invalid; use a finite lr >= 0, e.g. 1e-3", name(),
                                    group.lr, g));
    }
    if (!(group.weight_decay >= 0.0) || !std::isfinite(group.weight_decay)) {
      throw ConfigError(fmt::format("{}: weight_decay={} in param group {} is invalid; use a finite value >= 0, e.g. 0.01",
                                    name(), group.weight_decay, g));
    }
    for (size_t i = 0; i < group.params.size(); ++i) {
      if (!group.params[i].defined()) {
        throw ConfigError(fmt::format("{}: parameter {} of param group {} is an undefined tensor", name(), i, g));
      }
      if (!at::isFloatingType(group.params[i].scalar_type())) {
        throw ConfigError(fmt::format("{}: parameter {} of param group {} has dtype {}; use float32, float64, "
                                      "bfloat16 or float16",
                                      name(), i, g, c10::toString(group.params[i].scalar_type())));
      }
    }
    validate_group(group, g);
  }
}

void StatefulOptimizer::reject_unused_group_defaults(bool lr_changed, bool weight_decay_changed) const {
  if (lr_changed || weight_decay_changed) {
    throw ConfigError(fmt::format("{}: {} in the options is not used when explicit param groups are given (each "
                                  "ParamGroup carries its own lr and weight_decay); set them on the groups instead",
                                  name(), lr_changed ? "lr" : "weight_decay"));
  }
}

StatefulOptimizer::ParamState& StatefulOptimizer::state_at(int64_t flat_index) {
  if (static_cast<size_t>(flat_index) >= state_.size()) state_.resize(static_cast<size_t>(flat_index) + 1);
  return state_[static_cast<size_t>(flat_index)];
}

double StatefulOptimizer::option(const ParamGroup& group, const std::string& key) const {
  auto it = group.options.find(key);
  if (it != group.options.end()) return it->second;
  return option_defaults_.at(key);
}

at::Tensor& StatefulOptimizer::slot(ParamState& state, const std::string& name, const at::Tensor& like) {
  at::Tensor& t = state.slots[name];
  if (!t.defined()) t = at::zeros_like(like, at::MemoryFormat::Preserve);
  return t;
}

void StatefulOptimizer::for_each_param_with_grad(const UpdateFn& fn) {
  at::NoGradGuard no_grad;
  int64_t flat = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    for (const at::Tensor& param : group.params) {
      const int64_t index = flat++;
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) {
        throw ConfigError(fmt::format("{}: parameter {} has a sparse gradient; only dense gradients are supported",
                                      name(), index));
      }
      ParamState& state = state_at(index);
      const auto dtype = param.scalar_type();
      if (dtype == at::kFloat || dtype == at::kDouble) {
        at::Tensor p = param;
        fn(group, p, grad.to(dtype), state);
      } else {
        at::Tensor p32 = param.to(at::kFloat);
        fn(group, p32, grad.to(at::kFloat), state);
        param.copy_(p32);
      }
    }
  }
}

std::vector<at::Tensor> StatefulOptimizer::state_tensors(int64_t flat_index) const {
  std::vector<at::Tensor> out;
  if (flat_index < 0 || static_cast<size_t>(flat_index) >= state_.size()) return out;
  for (const auto& [name, tensor] : state_[static_cast<size_t>(flat_index)].slots) out.push_back(tensor);
  return out;
}

OptimizerState StatefulOptimizer::state_dict() const {
  OptimizerState out;
  nlohmann::json j;
  j["optimizer"] = name();
  j["param_groups"] = nlohmann::json::array();
  int64_t flat = 0;
  for (const ParamGroup& group : groups_) {
    nlohmann::json g;
    g["lr"] = group.lr;
    g["weight_decay"] = group.weight_decay;
    g["options"] = group.options;
    g["num_params"] = group.params.size();
    j["param_groups"].push_back(g);
    flat += static_cast<int64_t>(group.params.size());
  }
  j["state"] = nlohmann::json::object();
  for (size_t i = 0; i < state_.size() && static_cast<int64_t>(i) < flat; ++i) {
    const ParamState& s = state_[i];
    if (s.step == 0 && s.slots.empty()) continue;
    j["state"][std::to_string(i)] = {{"step", s.step}};
    for (const auto& [slot_name, tensor] : s.slots) {
      // A copy: training on must not change a state dict already taken.
      out.tensors.emplace_back(fmt::format("state.{}.{}", i, slot_name), tensor.detach().clone());
    }
  }
  out.json = j.dump();
  return out;
}

void StatefulOptimizer::load_state_dict(const OptimizerState& state) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(state.json);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: optimizer state JSON does not parse: {}", name(), e.what()));
  }
  try {
    if (j.value("optimizer", std::string()) != name()) {
      throw CheckpointError(fmt::format("optimizer state is for '{}', but this optimizer is '{}'",
                                        j.value("optimizer", std::string("?")), name()));
    }
    const auto& jgroups = j.at("param_groups");
    if (jgroups.size() != groups_.size()) {
      throw CheckpointError(fmt::format("{}: optimizer state has {} param groups, this optimizer has {}", name(),
                                        jgroups.size(), groups_.size()));
    }
    std::vector<at::Tensor> flat_params;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const size_t n = jgroups[g].at("num_params").get<size_t>();
      if (n != groups_[g].params.size()) {
        throw CheckpointError(fmt::format("{}: param group {} has {} parameters in the state but {} here", name(), g,
                                          n, groups_[g].params.size()));
      }
      for (const auto& p : groups_[g].params) flat_params.push_back(p);
    }
    std::vector<ParamState> loaded(flat_params.size());
    for (const auto& [key, value] : j.at("state").items()) {
      const size_t index = std::stoul(key);
      if (index >= loaded.size()) {
        throw CheckpointError(fmt::format("{}: state for parameter {} but there are only {}", name(), index,
                                          loaded.size()));
      }
      const int64_t step = value.at("step").get<int64_t>();
      if (step < 0) {
        throw CheckpointError(fmt::format("{}: state of parameter {} has step {}; a step count is >= 0", name(), index,
                                          step));
      }
      loaded[index].step = step;
    }
    const auto known_slots = slot_names();
    for (const auto& [tensor_name, tensor] : state.tensors) {
      // "state.<index>.<slot>"
      const size_t dot1 = tensor_name.find('.'), dot2 = tensor_name.find('.', dot1 + 1);
      if (tensor_name.rfind("state.", 0) != 0 || dot2 == std::string::npos) {
        throw CheckpointError(fmt::format("{}: optimizer state tensor '{}' is not named state.<index>.<slot>", name(),
                                          tensor_name));
      }
      const size_t index = std::stoul(tensor_name.substr(dot1 + 1, dot2 - dot1 - 1));
      const std::string slot_name = tensor_name.substr(dot2 + 1);
      if (index >= flat_params.size()) {
        throw CheckpointError(fmt::format("{}: state tensor '{}' is for parameter {} but there are only {}", name(),
                                          tensor_name, index, flat_params.size()));
      }
      if (std::find(known_slots.begin(), known_slots.end(), slot_name) == known_slots.end()) {
        throw CheckpointError(fmt::format("{}: state tensor '{}' has slot '{}' that {} does not use; known: {}", name(),
                                          tensor_name, slot_name, name(), fmt::join(known_slots, ", ")));
      }
      const at::Tensor& param = flat_params[index];
      if (tensor.sizes() != param.sizes()) {
        throw CheckpointError(fmt::format("{}: state tensor '{}' has shape {} but parameter {} has shape {}", name(),
                                          tensor_name, tensor.sizes(), index, param.sizes()));
      }
      if (!at::isFloatingType(tensor.scalar_type())) {
        throw CheckpointError(fmt::format("{}: state tensor '{}' has dtype {}; optimizer state is floating point",
                                          name(), tensor_name, c10::toString(tensor.scalar_type())));
      }
      if (loaded[index].slots.contains(slot_name)) {
        throw CheckpointError(fmt::format("{}: state tensor '{}' appears twice", name(), tensor_name));
      }
      const auto dtype = param.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      loaded[index].slots[slot_name] = tensor.to(param.device(), dtype, /*non_blocking=*/false, /*copy=*/true);
    }
    // Hyper-parameters come back too (as torch's load_state_dict does).
    std::vector<ParamGroup> restored = groups_;
    for (size_t g = 0; g < groups_.size(); ++g) {
      restored[g].lr = jgroups[g].at("lr").get<double>();
      restored[g].weight_decay = jgroups[g].at("weight_decay").get<double>();
      restored[g].options = jgroups[g].at("options").get<std::map<std::string, double>>();
    }
    // Every updated parameter has each slot its group's options use: a
    // missing moment would restart from zeros and the resume would no longer
    // be exact.
    size_t flat = 0;
    for (size_t g = 0; g < restored.size(); ++g) {
      const auto required = required_slots(restored[g]);
      for (size_t i = 0; i < restored[g].params.size(); ++i, ++flat) {
        if (loaded[flat].step == 0) continue;
        for (const auto& slot_name : required) {
          if (!loaded[flat].slots.contains(slot_name)) {
            throw CheckpointError(fmt::format("{}: parameter {} was updated {} times but its state lacks "
                                              "'state.{}.{}'; the optimizer checkpoint is incomplete",
                                              name(), flat, loaded[flat].step, flat, slot_name));
          }
        }
      }
    }
    std::swap(groups_, restored);
    try {
      finish_construction();
    } catch (const ConfigError& e) {
      std::swap(groups_, restored);
      throw CheckpointError(fmt::format("{}: the loaded hyper-parameters are invalid: {}", name(), e.what()));
    }
    state_ = std::move(loaded);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: optimizer state JSON lacks a field: {}", name(), e.what()));
  } catch (const std::logic_error& e) {  // std::stoul on a bad index
    throw CheckpointError(fmt::format("{}: optimizer state has a bad parameter index: {}", name(), e.what()));
  }
}

}  // namespace colossus::optim
