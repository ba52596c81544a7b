#include "colossus/apps/trainer/components.h"

#include "colossus/core/errors.h"
#include "colossus/models/pretrained.h"
#include "colossus/optim/adam.h"
#include "colossus/optim/hybrid_adam.h"
#include "colossus/optim/lamb.h"
#include "colossus/optim/sgd.h"
#include "colossus/optim/stateful_optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <set>

namespace colossus::apps {

namespace {

// config.json keeps keys it does not know (HF configs carry many), so a
// misspelt [model.config] key would be written there and ignored: only keys
// the base config has (every field the model reads, and a pretrained
// config's own extras) or that any HF config may carry are accepted.
void check_config_keys(const std::map<std::string, std::string>& overrides, const nlohmann::json& base,
                       const std::string& model_type) {
  std::set<std::string> generic{"bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype",
                                "dtype",        "use_cache",    "transformers_version"};
  // Mixtral's optional fields, written to config.json only when set.
  if (model_type == "mixtral" || model_type == "qwen2_moe" || model_type == "qwen3_moe") {
    generic.insert({"router_z_loss_coef", "capacity_factor"});
  }
  for (const auto& [key, value] : overrides) {
    if (base.contains(key) || generic.contains(key)) continue;
    std::set<std::string> valid = generic;
    for (const auto& item : base.items()) valid.insert(item.key());
    throw ConfigError(fmt::format("model.config.{} is not a config key of a {} model; valid keys: {}", key, model_type,
                                  fmt::join(valid, ", ")));
  }
}

}  // namespace

models::ModelConfig build_model_config(const TrainConfig& config, const data::Tokenizer& tokenizer) {
  const int64_t tokenizer_vocab = tokenizer.vocab_size();
  const auto& m = config.model;
  const bool pretrained = !m.pretrained.empty();
  models::ModelConfig base = pretrained ? models::read_config((std::filesystem::path(m.pretrained) / "config.json").string())
                                        : models::preset(m.preset);
  auto j = nlohmann::json::parse(models::config_to_json(base));
  check_config_keys(m.config, j, models::model_type(base));
  for (const auto& [key, value_json] : m.config) j[key] = nlohmann::json::parse(value_json);
  const bool vocab_given = m.config.count("vocab_size") > 0;
  if (!pretrained && !vocab_given) j["vocab_size"] = (tokenizer_vocab + 63) / 64 * 64;
  if (!pretrained) {
    // A preset carries its original tokenizer's special ids (GPT-2's 50256);
    // generation and transformers must see this run's tokenizer's instead.
    for (const auto& [key, id] : {std::pair{"bos_token_id", tokenizer.bos_id()}, std::pair{"eos_token_id", tokenizer.eos_id()},
                                  std::pair{"pad_token_id", tokenizer.pad_id()}}) {
      if (m.config.count(key)) continue;
      if (id) j[key] = *id;
      // No padding id is null, not an absent key: an absent one means the
      // family's default to transformers (Phi-3's 32000, Gemma's 0).
      else if (std::string(key) == "pad_token_id") j[key] = nullptr;
      else j.erase(key);
    }
  }
  models::ModelConfig out = models::config_from_json(j.dump());
  const int64_t vocab = models::vocab_size(out);
  if (vocab < tokenizer_vocab) {
    throw ConfigError(fmt::format("the model's vocab_size = {} is smaller than the tokenizer's {} ids; set "
                                  "model.config.vocab_size >= {} or use a matching tokenizer",
                                  vocab, tokenizer_vocab, tokenizer_vocab));
  }
  const int64_t positions = models::max_positions(out);
  if (config.data.seq_len > positions) {
    const char* key = std::holds_alternative<models::GPT2Config>(out) ? "n_positions" : "max_position_embeddings";
    throw ConfigError(fmt::format("data.seq_len = {} exceeds the model's {} = {}; lower data.seq_len or set "
                                  "model.config.{} = {}",
                                  config.data.seq_len, key, positions, key, config.data.seq_len));
  }
  return out;
}

std::unique_ptr<optim::Optimizer> build_optimizer(const OptimizerSection& o, models::CausalLM& model) {
  std::vector<optim::ParamGroup> groups;
  // Frozen parameters (a LoRA run's base) get no optimizer state.
  std::vector<at::Tensor> trainable;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) trainable.push_back(p);
  if (o.decay_1d_params) {
    groups = optim::single_group(trainable, o.lr, o.weight_decay);
  } else {
    optim::ParamGroup decay{.lr = o.lr, .weight_decay = o.weight_decay};
    optim::ParamGroup no_decay{.lr = o.lr, .weight_decay = 0.0};
    for (const auto& p : trainable) (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
    groups.push_back(std::move(decay));
    if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  }
  const optim::Betas betas{.beta1 = o.beta1, .beta2 = o.beta2};
  if (o.name == "adamw") return std::make_unique<optim::AdamW>(std::move(groups), optim::AdamWOptions{.betas = betas, .eps = o.eps});
  if (o.name == "adam") return std::make_unique<optim::Adam>(std::move(groups), optim::AdamOptions{.betas = betas, .eps = o.eps});
  if (o.name == "hybrid_adam") {
    return std::make_unique<optim::HybridAdam>(std::move(groups), optim::HybridAdamOptions{.betas = betas, .eps = o.eps});
  }
  if (o.name == "lamb") return std::make_unique<optim::Lamb>(std::move(groups), optim::LambOptions{.betas = betas, .eps = o.eps});
  if (o.name == "sgd") {
    return std::make_unique<optim::SGD>(std::move(groups),
                                        optim::SGDOptions{.momentum = o.momentum, .nesterov = o.nesterov});
  }
  throw ConfigError(fmt::format("optimizer.name = '{}' is unknown; use adamw, adam, sgd, lamb or hybrid_adam", o.name));
}

std::shared_ptr<optim::LRScheduler> build_lr_scheduler(const SchedulerSection& s, optim::Optimizer& optimizer,
                                                       int64_t train_steps) {
  const int64_t total = s.total_steps > 0 ? s.total_steps : train_steps;
  if (s.name == "constant") return std::make_shared<optim::ConstantLR>(optimizer, optim::ConstantLROptions{.warmup_steps = s.warmup_steps});
  if (s.name == "linear") {
    return std::make_shared<optim::LinearWarmupDecayLR>(
        optimizer, optim::LinearLROptions{.warmup_steps = s.warmup_steps, .total_steps = total});
  }
  if (s.name == "cosine") {
    return std::make_shared<optim::CosineWarmupLR>(
        optimizer,
        optim::CosineLROptions{.warmup_steps = s.warmup_steps, .total_steps = total, .min_lr_ratio = s.min_lr_ratio});
  }
  throw ConfigError(fmt::format("lr_scheduler.name = '{}' is unknown; use constant, linear or cosine", s.name));
}

double flops_per_token(const models::CausalLM& model, int64_t seq_len) {
  double n = 0;
  for (const auto& p : model.parameters()) n += static_cast<double>(p.numel());
  const double layers = static_cast<double>(models::num_layers(model.config()));
  const double width = static_cast<double>(models::hidden_size(model.config()));
  return 6.0 * n + 6.0 * layers * width * static_cast<double>(seq_len);
}

}  // namespace colossus::apps
