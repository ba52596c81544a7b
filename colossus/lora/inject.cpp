#include "colossus/lora/inject.h"

#include "colossus/core/errors.h"
#include "colossus/lora/nf4_linear.h"
#include "colossus/models/deepseek_moe.h"
#include "colossus/models/moe_layer.h"
#include "colossus/models/pretrained.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace colossus::lora {

namespace {

bool is_linear(const torch::nn::Module& module) {
  return dynamic_cast<const models::Linear*>(&module) != nullptr ||
         dynamic_cast<const models::Conv1D*>(&module) != nullptr || dynamic_cast<const Nf4Linear*>(&module) != nullptr;
}

// PEFT's list match: the whole path, or its tail after a dot.
bool matches(const std::string& path, const std::string& name) {
  return path == name ||
         (path.size() > name.size() && path.ends_with(name) && path[path.size() - name.size() - 1] == '.');
}

// FNV-1a over the path, mixed with the seed: a layer's initial adapter does
// not depend on which other layers were targeted.
uint64_t layer_seed(uint64_t seed, const std::string& path) {
  uint64_t h = 1469598103934665603ull ^ (seed * 0x9E3779B97F4A7C15ull);
  for (unsigned char c : path) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string linear_summary(const std::vector<std::string>& linear_paths) {
  std::set<std::string> leaves;
  for (const auto& path : linear_paths) leaves.insert(path.substr(path.rfind('.') + 1));
  std::vector<std::string> examples(linear_paths.begin(),
                                    linear_paths.begin() + std::min<size_t>(linear_paths.size(), 3));
  return fmt::format("its linear layers are named {} (e.g. {})", std::vector<std::string>(leaves.begin(), leaves.end()),
                     examples);
}

}  // namespace

void snapshot_adapters(torch::nn::Module& model) {
  for (auto& [path, layer] : lora_layers(model)) layer->snapshot();
}

SnapshotAdapters::SnapshotAdapters(torch::nn::Module& model) {
  for (auto& [path, layer] : lora_layers(model)) {
    layer->use_snapshot = true;
    layers_.push_back(layer);
  }
}

SnapshotAdapters::~SnapshotAdapters() {
  for (auto& layer : layers_) layer->use_snapshot = false;
}

std::string peft_key(const std::string& module_path, const std::string& which) {
  return "base_model.model." + module_path + "." + which + ".weight";
}

std::vector<std::pair<std::string, std::shared_ptr<LoraLinear>>> lora_layers(torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<LoraLinear>>> layers;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto lora = std::dynamic_pointer_cast<LoraLinear>(item.value())) layers.emplace_back(item.key(), lora);
  }
  return layers;
}

checkpoint::NamedTensors lora_parameters(torch::nn::Module& model) {
  checkpoint::NamedTensors params;
  for (const auto& [path, layer] : lora_layers(model)) {
    params.emplace_back(peft_key(path, "lora_A"), layer->lora_A);
    params.emplace_back(peft_key(path, "lora_B"), layer->lora_B);
  }
  return params;
}

std::vector<AdapterTensor> adapter_tensors(models::CausalLM& model, const LoraConfig& config) {
  std::vector<AdapterTensor> tensors;
  std::set<std::string> lora_paths;
  for (const auto& [path, layer] : lora_layers(model)) {
    lora_paths.insert(path);
    tensors.push_back({peft_key(path, "lora_A"), path + ".lora_A.weight", layer->lora_A});
    tensors.push_back({peft_key(path, "lora_B"), path + ".lora_B.weight", layer->lora_B});
  }
  const c10::TensorImpl* embedding = model.tied_embeddings() ? model.embedding().weight.unsafeGetTensorImpl() : nullptr;
  std::set<std::string> matched_entries;
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const auto dot = name.rfind('.');
    const std::string module = dot == std::string::npos ? "" : name.substr(0, dot);
    const std::string leaf = name.substr(dot == std::string::npos ? 0 : dot + 1);
    if (leaf.starts_with("lora_") || module.ends_with(".lora_A") || module.ends_with(".lora_B")) continue;
    bool saved = false;
    for (const auto& entry : config.modules_to_save) {
      if (!matches(module, entry)) continue;
      if (item.value().unsafeGetTensorImpl() == embedding) {
        throw ConfigError(fmt::format(
            "lora modules_to_save \"{}\" holds the embedding that the LM head is tied to ({}); PEFT would train an "
            "untied copy, Colossus trains modules in place: untie the model or leave it out",
            entry, name));
      }
      matched_entries.insert(entry);
      saved = true;
    }
    if (saved) {
      tensors.push_back({"base_model.model." + name, name, item.value()});
      continue;
    }
    const bool lora_bias = leaf == "bias" && lora_paths.contains(module);
    if (leaf == "bias" && (config.bias == "all" || (config.bias == "lora_only" && lora_bias))) {
      tensors.push_back(
          {"base_model.model." + (lora_bias ? module + ".base_layer.bias" : name), name, item.value()});
    }
  }
  std::vector<std::string> unmatched;
  for (const auto& entry : config.modules_to_save) {
    if (!matched_entries.contains(entry)) unmatched.push_back(entry);
  }
  if (!unmatched.empty()) {
    throw ConfigError(fmt::format("lora modules_to_save entries {} match no module with parameters of {}{}", unmatched,
                                  model.name(),
                                  model.tied_embeddings() ? " (its LM head is tied to the embedding: no lm_head of its own)"
                                                          : ""));
  }
  return tensors;
}

