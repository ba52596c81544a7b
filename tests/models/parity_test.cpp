// Acceptance tests against Hugging Face transformers, both directions:
// HF-saved tiny models load here and give HF's logits, loss and gradients;
// models saved here load in transformers and give our logits.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/models/pretrained.h"
#include "tests/models/oracle.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/isfinite.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>

namespace colossus::models {
namespace {

namespace fs = std::filesystem;
using testing::hf_reference_dir;
using testing::max_abs_diff;
using testing::max_rel_diff;

constexpr double kLogitsTolerance = 1e-4;  // fp32, max abs
constexpr double kGradTolerance = 1e-4;    // fp32, max rel to the HF gradient's scale

class HfToColossus : public ::testing::TestWithParam<std::string> {};

TEST_P(HfToColossus, LogitsLossAndGradientsMatchTransformers) {
  const fs::path dir = hf_reference_dir() / GetParam();
  auto reference = checkpoint::load_state_dict((dir / "reference.safetensors").string());
  auto model = load_pretrained(dir.string());
  model->eval();

  at::Tensor logits = model->forward(reference.at("input_ids"));
  ASSERT_EQ(logits.sizes(), reference.at("logits").sizes());
  EXPECT_LE(max_abs_diff(logits, reference.at("logits")), kLogitsTolerance);
  EXPECT_LE(max_rel_diff(logits, reference.at("logits")), kLogitsTolerance);

  at::Tensor loss = model->loss(logits, reference.at("labels"));
  EXPECT_NEAR(loss.item<double>(), reference.at("loss").item<double>(), kLogitsTolerance);

  loss.backward();
  // Gradients under the checkpoint's names (Phi-3's fused qkv_proj and
  // gate_up_proj are the concatenated gradients of q/k/v and gate/up).
  checkpoint::NamedTensors grads;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << name << " got no gradient";
    EXPECT_TRUE(at::isfinite(grad).all().item<bool>()) << name << " has a non-finite gradient";
    grads.emplace_back(name, grad);
  }
  size_t compared = 0;
  double worst_grad = 0.0;
  for (const auto& [name, grad] : checkpoint_tensors(model->config(), grads)) {
    auto hf_grad = reference.find("grad." + name);
    ASSERT_NE(hf_grad, reference.end()) << "HF has no parameter " << name;
    const double rel = max_rel_diff(grad, hf_grad->second);
    EXPECT_LE(rel, kGradTolerance) << name;
    worst_grad = std::max(worst_grad, rel);
    ++compared;
  }
  std::cout << GetParam() << ": max rel logits diff " << max_rel_diff(logits, reference.at("logits"))
            << ", max rel gradient diff " << worst_grad << "\n";
  // Every HF parameter has a counterpart here (tied heads are one parameter in both).
  size_t hf_params = 0;
  for (const auto& [key, _] : reference) hf_params += key.starts_with("grad.");
  EXPECT_EQ(compared, hf_params);
}

INSTANTIATE_TEST_SUITE_P(Cases, HfToColossus,
                         ::testing::Values("gpt2", "llama_gqa", "llama_rope_llama3", "llama_rope_linear",
                                           "llama_rope_dynamic", "qwen2", "qwen3", "mistral", "qwen2_window",
                                           "gemma2", "gemma3", "phi3_longrope_long", "phi3_longrope_short"));

struct CppCase {
  std::string name;
  ModelConfig config;
};

std::vector<CppCase> cpp_cases() {
  auto gpt2 = std::get<GPT2Config>(preset("gpt2-tiny"));
  gpt2.initializer_range = 0.2;  // logits of order 1, so 1e-4 is a real bound
  auto gpt2_untied = gpt2;
  gpt2_untied.tie_word_embeddings = false;
  gpt2_untied.scale_attn_by_inverse_layer_idx = true;
  gpt2_untied.activation_function = "gelu";
  gpt2_untied.n_inner = 96;

  auto llama = std::get<LlamaConfig>(preset("llama-tiny"));  // GQA: 4 heads, 2 kv heads
  llama.initializer_range = 0.2;
  llama.attention_bias = true;
  auto llama3_tied = llama;
  llama3_tied.attention_bias = false;
  llama3_tied.mlp_bias = true;
  llama3_tied.tie_word_embeddings = true;
  llama3_tied.rope_theta = 500000.0;
  llama3_tied.rope_scaling = {.rope_type = "llama3", .factor = 8.0, .original_max_position_embeddings = 1024};
  auto family = [](const char* name) {
    auto c = std::get<LlamaConfig>(preset(name));
    c.initializer_range = 0.2;
    return c;
  };
  auto qwen3_bias = family("qwen3-tiny");
  qwen3_bias.attention_bias = true;
  // Windows on the last layer only, shorter than the 16 tokens compared.
  auto qwen3_window = family("qwen3-tiny");
  qwen3_window.use_sliding_window = true;
  qwen3_window.sliding_window = 5;
  qwen3_window.max_window_layers = 1;
  // Phi-3: longrope over 32 original positions (16 tokens: short_factor),
  // and over 8 with a window of 6 and a given attention factor (long_factor).
  auto phi3_long = family("phi3-tiny");
  phi3_long.rope_scaling.original_max_position_embeddings = 8;
  phi3_long.rope_scaling.attention_factor = 1.3;
  phi3_long.sliding_window = 6;
  return {{"cpp_gpt2", gpt2},
          {"cpp_gpt2_untied", gpt2_untied},
          {"cpp_llama_gqa", llama},
          {"cpp_llama3_tied", llama3_tied},
          {"cpp_qwen2", family("qwen2-tiny")},
          {"cpp_qwen3", qwen3_bias},
          {"cpp_qwen3_window", qwen3_window},
          {"cpp_mistral", family("mistral-tiny")},
          {"cpp_gemma2", family("gemma2-tiny")},
          {"cpp_gemma3", family("gemma3-tiny")},
          {"cpp_phi3", family("phi3-tiny")},
          {"cpp_phi3_long", phi3_long}};
}

TEST(ColossusToHf, TransformersLoadsOurCheckpointsAndAgreesOnLogits) {
  std::string dirs;
  uint64_t seed = 11;
  for (const auto& c : cpp_cases()) {
    auto model = create_model(c.config, {.seed = seed});
    testing::perturb_parameters(*model, seed + 100);
    model->eval();
    at::Tensor ids = testing::random_ids(2, 16, vocab_size(c.config), seed);
    at::Tensor logits;
    {
      at::NoGradGuard no_grad;
      logits = model->forward(ids);
    }
    const fs::path dir = testing::scratch_dir() / c.name;
    save_pretrained(*model, dir.string());
    checkpoint::save_safetensors((dir / "cpp_logits.safetensors").string(), {{"input_ids", ids}, {"logits", logits}});
    dirs += fmt::format(" '{}'", dir.string());
    ++seed;
  }
  testing::PythonResult result = testing::run_oracle("check" + dirs);
  std::cout << result.output;  // the per-model differences, for the log
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // One verdict line per model, so a silently skipped case cannot pass.
  size_t ok_lines = 0;
  for (size_t pos = 0; (pos = result.output.find("-> ok", pos)) != std::string::npos; ++pos) ++ok_lines;
  EXPECT_EQ(ok_lines, cpp_cases().size()) << result.output;
}

}  // namespace
}  // namespace colossus::models
