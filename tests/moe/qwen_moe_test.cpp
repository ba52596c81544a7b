// Qwen2-MoE and Qwen3-MoE: parity with transformers' Qwen2MoeForCausalLM /
// Qwen3MoeForCausalLM both ways (logits, loss with the aux loss, every
// gradient; our checkpoints loaded by transformers), greedy generation of
// the inference engine and of generate() against transformers' generate(),
// and their config.json keys.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/inference/engine/engine.h"
#include "colossus/inference/generate.h"
#include "colossus/models/mixtral.h"
#include "colossus/models/pretrained.h"
#include "tests/models/oracle.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <sstream>

namespace colossus::models {
namespace {

namespace fs = std::filesystem;
using testing::max_abs_diff;
using testing::max_rel_diff;

constexpr double kTolerance = 1e-4;

class QwenMoeFromHf : public ::testing::TestWithParam<std::string> {};

TEST_P(QwenMoeFromHf, LogitsLossAuxLossAndEveryGradientMatchTransformers) {
  const fs::path dir = testing::hf_reference_dir() / GetParam();
  auto reference = checkpoint::load_state_dict((dir / "reference.safetensors").string());
  auto base = load_pretrained(dir.string());
  auto* model = dynamic_cast<MixtralForCausalLM*>(base.get());
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model_type(model->config()), GetParam().substr(0, 9));  // qwen2_moe / qwen3_moe
  model->eval();
  at::Tensor logits = model->forward(reference.at("input_ids"));
  EXPECT_LE(max_abs_diff(logits, reference.at("logits")), kTolerance);
  EXPECT_NEAR(model->aux_loss().item<double>(), reference.at("aux_loss").item<double>(), kTolerance);
  at::Tensor loss = model->moe_loss(logits, reference.at("labels"));
  EXPECT_NEAR(loss.item<double>(), reference.at("loss").item<double>(), kTolerance);
  loss.backward();
  size_t compared = 0;
  for (const auto& item : model->named_parameters()) {
    auto hf_grad = reference.find("grad." + item.key());
    ASSERT_NE(hf_grad, reference.end()) << "HF has no parameter " << item.key();
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_LE(max_rel_diff(item.value().grad(), hf_grad->second), kTolerance) << item.key();
    ++compared;
  }
  size_t hf_params = 0;
  for (const auto& [key, _] : reference) hf_params += key.starts_with("grad.");
  EXPECT_EQ(compared, hf_params);
}

INSTANTIATE_TEST_SUITE_P(Cases, QwenMoeFromHf,
                         ::testing::Values("qwen2_moe_mixed", "qwen2_moe_step_window", "qwen3_moe_mixed",
                                           "qwen3_moe_window_bias"));

MixtralConfig tiny(const std::string& family) {
  auto c = std::get<MixtralConfig>(preset(family + "-tiny"));
  c.vocab_size = 96;
  c.initializer_range = 0.2;
  c.rms_norm_eps = 1e-5;
  return c;
}

TEST(QwenMoeToHf, TransformersLoadsOurCheckpointAndAgrees) {
  std::vector<std::pair<std::string, MixtralConfig>> cases = {{"cpp_qwen2_moe", tiny("qwen2_moe")},
                                                              {"cpp_qwen3_moe", tiny("qwen3_moe")},
                                                              {"cpp_qwen3_moe_tied_step", tiny("qwen3_moe")}};
  cases[2].second.tie_word_embeddings = true;
  cases[2].second.mlp_only_layers.clear();
  cases[2].second.decoder_sparse_step = 2;
  std::string dirs;
  uint64_t seed = 21;
  for (const auto& [name, config] : cases) {
    auto base = create_model(config, {.seed = seed});
    auto& model = dynamic_cast<MixtralForCausalLM&>(*base);
    testing::perturb_parameters(model, seed + 100);
    model.eval();
    at::Tensor ids = testing::random_ids(2, 16, config.vocab_size, seed);
    at::NoGradGuard no_grad;
    at::Tensor logits = model.forward(ids);
    at::Tensor aux = model.aux_loss().reshape({1});
    const fs::path dir = testing::scratch_dir() / name;
    save_pretrained(model, dir.string());
    checkpoint::save_safetensors((dir / "cpp_logits.safetensors").string(),
                                 {{"input_ids", ids}, {"logits", logits}, {"aux_loss", aux}});
    dirs += fmt::format(" '{}'", dir.string());
    ++seed;
  }
  testing::PythonResult result = testing::run_oracle("check" + dirs);
  std::cout << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  size_t ok_lines = 0;
  for (size_t pos = 0; (pos = result.output.find("-> ok", pos)) != std::string::npos; ++pos) ++ok_lines;
  EXPECT_EQ(ok_lines, cases.size()) << result.output;
}

TEST(QwenMoeGenerate, EngineAndGenerateGreedyEqualTransformers) {
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 3, 88, 41, 41, 2, 60}, {9, 1, 70}};
  constexpr int64_t kNew = 8;
  const std::vector<std::string> families = {"qwen2_moe", "qwen3_moe"};
  std::vector<std::shared_ptr<CausalLM>> models;
  std::string dirs;
  for (const auto& family : families) {
    models.push_back(create_model(tiny(family), {.seed = 13}));
    const fs::path dir = testing::scratch_dir() / ("generate_" + family);
    save_pretrained(*models.back(), dir.string());
    dirs += fmt::format(" '{}'", dir.string());
  }
  // One oracle process for every model and prompt (each start costs seconds).
  auto result = testing::run_oracle(fmt::format("generate --prompts '5,17,3,88,41,41,2,60;9,1,70' --new {}{}", kNew, dirs));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<nlohmann::json> answers;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("{\"dir\"")) answers.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(answers.size(), families.size()) << result.output;
  for (size_t m = 0; m < families.size(); ++m) {
    const std::string& family = families[m];
    // A margin near float rounding would make a greedy mismatch meaningless.
    EXPECT_GT(answers[m]["margin"].get<double>(), 1e-3) << family << ": the logits are too flat for a greedy comparison";
    const auto expected = answers[m]["ids"].get<std::vector<std::vector<int64_t>>>();
    ASSERT_EQ(expected.size(), prompts.size()) << family;
    inference::InferenceEngine engine(
        models[m], nullptr, {.max_batch_size = 2, .max_input_len = 16, .max_output_len = kNew, .block_size = 4});
    const auto outputs = engine.generate(prompts, {.max_new_tokens = kNew});
    ASSERT_EQ(outputs.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(inference::generate(*models[m], prompts[i], {.max_new_tokens = kNew, .sampling = {.do_sample = false}}),
                expected[i])
          << family << " generate(), prompt " << i;
      const std::vector<int64_t> generated(expected[i].begin() + static_cast<std::ptrdiff_t>(prompts[i].size()),
                                           expected[i].end());
      EXPECT_EQ(outputs[i], generated) << family << " engine, prompt " << i;
    }
  }
}