LoraConfig apply_lora(models::CausalLM& model, const LoraConfig& config, uint64_t seed) {
  config.validate();
  if (models::checkpoint_fuses_projections(model.config())) {
    throw ConfigError(
        "LoRA on Phi-3 is not supported: its checkpoints (and PEFT's module names) fuse qkv_proj / gate_up_proj while "
        "Colossus keeps q/k/v_proj; use a LLaMA-architecture or GPT-2 model");
  }
  if (!lora_layers(model).empty()) {
    throw ConfigError(
        "the model already has LoRA layers; apply one adapter per model (merge_lora first to stack another)");
  }
  const torch::nn::Module* head = model.lm_head();
  // A MoE block's router and routed experts run from its own packed buffers
  // (or, in DeepSeek's block, are 3D tensors in transformers), not as
  // nn.Linear: transformers holds none there, so PEFT's "all-linear" skips
  // them and so do we. The shared expert (Qwen2-MoE's shared_expert and its
  // gate, DeepSeek's shared_experts) is nn.Linear in transformers and runs
  // through its layers' forward here: adapted, as PEFT does.
  std::vector<std::string> moe_paths;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (dynamic_cast<const models::SparseMoeBlock*>(item.value().get()) != nullptr ||
        dynamic_cast<const models::DeepseekMoe*>(item.value().get()) != nullptr)
      moe_paths.push_back(item.key() + ".");
  }
  const auto in_moe = [&](const std::string& path) {
    return std::any_of(moe_paths.begin(), moe_paths.end(), [&](const std::string& moe) {
      return path.starts_with(moe) && !std::string_view(path).substr(moe.size()).starts_with("shared_expert");
    });
  };
  std::vector<std::string> linear_paths;
  std::vector<std::pair<std::string, std::shared_ptr<models::Layer>>> targets;
  std::set<std::string> matched_entries;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& path = item.key();
    const bool linear = is_linear(*item.value());
    if (linear && !in_moe(path)) linear_paths.push_back(path);
    bool target = false;
    if (config.all_linear()) {
      target = linear && item.value().get() != head && !in_moe(path);
      if (target) matched_entries.insert("all-linear");
    } else {
      for (const auto& name : config.target_modules) {
        if (!matches(path, name)) continue;
        matched_entries.insert(name);
        target = true;
      }
    }
    if (!target) continue;
    if (!linear) {
      throw ConfigError(fmt::format("lora target_modules matches \"{}\", a {}: LoRA wraps Linear and Conv1D layers; {}",
                                    path, item.value()->name(), linear_summary(linear_paths)));
    }
    if (in_moe(path)) {
      throw ConfigError(
          fmt::format("lora target_modules matches \"{}\", a router or expert of a MoE block, which LoRA does "
                      "not support (the block runs them from packed buffers); target the attention "
                      "projections instead",
                      path));
    }
    targets.emplace_back(path, std::dynamic_pointer_cast<models::Layer>(item.value()));
  }
  std::vector<std::string> unmatched;
  for (const auto& name : config.target_modules) {
    if (!matched_entries.contains(name)) unmatched.push_back(name);
  }
  if (!unmatched.empty()) {
    // Complete the list of linear layers for the message.
    linear_paths.clear();
    for (const auto& item : model.named_modules("", false)) {
      if (is_linear(*item.value()) && !in_moe(item.key())) linear_paths.push_back(item.key());
    }
    throw ConfigError(fmt::format("lora target_modules entries {} match no module of {}; {}", unmatched, model.name(),
                                  linear_summary(linear_paths)));
  }
  const auto modules = model.named_modules("", false);
  for (const auto& [path, base] : targets) {
    // fuse_projections() makes q/k/v (and gate/up) weights views into one
    // merged tensor that the eval forward reads directly: it would bypass the
    // adapter. (Weights that merely lie back to back, as LLaMA allocates them
    // for training's merged matmul, are fine: that path takes only plain
    // Linear layers.)
    const size_t dot = path.rfind('.');
    const auto* parent = dot == std::string::npos ? nullptr : modules.find(path.substr(0, dot));
    const auto* host = parent == nullptr ? nullptr : dynamic_cast<const models::LayerHost*>(parent->get());
    if (host != nullptr && host->reads_merged(path.substr(dot + 1))) {
      throw ConfigError(
          fmt::format("lora: {}'s parameters are views into a larger tensor that the model reads directly "
                      "(fuse_projections() ran?), bypassing a LoRA wrapper; apply LoRA before fusing "
                      "projections",
                      path));
    }
  }
  LoraConfig resolved = config;
  if (config.all_linear()) resolved.target_modules.clear();
  for (const auto& [path, base] : targets) {
    auto lora = std::make_shared<LoraLinear>(base, config.r, config.scaling(), config.lora_dropout,
                                             config.init_lora_weights, layer_seed(seed, path));
    models::replace_layer(model, path, lora);
    if (config.all_linear()) resolved.target_modules.push_back(path);
  }
  // Only what the adapter trains (PEFT's _mark_only_adapters_as_trainable
  // and modules_to_save).
  std::vector<AdapterTensor> trained;
  try {
    trained = adapter_tensors(model, config);
  } catch (...) {
    for (const auto& [path, lora] : lora_layers(model)) models::replace_layer(model, path, lora->base());
    throw;
  }
  for (auto& item : model.named_parameters()) item.value().set_requires_grad(false);
  for (auto& t : trained) t.tensor.set_requires_grad(true);
  return resolved;
}

int64_t merge_lora(models::CausalLM& model) {
  int64_t count = 0;
  for (const auto& [path, layer] : lora_layers(model)) {
    models::replace_layer(model, path, layer->merged());
    ++count;
  }
  return count;
}

}  // namespace colossus::lora
