#include "colossus/lora/nf4_linear.h"

#include "colossus/core/errors.h"
#include "colossus/lora/nf4_matmul.h"
#include "colossus/models/moe_layer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

namespace colossus::lora {

Nf4Linear::Nf4Linear(const models::Linear& base, int64_t blocksize, bool double_quant)
    : models::Layer("Nf4Linear"), weight_(quantize_nf4(base.weight, blocksize, double_quant)) {
  if (base.bias.defined()) bias = register_parameter("bias", base.bias.detach().clone(), /*requires_grad=*/false);
}

at::Tensor Nf4Linear::dequantized_weight(c10::ScalarType dtype) const { return dequantize_nf4(weight_, dtype); }

at::Tensor Nf4Linear::forward(const at::Tensor& x) {
  if (weight_.packed.device() != x.device()) weight_ = weight_.to(x.device());
  const at::Tensor b = bias.defined() ? bias.to(x.scalar_type()) : at::Tensor();
  if (nf4_kernels_take(x)) {
    // Kept, not remade per call: making them is a host-to-device copy (which
    // a CUDA graph capture could not hold either).
    if (!lookup_tables_.defined() || lookup_tables_.device() != x.device()) lookup_tables_ = nf4_lookup_tables(x.device());
    return nf4_linear(x, weight_, lookup_tables_, b);
  }
  return at::linear(x, dequantize_nf4(weight_, x.scalar_type()), b);
}

int64_t quantize_base_nf4(models::CausalLM& model, int64_t blocksize, bool double_quant) {
  const torch::nn::Module* head = model.lm_head();
  std::vector<std::string> moe_paths;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (dynamic_cast<const models::SparseMoeBlock*>(item.value().get()) != nullptr)
      moe_paths.push_back(item.key() + ".");
  }
  std::vector<std::pair<std::string, std::shared_ptr<models::Layer>>> swaps;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& path = item.key();
    if (item.value().get() == head) continue;
    if (std::any_of(moe_paths.begin(), moe_paths.end(), [&](const std::string& moe) { return path.starts_with(moe); }))
      continue;
    if (dynamic_cast<const models::Conv1D*>(item.value().get()) != nullptr)
      throw ConfigError(fmt::format("NF4 (QLoRA) base weights are for Linear layers; {} is GPT-2's Conv1D, which is "
                                    "not supported: use lora.quantize = \"\" for GPT-2",
                                    path));
    if (const auto* linear = dynamic_cast<const models::Linear*>(item.value().get()))
      swaps.emplace_back(path, std::make_shared<Nf4Linear>(*linear, blocksize, double_quant));
  }
  if (swaps.empty()) throw ConfigError("NF4 (QLoRA): the model has no linear layer to quantise besides its head");
  for (auto& [path, layer] : swaps) models::replace_layer(model, path, layer);
  return static_cast<int64_t>(swaps.size());
}

}  // namespace colossus::lora
