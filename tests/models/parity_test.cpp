// Acceptance tests against Hugging Face transformers, both directions:
// HF-saved tiny models load here and give HF's logits, loss and gradients;
// models saved here load in transformers and give our logits.
#include "colossus/checkpoint/safetensors.h"
#include "colossus/models/pretrained.h"
#include "tests/models/oracle.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace colossus::models {
namespace {

namespace fs = std::filesystem;
using testing::hf_reference_dir;
using testing::max_abs_diff;
using testing::max_rel_diff;

constexpr double kLogitsTolerance = 1e-4;  // fp32, max abs
constexpr double kGradTolerance = 1e-4;    // fp32, max rel to the HF gradient's scale

class HfToColossus : public ::testing::TestWithParam<std::string> {};

// Every parameter's gradient (after backward) against HF's "grad.<name>" in
// `reference`, under the checkpoint's names (Phi-3's fused qkv_proj and
// gate_up_proj are the concatenated gradients of q/k/v and gate/up).
void expect_hf_gradients(CausalLM& model, const std::map<std::string, at::Tensor>& reference,
                         const std::string& label) {
  checkpoint::NamedTensors grads;
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << name << " got no gradient";
    EXPECT_TRUE(at::isfinite(grad).all().item<bool>()) << name << " has a non-finite gradient";
    grads.emplace_back(name, grad);
  }
  size_t compared = 0;
  double worst_grad = 0.0;
  for (const auto& [name, grad] : checkpoint_tensors(model.config(), grads)) {
    auto hf_grad = reference.find("grad." + name);
    ASSERT_NE(hf_grad, reference.end()) << "HF has no parameter " << name;
    const double rel = max_rel_diff(grad, hf_grad->second);
    EXPECT_LE(rel, kGradTolerance) << name;
    worst_grad = std::max(worst_grad, rel);
    ++compared;
  }
  std::cout << label << ", max rel gradient diff " << worst_grad << "\n";
  // Every HF parameter has a counterpart here (tied heads are one parameter in both).
  size_t hf_params = 0;
  for (const auto& [key, _] : reference) hf_params += key.starts_with("grad.");
  EXPECT_EQ(compared, hf_params);
}

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
  expect_hf_gradients(*model, reference, GetParam() + ": max rel logits diff " +
                                             std::to_string(max_rel_diff(logits, reference.at("logits"))));
}

// A padded batch (attention_mask; row 0 padded on the right, row 1 on the
// left): logits at the real tokens, the loss and every gradient equal HF's.
TEST_P(HfToColossus, PaddedBatchMatchesTransformers) {
  const fs::path dir = hf_reference_dir() / GetParam();
  auto reference = checkpoint::load_state_dict((dir / "padded.safetensors").string());
  auto model = load_pretrained(dir.string());
  model->eval();
  const at::Tensor& ids = reference.at("input_ids");
  const TokenLayout layout = TokenLayout::from_attention_mask(reference.at("attention_mask"));
  const at::Tensor real = reference.at("attention_mask").to(at::kBool);

  at::Tensor logits = model->forward(ids, layout);
  const at::Tensor ours = logits.masked_select(real.unsqueeze(-1)),
                   theirs = reference.at("logits").masked_select(real.unsqueeze(-1));
  EXPECT_LE(max_abs_diff(ours, theirs), kLogitsTolerance);
  EXPECT_LE(max_rel_diff(ours, theirs), kLogitsTolerance);
  at::Tensor loss = model->loss(logits, reference.at("labels"));
  EXPECT_NEAR(loss.item<double>(), reference.at("loss").item<double>(), kLogitsTolerance);
  {
    at::NoGradGuard no_grad;  // the fused head + cross-entropy path takes the layout too
    EXPECT_NEAR(model->forward_loss(ids, reference.at("labels"), std::nullopt, layout).item<double>(),
                reference.at("loss").item<double>(), kLogitsTolerance);
  }
  loss.backward();
  expect_hf_gradients(*model, reference, GetParam() + " padded: max rel logits diff " +
                                             std::to_string(max_rel_diff(ours, theirs)));
}

