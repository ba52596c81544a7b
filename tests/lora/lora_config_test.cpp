// LoraConfig: validation, PEFT's adapter_config.json both ways, and the
// errors a user sees for a bad config, a target that matches nothing, or an
// adapter file whose keys do not fit (each message names the bad value).
#include "colossus/lora/lora_config.h"
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/lora/inject.h"
#include "colossus/lora/peft_io.h"
#include "colossus/models/pretrained.h"
#include "tests/lora/lora_testing.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <string>

namespace colossus::lora {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// What PEFT 0.21 writes for a GPT-2 adapter (all keys, verbatim values).
const char* kPeftConfig = R"({
  "alora_invocation_tokens": null, "alpha_pattern": {}, "arrow_config": null, "auto_mapping": null,
  "base_model_name_or_path": "gpt2", "bias": "none", "corda_config": null, "ensure_weight_tying": false,
  "eva_config": null, "exclude_modules": null, "fan_in_fan_out": true, "inference_mode": true,
  "init_lora_weights": true, "kasa_config": null, "layer_replication": null, "layers_pattern": null,
  "layers_to_transform": null, "loftq_config": {}, "lora_alpha": 16, "lora_bias": false, "lora_dropout": 0.05,
  "lora_ga_config": null, "megatron_config": null, "megatron_core": "megatron.core", "modules_to_save": null,
  "monteclora_config": null, "peft_type": "LORA", "peft_version": "0.21.2", "qalora_group_size": 16, "r": 4,
  "rank_pattern": {}, "revision": null, "target_modules": ["c_attn", "c_proj"], "target_parameters": null,
  "task_type": "CAUSAL_LM", "trainable_token_indices": null, "use_bdlora": null, "use_dora": false,
  "use_qalora": false, "use_rslora": true, "velora_config": null
})";

// The ConfigError message of `f`, or a failure when it does not throw one.
template <class Error = ConfigError>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

TEST(LoraConfig, ParsesWhatPeftWrites) {
  const LoraConfig config = lora_config_from_json(json::parse(kPeftConfig), "adapter_config.json");
  EXPECT_EQ(config.r, 4);
  EXPECT_DOUBLE_EQ(config.lora_alpha, 16.0);
  EXPECT_DOUBLE_EQ(config.lora_dropout, 0.05);
  EXPECT_EQ(config.target_modules, (std::vector<std::string>{"c_attn", "c_proj"}));
  EXPECT_TRUE(config.use_rslora);
  EXPECT_EQ(config.bias, "none");
  EXPECT_EQ(config.init_lora_weights, LoraInit::Kaiming);
  EXPECT_EQ(config.base_model_name_or_path, "gpt2");
  EXPECT_DOUBLE_EQ(config.scaling(), 16.0 / 2.0);  // alpha / sqrt(4)
}

TEST(LoraConfig, ScalingIsAlphaOverROrOverSqrtR) {
  LoraConfig config{.r = 16, .lora_alpha = 32, .target_modules = {"q_proj"}};
  EXPECT_DOUBLE_EQ(config.scaling(), 2.0);
  config.use_rslora = true;
  EXPECT_DOUBLE_EQ(config.scaling(), 8.0);
}

TEST(LoraConfig, JsonRoundTrip) {
  const LoraConfig config{.r = 8,
                          .lora_alpha = 12.5,
                          .lora_dropout = 0.1,
                          .target_modules = {"q_proj", "v_proj"},
                          .use_rslora = true,
                          .init_lora_weights = LoraInit::Gaussian,
                          .base_model_name_or_path = "m"};
  const json written = lora_config_to_json(config, false);
  EXPECT_EQ(written["peft_type"], "LORA");
  EXPECT_EQ(written["task_type"], "CAUSAL_LM");
  EXPECT_EQ(written["fan_in_fan_out"], false);
  EXPECT_EQ(written["init_lora_weights"], "gaussian");
  const LoraConfig back = lora_config_from_json(written, "written");
  EXPECT_EQ(back.r, 8);
  EXPECT_DOUBLE_EQ(back.lora_alpha, 12.5);
  EXPECT_DOUBLE_EQ(back.lora_dropout, 0.1);
  EXPECT_EQ(back.target_modules, config.target_modules);
  EXPECT_TRUE(back.use_rslora);
  EXPECT_EQ(back.init_lora_weights, LoraInit::Gaussian);
  EXPECT_EQ(back.base_model_name_or_path, "m");
  // Integral alpha is written as an integer, as PEFT does.
  EXPECT_TRUE(
      lora_config_to_json({.r = 4, .lora_alpha = 8, .target_modules = {"q"}}, true)["lora_alpha"].is_number_integer());
  // "all-linear" as PEFT's string.
  const json all = lora_config_to_json({.target_modules = {"all-linear"}}, false);
  EXPECT_EQ(all["target_modules"], "all-linear");
  EXPECT_TRUE(lora_config_from_json(all, "x").all_linear());
}

