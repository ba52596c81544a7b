// The unsharded state of LowLevelZeroOptimizer: state_dict() all-gathers each
// state slot bucket by bucket (the same chunking as the parameters) and cuts
// whole parameters out of it; load_state_dict() cuts this rank's parts out of
// whole tensors. The format is the one the Booster writes for DDP (plain
// inner state for fp32; MixedPrecisionOptimizer's for bf16/fp16), so a
// checkpoint moves between dp sizes and between ZeRO and DDP.
#include "colossus/core/errors.h"
#include "colossus/zero/low_level/low_level_zero_optimizer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <set>

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

optim::OptimizerState LowLevelZeroOptimizer::state_dict() const {
  const_cast<LowLevelZeroOptimizer*>(this)->wait_for_params();
  at::NoGradGuard no_grad;
  optim::OptimizerState local = inner_->state_dict();
  // Local state tensors by (parameter index, slot); inner flat index i is parameter inner_order_[i].
  std::map<std::pair<size_t, std::string>, at::Tensor> parts;
  std::set<std::string> slot_names;
  for (const auto& [name, tensor] : local.tensors) {
    size_t index = 0;
    std::string slot;
    if (!parse_state_name(name, index, slot) || index >= inner_order_.size()) {
      throw CheckpointError(fmt::format("{}: inner state tensor '{}' is not state.<index>.<slot>", this->name(), name));
    }
    parts[{inner_order_[index], slot}] = tensor;
    slot_names.insert(slot);
  }
  std::vector<size_t> inner_index_of(params_.size(), 0);
  for (size_t i = 0; i < inner_order_.size(); ++i) inner_index_of[inner_order_[i]] = i;

  optim::OptimizerState out;
  auto gather_bucket = [&](const Bucket& bucket, const std::function<at::Tensor(size_t)>& part_of,
                           const std::function<void(size_t, at::Tensor)>& emit) {
    const auto& layout = bucket.layout;
    const auto device = bucket.flat_params.device();
    at::Tensor chunk = at::zeros({layout.shard_numel}, bucket.master.options().dtype(at::kFloat).device(device));
    for (size_t k : layout.params) {
      const auto& slot = layout_.slots[k];
      if (slot.own_numel > 0) chunk.narrow(0, slot.own_offset, slot.own_numel).copy_(part_of(k).reshape({-1}));
    }
    at::Tensor full = at::empty({layout.numel}, chunk.options());
    shard_groups_[bucket.group].dp_group->all_gather_into(full, chunk).wait();  // experts: over moe_dp
    for (size_t k : layout.params) {
      const auto& slot = layout_.slots[k];
      emit(k, full.narrow(0, slot.offset, slot.numel).view(params_[k].second.sizes()).cpu().clone());
    }
  };
  for (const auto& slot_name : slot_names) {
    for (const auto& bucket : buckets_) {
      gather_bucket(
          bucket,
          [&](size_t k) {
            return parts.at({k, slot_name});
          },
          [&](size_t k, at::Tensor full) {
            out.tensors.emplace_back(fmt::format("state.{}.{}", inner_index_of[k], slot_name), std::move(full));
          });
    }
  }
  const bool low_precision = options_.precision != "fp32";
  if (!low_precision) {
    out.json = local.json;
    return out;
  }
  // bf16/fp16: MixedPrecisionOptimizer's format, masters by inner flat index.
  for (const auto& bucket : buckets_) {
    gather_bucket(
        bucket, [&](size_t k) { return master_views_[k]; },
        [&](size_t k, at::Tensor full) {
          out.tensors.emplace_back(fmt::format("master.{}", inner_index_of[k]), std::move(full));
        });
  }
  nlohmann::json j;
  j["optimizer"] = "MixedPrecision[" + inner_->name() + "]";
  j["inner"] = nlohmann::json::parse(local.json);
  j["loss_scaler"] = scaler_ ? nlohmann::json::parse(scaler_->state_dict()) : nlohmann::json();
  j["skipped_steps"] = skipped_steps_;
  out.json = j.dump();
  return out;
}

void LowLevelZeroOptimizer::load_state_dict(const optim::OptimizerState& state) {
  wait_for_params();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(state.json);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: optimizer state JSON does not parse: {}", name(), e.what()));
  }
  const std::string saved_by = j.value("optimizer", std::string());
  const bool mixed = saved_by.rfind("MixedPrecision[", 0) == 0;
  if (mixed && !j.contains("inner")) {
    throw CheckpointError(fmt::format("{}: state from '{}' has no inner state", name(), saved_by));
  }
  if (mixed && j.contains("loss_scaler") && !j["loss_scaler"].is_null() && !scaler_) {
    throw CheckpointError(
        fmt::format("{}: state was saved with fp16 loss scaling but precision is '{}'", name(), options_.precision));
  }
  optim::OptimizerState local;
  local.json = mixed ? j["inner"].dump() : state.json;
  std::vector<std::pair<size_t, at::Tensor>> masters;  // (parameter index, whole tensor)
  for (const auto& [tensor_name, tensor] : state.tensors) {
    const bool is_master = tensor_name.rfind("master.", 0) == 0;
    size_t index = 0;
    std::string slot;
    if (is_master) {
      try {
        index = std::stoul(tensor_name.substr(7));
      } catch (const std::logic_error&) {
        index = inner_order_.size();
      }
    } else if (!parse_state_name(tensor_name, index, slot)) {
      throw CheckpointError(
          fmt::format("{}: state tensor '{}' is neither state.<index>.<slot> nor master.<index>", name(), tensor_name));
    }
    if (index >= inner_order_.size()) {
      throw CheckpointError(fmt::format("{}: state tensor '{}' is for parameter {} but there are only {}", name(),
                                        tensor_name, index, inner_order_.size()));
    }
    const size_t k = inner_order_[index];
    const at::Tensor& param = params_[k].second;
    if (tensor.numel() != param.numel()) {
      throw CheckpointError(fmt::format("{}: '{}' has shape {} but parameter '{}' has shape {}", name(), tensor_name,
                                        tensor.sizes(), params_[k].first, param.sizes()));
    }
    if (is_master) {
      masters.emplace_back(k, tensor);
      continue;
    }
    // This rank's part, on the master's device, in the shape of its view.
    at::Tensor part = owned_part(tensor.reshape({-1}), layout_.slots[k])
                          .to(master_views_[k].device(), tensor.scalar_type(), false, /*copy=*/true);
    local.tensors.emplace_back(tensor_name, std::move(part));
  }
  inner_->load_state_dict(local);  // validates before changing anything
  if (scaler_ && mixed && j.contains("loss_scaler") && !j["loss_scaler"].is_null()) {
    scaler_->load_state_dict(j["loss_scaler"].dump());
  }
  skipped_steps_ = mixed ? j.value("skipped_steps", int64_t{0}) : 0;
  at::NoGradGuard no_grad;
  for (const auto& [k, tensor] : masters) {
    master_views_[k].copy_(owned_part(tensor.reshape({-1}), layout_.slots[k]));
  }
  const auto& inner_groups = inner_->param_groups();
  for (size_t g = 0; g < groups_.size() && g < inner_groups.size(); ++g) {
    groups_[g].lr = inner_groups[g].lr;
    groups_[g].weight_decay = inner_groups[g].weight_decay;
    groups_[g].options = inner_groups[g].options;
  }
}

}  // namespace colossus::zero
