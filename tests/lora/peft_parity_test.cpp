// Acceptance tests against PEFT, both directions, on tiny random LLaMA and
// GPT-2 models (fp32, dropout 0): a PEFT-saved adapter loads here and gives
// PEFT's logits, adapter gradients and merge_and_unload logits; an adapter
// saved here loads in peft.PeftModel.from_pretrained with the same logits.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/core/errors.h"
#include "colossus/lora/inject.h"
#include "colossus/lora/lora_linear.h"
#include "colossus/lora/peft_io.h"
#include "colossus/models/pretrained.h"
#include "tests/lora/lora_testing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

namespace colossus::lora {
namespace {

namespace fs = std::filesystem;
using testing::max_rel_diff;
using testing::peft_reference_dir;

// fp32 on the CPU, the same ops in the same order as PEFT; measured worst
// cases are printed by each test.
constexpr double kTolerance = 1e-5;

std::string family_of(const std::string& case_name) { return case_name.substr(0, case_name.find('_')); }

class PeftToColossus : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftToColossus, LogitsGradientsAndMergeMatchPeft) {
  const std::string case_name = GetParam();
  const fs::path dir = peft_reference_dir();
  auto reference = checkpoint::load_state_dict((dir / case_name / "reference.safetensors").string());
  auto model = models::load_pretrained((dir / family_of(case_name) / "base").string());
  const LoraConfig config = load_peft_adapter(*model, (dir / case_name / "adapter").string());
  const auto layers = lora_layers(*model);
  ASSERT_FALSE(layers.empty());
  EXPECT_EQ(lora_parameters(*model).size(), 2 * layers.size());

  const at::Tensor ids = reference.at("input_ids");
  const at::Tensor logits = model->forward(ids);
  const double logits_diff = max_rel_diff(logits, reference.at("logits"));
  EXPECT_LE(logits_diff, kTolerance);
  const at::Tensor loss = model->loss(logits, ids);
  EXPECT_LE(max_rel_diff(loss, reference.at("loss")), kTolerance);
  loss.backward();

  double worst_grad = 0.0;
  size_t compared = 0;
  for (const auto& [key, param] : lora_parameters(*model)) {
    ASSERT_TRUE(param.grad().defined()) << key << " got no gradient";
    auto expected = reference.find("grad." + key);
    ASSERT_NE(expected, reference.end()) << "PEFT has no adapter weight " << key;
    const double rel = max_rel_diff(param.grad(), expected->second);
    EXPECT_LE(rel, kTolerance) << key;
    worst_grad = std::max(worst_grad, rel);
    ++compared;
  }
  size_t peft_grads = 0;
  for (const auto& [name, tensor] : reference) peft_grads += name.starts_with("grad.") ? 1 : 0;
  EXPECT_EQ(compared, peft_grads) << "PEFT adapted a different set of layers";
  // Only the adapters train: the base got no gradient.
  for (const auto& item : model->named_parameters()) {
    if (item.key().find(".lora_") == std::string::npos) {
      EXPECT_FALSE(item.value().requires_grad()) << item.key();
      EXPECT_FALSE(item.value().grad().defined()) << item.key();
    }
  }

  EXPECT_EQ(merge_lora(*model), static_cast<int64_t>(layers.size()));
  EXPECT_TRUE(lora_layers(*model).empty());
  at::NoGradGuard no_grad;
  const double merged_diff = max_rel_diff(model->forward(ids), reference.at("merged_logits"));
  EXPECT_LE(merged_diff, kTolerance);
  std::cout << case_name << " (r " << config.r << ", scaling " << config.scaling() << ", " << layers.size()
            << " layers): max rel diff logits " << logits_diff << ", adapter gradients " << worst_grad
            << ", merged logits " << merged_diff << "\n";
}

INSTANTIATE_TEST_SUITE_P(Cases, PeftToColossus,
                         ::testing::Values("llama_qv", "llama_all_linear", "llama_rslora", "gpt2_c_attn",
                                           "gpt2_all_linear"),
                         [](const auto& info) { return info.param; });

// One bf16 Linear with fp32 adapters (PEFT's autocast_adapter_dtype): the
// output bit for bit, the adapters' fp32 gradients within kTolerance.
TEST(PeftToColossus, Bf16BaseWithFp32AdaptersAsPeftCasts) {
  auto reference = checkpoint::load_state_dict((peft_reference_dir() / "bf16_layer.safetensors").string());
  const at::Tensor& weight = reference.at("weight");  // (48, 64) bf16
  auto base = std::make_shared<models::Linear>(weight.size(1), weight.size(0), true, weight.options());
  LoraLinear lora(base, reference.at("lora_A").size(0), /*scaling=*/8.0 / 4.0, 0.0, LoraInit::Kaiming, 0);
  {
    at::NoGradGuard no_grad;
    base->weight.copy_(weight);
    base->bias.copy_(reference.at("bias"));
    lora.lora_A.copy_(reference.at("lora_A"));
    lora.lora_B.copy_(reference.at("lora_B"));
  }
  const at::Tensor y = lora.forward(reference.at("x"));
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(y, reference.at("y"))) << max_rel_diff(y, reference.at("y"));
  y.to(at::kFloat).sum().backward();
  const double grad_a = max_rel_diff(lora.lora_A.grad(), reference.at("grad.lora_A"));
  const double grad_b = max_rel_diff(lora.lora_B.grad(), reference.at("grad.lora_B"));
  EXPECT_LE(grad_a, kTolerance);
  EXPECT_LE(grad_b, kTolerance);
  std::cout << "bf16 base, fp32 adapters: max rel diff output " << max_rel_diff(y, reference.at("y")) << ", grad A "
            << grad_a << ", grad B " << grad_b << "\n";
}

