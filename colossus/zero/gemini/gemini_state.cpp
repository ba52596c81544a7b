// The unsharded state of GeminiOptimizer: state_dict() all-gathers each state
// slot chunk by chunk (the parameters' chunking) and cuts whole parameters out
// of it; load_state_dict() cuts this rank's parts out of whole tensors. The
// format is the Booster's for DDP (plain inner state for fp32,
// MixedPrecisionOptimizer's for bf16/fp16), as LowLevelZeroOptimizer's.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "colossus/core/errors.h"
#include "colossus/zero/gemini/gemini_optimizer.h"

namespace colossus::zero::gemini {

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

optim::OptimizerState GeminiOptimizer::state_dict() const {
  at::NoGradGuard no_grad;
  const auto& params = ddp_.params();
  const auto& layout = ddp_.layout();
  optim::OptimizerState local = inner_->state_dict();
  std::map<std::pair<size_t, std::string>, at::Tensor> parts;  // (parameter index, slot) -> own part
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
  std::vector<size_t> inner_index_of(params.size(), 0);
  for (size_t i = 0; i < inner_order_.size(); ++i) inner_index_of[inner_order_[i]] = i;

  optim::OptimizerState out;
  const auto group = ddp_.dp_group();
  auto gather_chunk = [&](const Chunk& chunk, const std::function<at::Tensor(size_t)>& part_of,
                          const std::function<void(size_t, at::Tensor)>& emit) {
    const auto device = ddp_.device();
    at::Tensor shard = at::zeros({chunk.layout.shard_numel}, at::TensorOptions().device(device).dtype(at::kFloat));
    for (size_t k : chunk.layout.params) {
      const auto& slot = layout.slots[k];
      if (slot.own_numel > 0) shard.narrow(0, slot.own_offset, slot.own_numel).copy_(part_of(k).reshape({-1}));
    }
    at::Tensor full = at::empty({chunk.layout.numel}, shard.options());
    group->all_gather_into(full, shard).wait();
    for (size_t k : chunk.layout.params) {
      const auto& slot = layout.slots[k];
      emit(k, full.narrow(0, slot.offset, slot.numel).view(params[k].second.sizes()).cpu().clone());
    }
  };
  for (const auto& slot_name : slot_names) {
    for (const auto& chunk : ddp_.chunks()) {
      gather_chunk(
          chunk,
          [&](size_t k) {
            return parts.at({k, slot_name});
          },
          [&](size_t k, at::Tensor full) {
            out.tensors.emplace_back(fmt::format("state.{}.{}", inner_index_of[k], slot_name), std::move(full));
          });
    }
  }
  if (ddp_.options().precision == "fp32") {
    out.json = local.json;
    return out;
  }
  for (const auto& chunk : ddp_.chunks()) {
    gather_chunk(
        chunk, [&](size_t k) { return ddp_.master_view(k); },
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

void GeminiOptimizer::load_state_dict(const optim::OptimizerState& state) {
  const auto& params = ddp_.params();
  const auto& layout = ddp_.layout();
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
    throw CheckpointError(fmt::format("{}: state was saved with fp16 loss scaling but precision is '{}'", name(),
                                      ddp_.options().precision));
  }
  if (ddp_.warming_up()) {
    // Loaded state lands where the chunks will live: place them now (the
    // warm-up placement).
    ddp_.end_warmup(16);
    rebind_masters();
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
          fmt::format("{}: state tensor '{}' is neither state.<index>.<slot> "
                      "nor master.<index>",
                      name(), tensor_name));
    }
    if (index >= inner_order_.size()) {
      throw CheckpointError(fmt::format("{}: state tensor '{}' is for parameter {} but there are only {}", name(),
                                        tensor_name, index, inner_order_.size()));
    }
    const size_t k = inner_order_[index];
    const at::Tensor& param = params[k].second;
    if (tensor.numel() != param.numel()) {
      throw CheckpointError(fmt::format("{}: '{}' has shape {} but parameter '{}' has shape {}", name(), tensor_name,
                                        tensor.sizes(), params[k].first, param.sizes()));
    }
    if (is_master) {
      masters.emplace_back(k, tensor);
      continue;
    }
    at::Tensor part = owned_part(tensor.reshape({-1}), layout.slots[k])
                          .to(ddp_.master_view(k).device(), tensor.scalar_type(), false, /*copy=*/true);
    local.tensors.emplace_back(tensor_name, std::move(part));
  }
  inner_->load_state_dict(local);  // validates before changing anything
  if (scaler_ && mixed && j.contains("loss_scaler") && !j["loss_scaler"].is_null()) {
    scaler_->load_state_dict(j["loss_scaler"].dump());
  }
  skipped_steps_ = mixed ? j.value("skipped_steps", int64_t{0}) : 0;
  at::NoGradGuard no_grad;
  for (const auto& [k, tensor] : masters) {
    ddp_.master_view(k).copy_(owned_part(tensor.reshape({-1}), layout.slots[k]));
  }
  if (!masters.empty()) ddp_.shards_from_masters();
  const auto& inner_groups = inner_->param_groups();
  for (size_t g = 0; g < groups_.size() && g < inner_groups.size(); ++g) {
    groups_[g].lr = inner_groups[g].lr;
    groups_[g].weight_decay = inner_groups[g].weight_decay;
    groups_[g].options = inner_groups[g].options;
  }
}

}  // namespace colossus::zero::gemini
