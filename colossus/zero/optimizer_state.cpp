// The unsharded optimizer-state format of ZeRO and Gemini (see
// optimizer_state.h).
#include "colossus/zero/optimizer_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "colossus/core/errors.h"

namespace colossus::zero {

namespace {

// "state.<i>.<slot>" -> (i, slot); false for other names.
bool parse_state_name(const std::string& name, size_t& index, std::string& slot) {
  const size_t dot1 = name.find('.'), dot2 = name.find('.', dot1 + 1);
  if (name.rfind("state.", 0) != 0 || dot2 == std::string::npos) return false;
  try {
    index = std::stoul(name.substr(dot1 + 1, dot2 - dot1 - 1));
  } catch (const std::logic_error&) {
    return false;
  }
  slot = name.substr(dot2 + 1);
  return true;
}

}  // namespace

int writer_rank(const Layout& layout, size_t param_index, int dp_size) {
  const ParamSlot& slot = layout.slots.at(param_index);
  if (!slot.managed) return 0;
  const int64_t shard = layout.buckets.at(slot.bucket).shard_numel;
  return static_cast<int>(std::min<int64_t>(slot.offset / std::max<int64_t>(shard, 1), dp_size - 1));
}

std::vector<std::pair<std::string, at::Tensor>> gather_state_tensors(const ShardedStateLayout& layout,
                                                                     const optim::OptimizerState& local,
                                                                     bool with_masters,
                                                                     const std::function<bool(size_t)>& keep) {
  at::NoGradGuard no_grad;
  const auto& params = *layout.params;
  const auto& slots = layout.layout->slots;
  const auto& inner_order = *layout.inner_order;
  // Local state tensors by (parameter index, slot).
  std::map<std::pair<size_t, std::string>, at::Tensor> parts;
  std::set<std::string> slot_names;
  for (const auto& [name, tensor] : local.tensors) {
    size_t index = 0;
    std::string slot;
    if (!parse_state_name(name, index, slot) || index >= inner_order.size()) {
      throw CheckpointError(fmt::format("{}: inner state tensor '{}' is not state.<index>.<slot>", layout.name, name));
    }
    parts[{inner_order[index], slot}] = tensor;
    slot_names.insert(slot);
  }
  std::vector<size_t> inner_index_of(params.size(), 0);
  for (size_t i = 0; i < inner_order.size(); ++i) inner_index_of[inner_order[i]] = i;

  std::vector<std::pair<std::string, at::Tensor>> out;
  // One bucket at a time: each rank's part into its shard, all-gathered, and
  // the kept parameters cut out of the whole bucket.
  auto gather_bucket = [&](size_t b, const std::function<at::Tensor(size_t)>& part_of,
                           const std::function<std::string(size_t)>& name_of) {
    const BucketLayout& bucket = layout.layout->buckets[b];
    at::Tensor shard = at::zeros({bucket.shard_numel}, at::TensorOptions().device(layout.device).dtype(at::kFloat));
    for (size_t k : bucket.params) {
      const auto& slot = slots[k];
      if (slot.own_numel > 0) shard.narrow(0, slot.own_offset, slot.own_numel).copy_(part_of(k).reshape({-1}));
    }
    at::Tensor full = at::empty({bucket.numel}, shard.options());
    layout.group->all_gather_into(full, shard).wait();
    for (size_t k : bucket.params) {
      if (!keep(k)) continue;
      const auto& slot = slots[k];
      out.emplace_back(name_of(k), full.narrow(0, slot.offset, slot.numel).view(params[k].second.sizes()).cpu().clone());
    }
  };
  for (const auto& slot_name : slot_names) {
    for (size_t b = 0; b < layout.layout->buckets.size(); ++b) {
      gather_bucket(
          b, [&](size_t k) { return parts.at({k, slot_name}); },
          [&](size_t k) { return fmt::format("state.{}.{}", inner_index_of[k], slot_name); });
    }
  }
  if (with_masters) {
    for (size_t b = 0; b < layout.layout->buckets.size(); ++b) {
      gather_bucket(b, layout.master_view, [&](size_t k) { return fmt::format("master.{}", inner_index_of[k]); });
    }
  }
  return out;
}

std::string mixed_precision_json(const std::string& inner_name, const std::string& inner_json,
                                 const std::optional<std::string>& loss_scaler_json, int64_t skipped_steps) {
  nlohmann::json j;
  j["optimizer"] = "MixedPrecision[" + inner_name + "]";
  j["inner"] = nlohmann::json::parse(inner_json);
  j["loss_scaler"] = loss_scaler_json ? nlohmann::json::parse(*loss_scaler_json) : nlohmann::json();
  j["skipped_steps"] = skipped_steps;
  return j.dump();
}

RankState split_state(const ShardedStateLayout& layout, const optim::OptimizerState& state, bool has_scaler,
                      const std::string& precision) {
  const auto& params = *layout.params;
  const auto& slots = layout.layout->slots;
  const auto& inner_order = *layout.inner_order;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(state.json);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: optimizer state JSON does not parse: {}", layout.name, e.what()));
  }
  const std::string saved_by = j.is_object() ? j.value("optimizer", std::string()) : std::string();
  const bool mixed = saved_by.rfind("MixedPrecision[", 0) == 0;
  if (mixed && !j.contains("inner")) {
    throw CheckpointError(fmt::format("{}: state from '{}' has no inner state", layout.name, saved_by));
  }
  const bool scaled = mixed && j.contains("loss_scaler") && !j["loss_scaler"].is_null();
  if (scaled && !has_scaler) {
    throw CheckpointError(
        fmt::format("{}: state was saved with fp16 loss scaling but precision is '{}'", layout.name, precision));
  }
  RankState out;
  out.inner.json = mixed ? j["inner"].dump() : state.json;
  if (scaled) out.loss_scaler_json = j["loss_scaler"].dump();
  out.skipped_steps = mixed ? j.value("skipped_steps", int64_t{0}) : 0;
  for (const auto& [tensor_name, tensor] : state.tensors) {
    const bool is_master = tensor_name.rfind("master.", 0) == 0;
    size_t index = 0;
    std::string slot;
    if (is_master) {
      try {
        index = std::stoul(tensor_name.substr(7));
      } catch (const std::logic_error&) {
        index = inner_order.size();
      }
    } else if (!parse_state_name(tensor_name, index, slot)) {
      throw CheckpointError(fmt::format("{}: state tensor '{}' is neither state.<index>.<slot> nor master.<index>",
                                        layout.name, tensor_name));
    }
    if (index >= inner_order.size()) {
      throw CheckpointError(fmt::format("{}: state tensor '{}' is for parameter {} but there are only {}", layout.name,
                                        tensor_name, index, inner_order.size()));
    }
    const size_t k = inner_order[index];
    const at::Tensor& param = params[k].second;
    if (tensor.numel() != param.numel()) {
      throw CheckpointError(fmt::format("{}: '{}' has shape {} but parameter '{}' has shape {}", layout.name,
                                        tensor_name, tensor.sizes(), params[k].first, param.sizes()));
    }
    if (is_master) {
      out.masters.emplace_back(k, tensor);
      continue;
    }
    // This rank's part, on the master's device, in the shape of its view.
    at::Tensor part = owned_part(tensor.reshape({-1}), slots[k])
                          .to(layout.master_view(k).device(), tensor.scalar_type(), false, /*copy=*/true);
    out.inner.tensors.emplace_back(tensor_name, std::move(part));
  }
  return out;
}

}  // namespace colossus::zero