// Three documents packed into two rows (7 + 9 tokens, then 11 and padding),
// positions restarting per document: each document's logits equal HF's run
// of it alone, and the loss and gradients equal HF's on the padded batch of
// the three (the same targets: a document's first token is no target).
TEST_P(HfToColossus, PackedDocumentsMatchTransformersRunSeparately) {
  const fs::path dir = hf_reference_dir() / GetParam();
  auto reference = checkpoint::load_state_dict((dir / "packed.safetensors").string());
  auto model = load_pretrained(dir.string());
  model->eval();
  const at::Tensor& docs = reference.at("input_ids");  // (3, 11), one document a row
  const auto lengths = reference.at("doc_lengths");
  ASSERT_EQ(lengths.numel(), 3);
  const int64_t first = lengths[0].item<int64_t>(), second = lengths[1].item<int64_t>(), third = lengths[2].item<int64_t>();
  const int64_t seq = first + second;
  ASSERT_GE(seq, third);
  // (row, offset) of each document in the packed batch.
  const std::vector<std::pair<int64_t, int64_t>> placement = {{0, 0}, {0, first}, {1, 0}};
  at::Tensor ids = at::zeros({2, seq}, at::kLong), labels = at::full({2, seq}, -100, at::kLong);
  for (int64_t d = 0; d < 3; ++d) {
    const int64_t length = lengths[d].item<int64_t>();
    const auto [row, offset] = placement[static_cast<size_t>(d)];
    ids[row].narrow(0, offset, length).copy_(docs[d].narrow(0, 0, length));
    labels[row].narrow(0, offset + 1, length - 1).copy_(docs[d].narrow(0, 1, length - 1));
  }
  const TokenLayout layout = TokenLayout::packed({{first, second}, {third}}, seq);

  at::Tensor logits = model->forward(ids, layout);
  double worst = 0.0;
  for (int64_t d = 0; d < 3; ++d) {
    const int64_t length = lengths[d].item<int64_t>();
    const auto [row, offset] = placement[static_cast<size_t>(d)];
    const at::Tensor ours = logits[row].narrow(0, offset, length), theirs = reference.at("logits")[d].narrow(0, 0, length);
    EXPECT_LE(max_abs_diff(ours, theirs), kLogitsTolerance) << "document " << d;
    worst = std::max(worst, max_rel_diff(ours, theirs));
  }
  EXPECT_LE(worst, kLogitsTolerance);
  at::Tensor loss = model->loss(logits, labels);
  EXPECT_NEAR(loss.item<double>(), reference.at("loss").item<double>(), kLogitsTolerance);
  {
    at::NoGradGuard no_grad;
    // HF's padding-free convention (position_ids restarting at 0) reads as the same layout.
    EXPECT_NEAR(model->forward_loss(ids, labels, std::nullopt,
                                    TokenLayout::from_position_ids(layout.position_ids))
                    .item<double>(),
                reference.at("loss").item<double>(), kLogitsTolerance);
  }
  loss.backward();
  expect_hf_gradients(*model, reference, GetParam() + " packed: max rel logits diff " + std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(Cases, HfToColossus,
                         ::testing::Values("gpt2", "llama_gqa", "llama_rope_llama3", "llama_rope_linear",
                                           "llama_rope_dynamic", "qwen2", "qwen3", "mistral", "qwen2_window",
                                           "gemma2", "gemma3", "phi3_longrope_long", "phi3_longrope_short",
                                           "phi3_partial", "phi3_partial_longrope"));

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
  auto phi3_partial = family("phi3-tiny");  // 12 of 16 dims rotate: longrope's lists hold 6 factors
  phi3_partial.rope_scaling.partial_rotary_factor = 0.75;
  phi3_partial.rope_scaling.short_factor.resize(6);
  phi3_partial.rope_scaling.long_factor.resize(6);
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
          {"cpp_phi3_long", phi3_long},
          {"cpp_phi3_partial", phi3_partial}};
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