TEST(QwenMoeForCausalLM, DenseLayersHoldAnMlpAndSparseOnesTheMoeBlock) {
  for (const std::string family : {"qwen2_moe", "qwen3_moe"}) {
    auto base = create_model(tiny(family), {.seed = 3});
    auto& model = dynamic_cast<MixtralForCausalLM&>(*base);
    EXPECT_EQ(model.moe_blocks().size(), 2u) << family;  // layers 0 and 2; layer 1 is in mlp_only_layers
    auto params = model.named_parameters();
    EXPECT_TRUE(params.contains("model.layers.1.mlp.gate_proj.weight")) << family;
    EXPECT_EQ(params["model.layers.1.mlp.gate_proj.weight"].size(0), 96) << family;  // intermediate_size
    EXPECT_EQ(params["model.layers.0.mlp.experts.0.gate_proj.weight"].size(0), 32) << family;  // moe_intermediate_size
    EXPECT_EQ(params.contains("model.layers.0.mlp.shared_expert_gate.weight"), family == "qwen2_moe");
    EXPECT_EQ(params.contains("model.layers.0.self_attn.q_norm.weight"), family == "qwen3_moe");
    EXPECT_EQ(params.contains("model.layers.0.self_attn.q_proj.bias"), family == "qwen2_moe");
  }
}

