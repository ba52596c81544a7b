// DeepSeek-V2 / V3: parity with transformers' DeepseekV2ForCausalLM and
// DeepseekV3ForCausalLM in both directions (logits, loss, every parameter's
// gradient; HF checkpoints load, transformers loads ours), config keys
// honoured or refused by name, yarn RoPE, and V3's aux-loss-free balancing
// on a toy router.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/models/deepseek.h"
#include "colossus/models/pretrained.h"
#include "tests/models/oracle.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <iostream>

namespace colossus::models {
namespace {

namespace fs = std::filesystem;
using testing::max_abs_diff;
using testing::max_rel_diff;

constexpr double kTolerance = 1e-4;

class DeepseekFromHf : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepseekFromHf, LogitsLossAndGradientsMatchTransformers) {
  const fs::path dir = testing::hf_reference_dir() / GetParam();
  auto reference = checkpoint::load_state_dict((dir / "reference.safetensors").string());
  auto base = load_pretrained(dir.string());
  auto* model = dynamic_cast<DeepseekForCausalLM*>(base.get());
  ASSERT_NE(model, nullptr);
  model->eval();
  at::Tensor logits = model->forward(reference.at("input_ids"));
  const double logits_diff = max_abs_diff(logits, reference.at("logits"));
  EXPECT_LE(logits_diff, kTolerance);
  at::Tensor loss = model->loss(logits, reference.at("labels"));
  EXPECT_NEAR(loss.item<double>(), reference.at("loss").item<double>(), kTolerance);
  loss.backward();
  size_t compared = 0;
  double worst = 0;
  for (const auto& item : model->named_parameters()) {
    auto hf_grad = reference.find("grad." + item.key());
    ASSERT_NE(hf_grad, reference.end()) << "HF has no parameter " << item.key();
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    const double diff = max_rel_diff(item.value().grad(), hf_grad->second);
    worst = std::max(worst, diff);
    EXPECT_LE(diff, kTolerance) << item.key();
    ++compared;
  }
  size_t hf_params = 0;
  for (const auto& [key, _] : reference) hf_params += key.starts_with("grad.");
  EXPECT_EQ(compared, hf_params);
  std::cout << GetParam() << ": max|logits diff| " << logits_diff << ", max relative grad diff " << worst << " over "
            << compared << " parameters\n";
}

INSTANTIATE_TEST_SUITE_P(Cases, DeepseekFromHf,
                         ::testing::Values("v2_lite_yarn", "v2_qlora_groups", "v3_noaux_yarn", "v3_plain_rope"));

DeepseekConfig tiny(const std::string& family) {
  DeepseekConfig c = DeepseekConfig::defaults(family);
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.moe_intermediate_size = 32;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = 64;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.head_dim = 8;
  c.v_head_dim = 12;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.first_k_dense_replace = 1;
  c.initializer_range = 0.2;
  if (c.is_v3()) {
    c.q_lora_rank = 16;
    c.n_group = 4;
    c.topk_group = 2;
  } else {
    c.q_lora_rank.reset();
  }
  return c;
}

TEST(DeepseekToHf, TransformersLoadsOurCheckpointAndAgrees) {
  std::string dirs;
  std::vector<std::pair<std::string, DeepseekConfig>> cases = {{"cpp_v2_lite", tiny("deepseek_v2")},
                                                               {"cpp_v3_yarn_tied", tiny("deepseek_v3")}};
  cases[1].second.tie_word_embeddings = true;
  cases[1].second.rope_scaling = {.rope_type = "yarn", .factor = 4.0, .original_max_position_embeddings = 8,
                                  .mscale = 1.0, .mscale_all_dim = 0.8};
  uint64_t seed = 5;
  for (const auto& [name, config] : cases) {
    auto base = create_model(config, {.seed = seed});
    auto& model = dynamic_cast<DeepseekForCausalLM&>(*base);
    testing::perturb_parameters(model, seed + 100);
    {
      at::NoGradGuard no_grad;  // a bias that changes which experts are chosen must travel too
      for (DeepseekMoe* moe : model.moe_blocks()) {
        if (moe->gate().e_score_correction_bias.defined()) moe->gate().e_score_correction_bias.normal_(0, 0.2);
      }
    }
    model.eval();
    at::Tensor ids = testing::random_ids(2, 16, config.vocab_size, seed);
    at::NoGradGuard no_grad;
    at::Tensor logits = model.forward(ids);
    const fs::path dir = testing::scratch_dir() / name;
    save_pretrained(model, dir.string());
    checkpoint::save_safetensors((dir / "cpp_logits.safetensors").string(), {{"input_ids", ids}, {"logits", logits}});
    // Our own load gives the same model back (buffers included).
    auto again = load_pretrained(dir.string());
    again->eval();
    EXPECT_EQ(max_abs_diff(again->forward(ids), logits), 0.0) << name;
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

// A config.json as DeepSeek-V2-Lite ships it (sizes shrunk): DeepSeek's own
// keys that transformers ignores are accepted where they agree with it.
std::string v2_lite_json(const std::string& extra = "") {
  return R"({"model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "auto_map": {},
    "vocab_size": 96, "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64,
    "kv_lora_rank": 32, "q_lora_rank": null, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
    "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "ep_size": 1, "scoring_func": "softmax", "topk_method": "greedy", "n_group": 1,
    "topk_group": 1, "norm_topk_prob": false, "routed_scaling_factor": 1.0, "aux_loss_alpha": 0.001,
    "seq_aux": true, "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32,
    "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096},
    "bos_token_id": 100000, "eos_token_id": 100001, "torch_dtype": "bfloat16")" +
         extra + "}";
}

TEST(DeepseekConfigJson, RealV2LiteKeysParseAndRoundTrip) {
  ModelConfig parsed = config_from_json(v2_lite_json());
  const auto& c = std::get<DeepseekConfig>(parsed);
  EXPECT_EQ(model_type(parsed), "deepseek_v2");
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.rope_scaling.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(*c.rope_scaling.mscale_all_dim, 0.707);
  EXPECT_EQ(c.head_dim.value_or(0), 8);
  EXPECT_DOUBLE_EQ(*c.aux_loss_alpha, 0.001);
  // softmax scale: 24^-0.5 * mscale(40, 0.707)^2
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(mla_softmax_scale(c), m * m / std::sqrt(24.0), 1e-12);
  const auto again = std::get<DeepseekConfig>(config_from_json(config_to_json(parsed)));
  EXPECT_EQ(config_to_json(again), config_to_json(parsed));
  EXPECT_EQ(again.rope_scaling.original_max_position_embeddings.value_or(0), 4096);
}

TEST(DeepseekConfigJson, UnsupportedKeysAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"(, "moe_layer_freq": 2)", "moe_layer_freq"},  // duplicate keys: the later one wins in nlohmann
      {R"(, "scoring_func": "sigmoid")", "scoring_func"},
      {R"(, "norm_topk_prob": true)", "norm_topk_prob"},
      {R"(, "topk_method": "noaux_tc")", "topk_method"},
      {R"(, "num_key_value_heads": 2)", "num_key_value_heads"},
      {R"(, "qk_head_dim": 20)", "qk_head_dim"},
      {R"(, "ep_size": 4)", "ep_size"},
      {R"(, "topk_method": "group_limited_greedy", "n_group": 3)", "n_group"},
      {R"(, "hidden_act": "gelu")", "hidden_act"},
  };
  for (const auto& [extra, key] : cases) {
    try {
      config_from_json(v2_lite_json(extra));
      ADD_FAILURE() << "accepted " << extra;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  // V3 routes only by noaux_tc and needs its groups.
  EXPECT_THROW(config_from_json(R"({"model_type": "deepseek_v3", "topk_method": "greedy"})"), ConfigError);
  EXPECT_THROW(config_from_json(R"({"model_type": "deepseek_v3", "n_group": null})"), ConfigError);
}

// V3's aux-loss-free balancing on one router: tokens drawn so a few experts
// win most of them; after each "optimizer step" the bias moves against the
// load, and the imbalance shrinks.
TEST(DeepseekRouterBias, AuxLossFreeUpdatesBalanceTheLoad) {
  DeepseekConfig c = tiny("deepseek_v3");
  c.n_group = 1;
  c.topk_group = 1;
  auto options = at::TensorOptions().dtype(at::kFloat);
  DeepseekMoe moe(c, options);
  {
    at::NoGradGuard no_grad;
    for (auto& p : moe.parameters()) p.normal_(0, 0.2);
    moe.gate().weight.normal_(0, 0.2);
    moe.gate().weight.narrow(0, 0, 2).add_(0.3);  // experts 0 and 1 favoured
  }
  moe.train();
  at::manual_seed(3);
  const at::Tensor x = at::randn({1, 256, c.hidden_size}) + 0.5;
  const auto imbalance = [](const at::Tensor& load) { return (load.max() / load.mean()).item<double>(); };
  at::NoGradGuard no_grad;
  moe.forward(x);
  const at::Tensor first_load = moe.expert_load().clone();
  const double before = imbalance(first_load);
  moe.update_bias(0.01);
  const at::Tensor bias = moe.gate().e_score_correction_bias;
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    const double load = first_load[e].item<double>(), mean = first_load.mean().item<double>();
    const double expected = load > mean ? -0.01 : load < mean ? 0.01 : 0.0;
    EXPECT_DOUBLE_EQ(bias[e].item<double>(), static_cast<float>(expected)) << "expert " << e << " load " << load;
  }
  EXPECT_EQ(moe.expert_load().sum().item<double>(), 0.0);  // the count restarts after an update
  for (int step = 0; step < 60; ++step) {
    moe.forward(x);
    moe.update_bias(0.01);
  }
  moe.forward(x);
  const double after = imbalance(moe.expert_load());
  std::cout << "max/mean expert load: " << before << " -> " << after << "\n";
  EXPECT_GT(before, 1.5);
  EXPECT_LT(after, before * 0.7);
  // Evaluation forwards do not count.
  moe.eval();
  moe.update_bias(0.0);
  moe.forward(x);
  EXPECT_EQ(moe.expert_load().sum().item<double>(), 0.0);
}

TEST(DeepseekRouterBias, ModelUpdatesEveryMoeLayerAndSkipsV2) {
  DeepseekConfig c = tiny("deepseek_v3");
  auto model = std::dynamic_pointer_cast<DeepseekForCausalLM>(create_model(c, {.seed = 1}));
  ASSERT_EQ(model->moe_blocks().size(), 2u);  // layers 1 and 2
  model->train();
  {
    at::NoGradGuard no_grad;
    model->forward(testing::random_ids(2, 16, c.vocab_size, 1));
  }
  model->update_router_biases();
  for (DeepseekMoe* moe : model->moe_blocks()) {
    EXPECT_GT(moe->gate().e_score_correction_bias.abs().sum().item<double>(), 0.0);
    EXPECT_FALSE(moe->gate().e_score_correction_bias.requires_grad());
  }
  auto v2 = std::dynamic_pointer_cast<DeepseekForCausalLM>(create_model(tiny("deepseek_v2"), {.seed = 1}));
  EXPECT_NO_THROW(v2->update_router_biases());
  EXPECT_FALSE(v2->moe_blocks().front()->gate().e_score_correction_bias.defined());
}

}  // namespace
}  // namespace colossus::models