TEST(LoraConfig, ValidateNamesTheBadValue) {
  EXPECT_NE(
      error_of([] { LoraConfig{.r = 0, .target_modules = {"q_proj"}}.validate(); }).find("r = 0 must be a positive"),
      std::string::npos);
  EXPECT_NE(error_of([] { LoraConfig{.r = -3, .target_modules = {"q_proj"}}.validate(); }).find("r = -3"),
            std::string::npos);
  EXPECT_NE(
      error_of([] { LoraConfig{.lora_alpha = 0, .target_modules = {"q_proj"}}.validate(); }).find("lora_alpha = 0"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              LoraConfig{.lora_dropout = 1.0, .target_modules = {"q_proj"}}.validate();
            }).find("lora_dropout = 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { LoraConfig{}.validate(); }).find("target_modules is empty"), std::string::npos);
  const std::string bias = error_of([] { LoraConfig{.target_modules = {"q_proj"}, .bias = "some"}.validate(); });
  EXPECT_NE(bias.find("bias = \"some\" is not one of PEFT's"), std::string::npos) << bias;
  EXPECT_NE(bias.find("\"lora_only\""), std::string::npos) << bias;
  EXPECT_NO_THROW((LoraConfig{.target_modules = {"q_proj"}, .bias = "all"}.validate()));
  const std::string save =
      error_of([] { LoraConfig{.target_modules = {"q_proj"}, .modules_to_save = {""}}.validate(); });
  EXPECT_NE(save.find("modules_to_save holds an empty name"), std::string::npos) << save;
  const std::string mixed = error_of([] { LoraConfig{.target_modules = {"all-linear", "q_proj"}}.validate(); });
  EXPECT_NE(mixed.find("all-linear"), std::string::npos) << mixed;
}

TEST(LoraConfig, UnsupportedPeftKeysAreRefusedByName) {
  const auto with = [](const char* key, json value) {
    json config = json::parse(kPeftConfig);
    config[key] = std::move(value);
    return error_of([&] { lora_config_from_json(config, "dir/adapter_config.json"); });
  };
  std::string message = with("use_dora", true);
  EXPECT_NE(message.find("dir/adapter_config.json"), std::string::npos) << message;
  EXPECT_NE(message.find("\"use_dora\" = true is not supported"), std::string::npos) << message;
  EXPECT_NE(with("layers_to_transform", json::array({0, 1})).find("layers_to_transform"), std::string::npos);
  EXPECT_NE(with("rank_pattern", json{{"q_proj", 8}}).find("rank_pattern"), std::string::npos);
  EXPECT_NE(with("lora_bias", true).find("lora_bias"), std::string::npos);
  EXPECT_NE(with("some_future_option", "on").find("some_future_option"), std::string::npos);
  message = with("peft_type", "IA3");
  EXPECT_NE(message.find("peft_type = \"IA3\" is not supported"), std::string::npos) << message;
  message = with("init_lora_weights", "pissa");
  EXPECT_NE(message.find("init_lora_weights = \"pissa\""), std::string::npos) << message;
  message = with("target_modules", ".*q_proj");
  EXPECT_NE(message.find("regular expression"), std::string::npos) << message;
  message = with("r", 0);
  EXPECT_NE(message.find("r = 0"), std::string::npos) << message;
  message = with("r", "eight");
  EXPECT_NE(message.find("\"r\" = \"eight\" should be an integer"), std::string::npos) << message;
  message = with("bias", "some");
  EXPECT_NE(message.find("bias = \"some\" is not one of"), std::string::npos) << message;
  message = with("task_type", "SEQ_CLS");
  EXPECT_NE(message.find("task_type = \"SEQ_CLS\""), std::string::npos) << message;
  // Off values of features we lack are fine (what PEFT writes by default).
  EXPECT_NO_THROW(lora_config_from_json(json::parse(kPeftConfig), "x"));
}

TEST(ApplyLora, TargetThatMatchesNothingNamesItAndTheValidNames) {
  auto model = testing::tiny_llama(1);
  const std::string message = error_of([&] {
    apply_lora(*model, {.r = 4, .target_modules = {"q_proj", "query_proj"}});
  });
  EXPECT_NE(message.find("[\"query_proj\"] match no module"), std::string::npos) << message;
  EXPECT_NE(message.find("q_proj"), std::string::npos) << message;
  EXPECT_NE(message.find("down_proj"), std::string::npos) << message;
  EXPECT_NE(message.find("model.layers.0."), std::string::npos) << message;
  EXPECT_TRUE(lora_layers(*model).empty()) << "a refused config must leave the model alone";
}

TEST(ApplyLora, TargetThatIsNotALinearIsRefused) {
  auto model = testing::tiny_llama(1);
  const std::string message = error_of([&] { apply_lora(*model, {.r = 4, .target_modules = {"mlp"}}); });
  EXPECT_NE(message.find("model.layers.0.mlp"), std::string::npos) << message;
  EXPECT_NE(message.find("LoRA wraps Linear and Conv1D"), std::string::npos) << message;
}

TEST(ApplyLora, MatchesAsPeftDoes) {
  auto model = testing::tiny_llama(1);
  // A full path, a dotted tail and a bare name; "proj" alone is not a tail
  // match.
  const LoraConfig resolved =
      apply_lora(*model, {.r = 2, .target_modules = {"model.layers.0.self_attn.q_proj", "mlp.up_proj", "o_proj"}});
  std::vector<std::string> paths;
  for (const auto& [path, layer] : lora_layers(*model)) paths.push_back(path);
  EXPECT_EQ(paths, (std::vector<std::string>{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj",
                                             "model.layers.0.mlp.up_proj", "model.layers.1.self_attn.o_proj",
                                             "model.layers.1.mlp.up_proj"}));
  EXPECT_EQ(resolved.target_modules,
            (std::vector<std::string>{"model.layers.0.self_attn.q_proj", "mlp.up_proj", "o_proj"}));
  EXPECT_NE(error_of([&] { apply_lora(*model, {.r = 2, .target_modules = {"proj"}}); }).find("already has LoRA"),
            std::string::npos);
}

TEST(ApplyLora, AllLinearSkipsTheHeadAndResolvesToPaths) {
  auto model = testing::tiny_llama(1);
  const LoraConfig resolved = apply_lora(*model, {.r = 2, .target_modules = {"all-linear"}});
  EXPECT_EQ(lora_layers(*model).size(), 14u);  // 7 per block, not lm_head
  EXPECT_EQ(resolved.target_modules.size(), 14u);
  EXPECT_EQ(resolved.target_modules.front(), "model.layers.0.self_attn.q_proj");
  for (const auto& [key, param] : lora_parameters(*model)) {
    EXPECT_TRUE(key.starts_with("base_model.model.model.layers.")) << key;
  }
  auto gpt2 = testing::tiny_gpt2(1);
  apply_lora(*gpt2, {.r = 2, .target_modules = {"all-linear"}});
  EXPECT_EQ(lora_layers(*gpt2).size(),
            8u);  // c_attn, attn.c_proj, c_fc, mlp.c_proj per block; the head is tied
  EXPECT_EQ(lora_parameters(*gpt2).front().first, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
}

TEST(ApplyLora, MoeRoutersAndExpertsAreSkippedByAllLinearAndRefusedByName) {
  auto config = std::get<models::MixtralConfig>(models::preset("mixtral-tiny"));
  auto model = models::create_model(config, {.seed = 1});
  apply_lora(*model, {.r = 2, .target_modules = {"all-linear"}});
  const auto layers = lora_layers(*model);
  EXPECT_EQ(layers.size(), static_cast<size_t>(4 * config.num_hidden_layers));  // q, k, v, o per block
  for (const auto& [path, layer] : layers) EXPECT_NE(path.find(".self_attn."), std::string::npos) << path;
  auto fresh = models::create_model(config, {.seed = 1});
  const std::string message = error_of([&] { apply_lora(*fresh, {.r = 2, .target_modules = {"w1"}}); });
  EXPECT_NE(message.find("router or expert of a MoE block"), std::string::npos) << message;
}

// PEFT's "all-linear" on transformers' Qwen2-MoE / DeepSeek-V3: routers and routed experts hold no
// nn.Linear (skipped), the shared expert (and Qwen2-MoE's shared_expert_gate) is adapted.
TEST(ApplyLora, AllLinearAdaptsSharedExpertsButNotRoutedOnes) {
  for (const char* preset : {"qwen2_moe-tiny", "deepseek_v3-tiny"}) {
    auto model = models::create_model(models::preset(preset), {.seed = 1});
    apply_lora(*model, {.r = 2, .target_modules = {"all-linear"}});
    std::set<std::string> paths;
    for (const auto& [path, layer] : lora_layers(*model)) {
      paths.insert(path);
      EXPECT_EQ(path.find(".experts."), std::string::npos) << preset << ": " << path;
      EXPECT_FALSE(path.ends_with("mlp.gate")) << preset << ": " << path;
    }
    const bool qwen = std::string(preset) == "qwen2_moe-tiny";
    for (const std::string& want : qwen ? std::vector<std::string>{"model.layers.0.mlp.shared_expert.down_proj",
                                                                   "model.layers.0.mlp.shared_expert_gate",
                                                                   "model.layers.1.mlp.up_proj"}
                                       : std::vector<std::string>{"model.layers.1.mlp.shared_experts.gate_proj",
                                                                   "model.layers.0.mlp.up_proj",
                                                                   "model.layers.2.self_attn.kv_b_proj"}) {
      EXPECT_TRUE(paths.contains(want)) << preset << ": " << want << " not adapted";
    }
  }
}

TEST(ApplyLora, RefusedAfterFuseProjections) {
  auto model = testing::tiny_llama(1);
  model->fuse_projections();
  const std::string message = error_of([&] { apply_lora(*model, {.r = 2, .target_modules = {"k_proj"}}); });
  EXPECT_NE(message.find("model.layers.0.self_attn.k_proj's parameters are views"), std::string::npos) << message;
  EXPECT_NE(message.find("apply LoRA before fusing projections"), std::string::npos) << message;
  // o_proj is never fused.
  EXPECT_NO_THROW(apply_lora(*model, {.r = 2, .target_modules = {"o_proj"}}));
}

TEST(LoadPeftAdapter, MissingAndUnexpectedKeysAreNamedAndTheModelIsLeftAlone) {
  auto model = testing::tiny_llama(2);
  const LoraConfig config{.r = 2, .target_modules = {"q_proj", "v_proj"}};
  apply_lora(*model, config);
  const fs::path dir = testing::scratch_dir() / "bad_keys";
  save_peft_adapter(*model, config, dir.string());
  // Rewrite the weights: one key dropped, one foreign key added.
  checkpoint::NamedTensors tensors;
  for (const auto& [key, tensor] : lora_parameters(*model)) {
    if (key != "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight")
      tensors.emplace_back(key, tensor.detach());
  }
  tensors.emplace_back("base_model.model.model.layers.0.mlp.up_proj.lora_A.weight", tensors.front().second);
  checkpoint::save_safetensors((dir / "adapter_model.safetensors").string(), tensors);

  auto fresh = testing::tiny_llama(2);
  const std::string message = error_of<CheckpointError>([&] { load_peft_adapter(*fresh, dir.string()); });
  EXPECT_NE(message.find("missing keys [\"base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight\"]"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("unexpected keys [\"base_model.model.model.layers.0.mlp.up_proj.lora_A.weight\"]"),
            std::string::npos)
      << message;
  EXPECT_TRUE(lora_layers(*fresh).empty());
  for (const auto& item : fresh->named_parameters()) EXPECT_TRUE(item.value().requires_grad()) << item.key();

  // A wrong rank is a shape mismatch.
  auto other = testing::tiny_llama(2);
  apply_lora(*other, {.r = 3, .target_modules = {"q_proj", "v_proj"}});
  save_peft_adapter(*other, {.r = 3, .target_modules = {"q_proj", "v_proj"}}, dir.string());
  json edited = json::parse(std::ifstream(dir / "adapter_config.json"));
  edited["r"] = 2;
  std::ofstream(dir / "adapter_config.json") << edited.dump();
  const std::string shapes = error_of<CheckpointError>([&] { load_peft_adapter(*fresh, dir.string()); });
  EXPECT_NE(shapes.find("shape mismatches"), std::string::npos) << shapes;
  EXPECT_NE(shapes.find("[3, 32] in the file, [2, 32] in the model"), std::string::npos) << shapes;
}

TEST(LoadPeftAdapter, NotAnAdapterDirectory) {
  const std::string message = error_of<CheckpointError>(
      [] { load_peft_adapter(*testing::tiny_llama(1), (testing::scratch_dir() / "nowhere").string()); });
  EXPECT_NE(message.find("adapter_config.json not found"), std::string::npos) << message;
}

TEST(SavePeftAdapter, RefusesAModelWithoutLora) {
  auto model = testing::tiny_llama(1);
  const std::string message = error_of(
      [&] { save_peft_adapter(*model, {.target_modules = {"q_proj"}}, (testing::scratch_dir() / "none").string()); });
  EXPECT_NE(message.find("no LoRA layers"), std::string::npos) << message;
}

}  // namespace
}  // namespace colossus::lora