std::string config_error(const std::function<void(MixtralConfig&)>& change, const std::string& family) {
  MixtralConfig c = tiny(family);
  change(c);
  try {
    c.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(QwenMoeConfig, BadSettingsAreConfigErrorsNamingTheField) {
  const auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  auto e = config_error([](MixtralConfig& c) { c.shared_expert_intermediate_size = 0; }, "qwen2_moe");
  EXPECT_TRUE(has(e, "shared_expert_intermediate_size is 0")) << e;
  e = config_error([](MixtralConfig& c) { c.shared_expert_intermediate_size = 8; }, "qwen3_moe");
  EXPECT_TRUE(has(e, "Qwen3-MoE has no shared expert")) << e;
  e = config_error([](MixtralConfig& c) { c.mlp_only_layers = {3}; }, "qwen3_moe");
  EXPECT_TRUE(has(e, "mlp_only_layers holds 3")) << e;
  e = config_error([](MixtralConfig& c) { c.decoder_sparse_step = 0; }, "qwen2_moe");
  EXPECT_TRUE(has(e, "decoder_sparse_step is 0")) << e;
  e = config_error([](MixtralConfig& c) { c.attention_bias = true; }, "qwen2_moe");
  EXPECT_TRUE(has(e, "qkv_bias")) << e;
  e = config_error([](MixtralConfig& c) { c.moe_family = "qwen4_moe"; }, "qwen2_moe");
  EXPECT_TRUE(has(e, "moe_family is \"qwen4_moe\"")) << e;
  e = config_error([](MixtralConfig& c) { c.max_window_layers = 2; }, "qwen3_moe");
  EXPECT_TRUE(has(e, "max_window_layers")) << e;
  // Mixtral refuses the Qwen switches instead of running another model.
  auto mixtral = std::get<MixtralConfig>(preset("mixtral-tiny"));
  mixtral.norm_topk_prob = false;
  EXPECT_THROW(mixtral.validate(), ConfigError);
  // config.json: wrong types name the key.
  const std::string json = config_to_json(tiny("qwen2_moe"));
  std::string bad = json;
  bad.replace(bad.find("\"mlp_only_layers\": ["), 20, "\"mlp_only_layers\": \"1\", \"x\": [");
  try {
    config_from_json(bad);
    ADD_FAILURE() << "a string mlp_only_layers was accepted";
  } catch (const ConfigError& error) {
    EXPECT_TRUE(has(error.what(), "mlp_only_layers")) << error.what();
  }
}

TEST(QwenMoeConfig, HfConfigJsonRoundTripsAndReadsBothExpertCountSpellings) {
  for (const std::string family : {"qwen2_moe", "qwen3_moe"}) {
    const std::string json = config_to_json(preset(family + "-tiny"));
    EXPECT_EQ(config_to_json(config_from_json(json)), json) << family;
    EXPECT_EQ(model_type(config_from_json(json)), family);
  }
  // A Qwen1.5-MoE-A2.7B-style file: transformers' defaults for what it leaves out.
  auto q2 = std::get<MixtralConfig>(config_from_json(
      R"({"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4, "attention_bias": true,
          "use_sliding_window": true, "max_window_layers": 3, "num_hidden_layers": 4, "router_jitter_noise": 0.1})"));
  EXPECT_EQ(q2.num_local_experts, 60);
  EXPECT_FALSE(q2.norm_topk_prob);
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.attention_bias);  // not a Qwen2MoeConfig key: kept as unused JSON
  EXPECT_TRUE(q2.extra.contains("attention_bias"));
  EXPECT_TRUE(q2.extra.contains("router_jitter_noise"));
  EXPECT_EQ(q2.shared_expert_intermediate_size, 5632);
  EXPECT_EQ(q2.expert_intermediate_size(), 1408);
  // Qwen2MoeConfig's own window pattern: even layers below max_window_layers.
  EXPECT_EQ(q2.layer_window(0), 4096);
  EXPECT_EQ(q2.layer_window(1), 0);
  EXPECT_EQ(q2.layer_window(2), 4096);
  EXPECT_EQ(q2.layer_window(3), 0);
  // Qwen2MoeConfig saves sliding_window 0 when use_sliding_window is false: read as no window.
  EXPECT_FALSE(std::get<MixtralConfig>(config_from_json(R"({"model_type": "qwen2_moe", "sliding_window": 0})"))
                   .sliding_window.has_value());
  // Qwen3MoeConfig writes num_local_experts (its attribute_map) and reads num_experts: both honoured.
  auto q3 = std::get<MixtralConfig>(config_from_json(
      R"({"model_type": "qwen3_moe", "num_local_experts": 16, "use_sliding_window": true, "sliding_window": 32})"));
  EXPECT_EQ(q3.num_local_experts, 16);
  EXPECT_TRUE(q3.qk_norm);
  for (int64_t layer : {0, 5, 23}) EXPECT_EQ(q3.layer_window(layer), 32);  // every layer slides
  EXPECT_EQ(std::get<MixtralConfig>(config_from_json(R"({"model_type": "qwen3_moe", "num_experts": 12})")).num_local_experts,
            12);
}

}  // namespace
}  // namespace colossus::models
