#include "colossus/models/phi3.h"

#include "colossus/core/errors.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <fmt/format.h>

#include <array>

namespace colossus::models {

Phi3DecoderLayer::Phi3DecoderLayer(const LlamaConfig& config, const at::TensorOptions& options, int64_t layer)
    : LlamaDecoderLayer(config, options, layer), resid_pdrop_(config.resid_pdrop) {}

at::Tensor Phi3DecoderLayer::forward(const at::Tensor& hidden, const BlockContext& context) {
  if (resid_pdrop_ == 0.0 || !is_training()) return LlamaDecoderLayer::forward(hidden, context);
  const at::Tensor attn = self_attn().forward(layer("input_layernorm").forward(hidden), context);
  const at::Tensor h = hidden + at::dropout(attn, resid_pdrop_, /*train=*/true);
  const at::Tensor mlp_out = mlp().forward(layer("post_attention_layernorm").forward(h));
  return h + at::dropout(mlp_out, resid_pdrop_, /*train=*/true);
}

Phi3ForCausalLM::Phi3ForCausalLM(const LlamaConfig& config, const at::TensorOptions& options)
    : LlamaForCausalLM(config, options,
                       Parts{.name = "Phi3Model",
                             .block = [&](int64_t layer) {
                               return std::make_shared<Phi3DecoderLayer>(config, options, layer);
                             },
                             .norm = [&] {
                               return std::make_shared<RMSNorm>(config.hidden_size, config.rms_norm_eps, options);
                             }}) {}

namespace {

// One fused checkpoint tensor and the model parameters its rows hold, in order.
struct Fused {
  const char* name;                  // "self_attn.qkv_proj.weight"
  std::array<const char*, 3> parts;  // "self_attn.q_proj.weight", ... (nullptr: fewer parts)
};

constexpr std::array<Fused, 2> kFused = {
    Fused{"self_attn.qkv_proj.weight", {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}},
    Fused{"mlp.gate_up_proj.weight", {"mlp.gate_proj.weight", "mlp.up_proj.weight", nullptr}},
};

// The prefix before `suffix` (with its dot) when `name` ends with ".suffix" or is it.
std::optional<std::string> prefix_of(const std::string& name, const std::string& suffix) {
  if (name == suffix) return std::string();
  if (name.size() > suffix.size() && name.ends_with("." + suffix)) return name.substr(0, name.size() - suffix.size());
  return std::nullopt;
}

// Rows of each part of fused tensor f.
std::vector<int64_t> part_rows(const LlamaConfig& config, const Fused& f) {
  const int64_t d = config.resolved_head_dim();
  if (f.parts[2] != nullptr) return {config.num_attention_heads * d, config.kv_heads() * d, config.kv_heads() * d};
  return {config.intermediate_size, config.intermediate_size};
}

}  // namespace

checkpoint::NamedTensors fuse_phi3_checkpoint(checkpoint::NamedTensors params) {
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [name, tensor] : params) by_name.emplace(name, tensor);
  checkpoint::NamedTensors out;
  for (auto& [name, tensor] : params) {
    bool handled = false;
    for (const Fused& f : kFused) {
      for (size_t p = 0; p < f.parts.size() && f.parts[p] != nullptr && !handled; ++p) {
        const auto prefix = prefix_of(name, f.parts[p]);
        if (!prefix) continue;
        handled = true;
        if (p != 0) break;  // emitted with the first part
        std::vector<at::Tensor> rows;
        for (const char* part : f.parts) {
          if (part == nullptr) break;
          auto it = by_name.find(*prefix + part);
          if (it == by_name.end()) {
            throw CheckpointError(fmt::format("Phi-3 checkpoint: {} has no {} to fuse into {}", name, *prefix + part,
                                              *prefix + f.name));
          }
          rows.push_back(it->second);
        }
        out.emplace_back(*prefix + f.name, at::cat(rows, 0));
      }
    }
    if (!handled) out.emplace_back(std::move(name), std::move(tensor));
  }
  return out;
}

std::map<std::string, at::Tensor> split_phi3_checkpoint(const LlamaConfig& config,
                                                        std::map<std::string, at::Tensor> state,
                                                        const std::string& source) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, tensor] : state) {
    bool fused = false;
    for (const Fused& f : kFused) {
      const auto prefix = prefix_of(name, f.name);
      if (!prefix) continue;
      fused = true;
      const std::vector<int64_t> rows = part_rows(config, f);
      int64_t total = 0;
      for (int64_t r : rows) total += r;
      if (tensor.dim() != 2 || tensor.size(0) != total || tensor.size(1) != config.hidden_size) {
        throw CheckpointError(fmt::format("checkpoint {}: {} has shape {}; this Phi-3 config needs ({}, {})", source,
                                          name, c10::str(tensor.sizes()), total, config.hidden_size));
      }
      int64_t row = 0;
      for (size_t p = 0; p < rows.size(); ++p) {
        out.emplace(*prefix + f.parts[p], tensor.narrow(0, row, rows[p]));
        row += rows[p];
      }
    }
    if (!fused) out.emplace(name, std::move(tensor));
  }
  return out;
}

}  // namespace colossus::models