// Random nonzero adapters (B is zero after init, which would test nothing).
void randomise_adapters(torch::nn::Module& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& [key, param] : lora_parameters(model)) {
    at::Tensor values = at::empty(param.sizes(), at::kFloat);
    values.normal_(0.0, 0.1, generator);
    param.copy_(values);
  }
}

struct OursCase {
  std::string name;
  std::string family;
  LoraConfig config;
};

// Adapters made here (apply_lora, random nonzero weights, save_peft_adapter)
// load in PEFT with the same logits (one oracle run checks them all) and load
// back here bit for bit.
TEST(ColossusToPeft, SavedAdaptersLoadInPeftWithTheSameLogits) {
  const std::vector<OursCase> cases = {
      {"llama_qv", "llama", {.r = 4, .lora_alpha = 8, .target_modules = {"q_proj", "v_proj"}}},
      {"llama_all_linear_rslora",
       "llama",
       {.r = 8, .lora_alpha = 16, .target_modules = {"all-linear"}, .use_rslora = true}},
      {"gpt2_c_attn_c_proj", "gpt2", {.r = 4, .lora_alpha = 8, .target_modules = {"c_attn", "c_proj"}}},
      {"gpt2_all_linear", "gpt2", {.r = 2, .lora_alpha = 4, .target_modules = {"all-linear"}}},
  };
  std::string oracle_arguments = "check";
  for (const auto& ours : cases) {
    SCOPED_TRACE(ours.name);
    const fs::path base_dir = peft_reference_dir() / ours.family / "base";
    auto model = models::load_pretrained(base_dir.string());
    const LoraConfig resolved = apply_lora(*model, ours.config, /*seed=*/5);
    randomise_adapters(*model, 9);
    const fs::path out = testing::scratch_dir() / ("ours_" + ours.name);
    save_peft_adapter(*model, ours.config, out.string());
    ASSERT_TRUE(fs::exists(out / "adapter_config.json"));
    ASSERT_TRUE(fs::exists(out / "adapter_model.safetensors"));
    for (const auto& entry : fs::directory_iterator(out)) {  // no temporary files left behind
      EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
    }

    at::NoGradGuard no_grad;
    auto generator = at::make_generator<at::CPUGeneratorImpl>(3);
    const at::Tensor ids = at::randint(96, {2, 12}, generator,
                                       at::kLong);  // the oracle's vocab is 96
    const at::Tensor logits = model->forward(ids);
    const fs::path logits_file = out / "cpp_logits.safetensors";
    checkpoint::save_safetensors(logits_file.string(), {{"input_ids", ids}, {"logits", logits}});
    oracle_arguments += fmt::format(" '{}' '{}' '{}'", out.string(), base_dir.string(), logits_file.string());

    // Back into a fresh model here: the same config and logits, bit for bit.
    auto reloaded = models::load_pretrained(base_dir.string());
    const LoraConfig loaded = load_peft_adapter(*reloaded, out.string());
    EXPECT_EQ(loaded.target_modules, resolved.target_modules);
    EXPECT_EQ(loaded.r, ours.config.r);
    EXPECT_EQ(loaded.use_rslora, ours.config.use_rslora);
    EXPECT_DOUBLE_EQ(loaded.scaling(), ours.config.scaling());
    EXPECT_TRUE(at::equal(reloaded->forward(ids), logits));
  }
  const testing::OracleResult result = testing::run_oracle(oracle_arguments);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("max relative") != std::string::npos) std::cout << "PEFT on " << line << "\n";
  }
}

}  // namespace
}  // namespace colossus::lora
