// LoraLinear on its own: PEFT's initialisation, the forward formula over a
// Linear and a GPT-2 Conv1D, fp32 adapters over a bf16 base (PEFT's casts),
// merging, dropout, and LLaMA's fuse_projections() leaving LoRA layers alone.
#include "colossus/lora/lora_linear.h"
#include "colossus/lora/inject.h"
#include "colossus/models/llama.h"
#include "tests/lora/lora_testing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

namespace colossus::lora {
namespace {

using testing::max_rel_diff;

at::Tensor seeded_randn(at::IntArrayRef sizes, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(sizes, generator, at::kFloat);
}

std::shared_ptr<models::Linear> linear(int64_t in, int64_t out, bool bias, at::ScalarType dtype = at::kFloat) {
  auto layer = std::make_shared<models::Linear>(in, out, bias, at::TensorOptions().dtype(dtype));
  at::NoGradGuard no_grad;
  layer->weight.copy_(seeded_randn({out, in}, 1) * 0.2);
  if (bias) layer->bias.copy_(seeded_randn({out}, 2));
  return layer;
}

void set_b(LoraLinear& lora, uint64_t seed) {
  at::NoGradGuard no_grad;
  lora.lora_B.copy_(seeded_randn(lora.lora_B.sizes(), seed) * 0.3);
}

TEST(LoraLinear, DefaultInitIsANoOpWithKaimingA) {
  auto base = linear(48, 24, true);
  LoraLinear lora(base, 8, 2.0, 0.0, LoraInit::Kaiming, 42);
  EXPECT_EQ(lora.lora_A.sizes(), (at::IntArrayRef{8, 48}));
  EXPECT_EQ(lora.lora_B.sizes(), (at::IntArrayRef{24, 8}));
  EXPECT_EQ(lora.lora_A.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(lora.lora_B, at::zeros_like(lora.lora_B)));
  // kaiming_uniform_(a = sqrt(5)) on (r, in): U(-1/sqrt(in), 1/sqrt(in)).
  const double bound = 1.0 / std::sqrt(48.0);
  EXPECT_LE(lora.lora_A.abs().max().item<double>(), bound);
  EXPECT_GT(lora.lora_A.abs().max().item<double>(), 0.9 * bound);
  EXPECT_NEAR(lora.lora_A.var().item<double>(), bound * bound / 3.0, 0.2 * bound * bound / 3.0);
  // The same seed gives the same A; another seed another.
  EXPECT_TRUE(at::equal(LoraLinear(linear(48, 24, true), 8, 2.0, 0.0, LoraInit::Kaiming, 42).lora_A, lora.lora_A));
  EXPECT_FALSE(at::equal(LoraLinear(linear(48, 24, true), 8, 2.0, 0.0, LoraInit::Kaiming, 43).lora_A, lora.lora_A));
  const at::Tensor x = seeded_randn({2, 5, 48}, 3);
  EXPECT_TRUE(at::equal(lora.forward(x), base->forward(x)));
  // Gaussian: std 1/r; B zeros.
  LoraLinear gaussian(linear(48, 24, true), 8, 2.0, 0.0, LoraInit::Gaussian, 42);
  EXPECT_NEAR(gaussian.lora_A.std().item<double>(), 1.0 / 8.0, 0.02);
  EXPECT_TRUE(at::equal(gaussian.lora_B, at::zeros_like(gaussian.lora_B)));
}

TEST(LoraLinear, ParametersKeepTheBaseNamesAndOnlyAdaptersTrain) {
  LoraLinear lora(linear(16, 8, true), 4, 1.0, 0.0, LoraInit::Kaiming, 1);
  std::vector<std::string> names;
  for (const auto& item : lora.named_parameters()) {
    names.push_back(item.key());
    const bool adapter = item.key().starts_with("lora_");
    EXPECT_EQ(item.value().requires_grad(), adapter) << item.key();
  }
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "lora_A.weight", "lora_B.weight"}));
}

TEST(LoraLinear, ForwardIsBasePlusScaledLowRankPathOverLinearAndConv1D) {
  auto base = linear(16, 12, true);
  LoraLinear lora(base, 4, 0.75, 0.0, LoraInit::Kaiming, 7);
  set_b(lora, 8);
  const at::Tensor x = seeded_randn({3, 16}, 9);
  const at::Tensor expected = base->forward(x) + at::matmul(at::matmul(x, lora.lora_A.t()), lora.lora_B.t()) * 0.75;
  EXPECT_LE(max_rel_diff(lora.forward(x), expected), 1e-6);

  auto conv = std::make_shared<models::Conv1D>(16, 12, at::TensorOptions());
  {
    at::NoGradGuard no_grad;
    conv->weight.copy_(seeded_randn({16, 12}, 10));
    conv->bias.copy_(seeded_randn({12}, 11));
  }
  LoraLinear lora_conv(conv, 4, 0.75, 0.0, LoraInit::Kaiming, 7);
  EXPECT_TRUE(lora_conv.fan_in_fan_out());
  EXPECT_EQ(lora_conv.lora_A.sizes(), (at::IntArrayRef{4, 16}));  // (r, in), as PEFT's Conv1D adapters
  EXPECT_EQ(lora_conv.lora_B.sizes(), (at::IntArrayRef{12, 4}));
  set_b(lora_conv, 8);
  const at::Tensor conv_expected =
      conv->forward(x) + at::matmul(at::matmul(x, lora_conv.lora_A.t()), lora_conv.lora_B.t()) * 0.75;
  EXPECT_LE(max_rel_diff(lora_conv.forward(x), conv_expected), 1e-6);
  EXPECT_EQ(lora_conv.delta_weight().sizes(),
            conv->weight.sizes());  // (in, out)

  // Merged plain layers compute the same, each of its own kind.
  for (LoraLinear* layer : {&lora, &lora_conv}) {
    const auto merged = layer->merged();
    EXPECT_EQ(dynamic_cast<models::Conv1D*>(merged.get()) != nullptr, layer->fan_in_fan_out());
    EXPECT_LE(max_rel_diff(merged->forward(x), layer->forward(x)), 1e-6);
    for (const auto& p : merged->parameters()) EXPECT_FALSE(p.requires_grad());
  }
}

TEST(LoraLinear, Fp32AdaptersOverABf16BaseCastAsPeftDoes) {
  auto base = linear(32, 16, true, at::kBFloat16);
  LoraLinear lora(base, 4, 2.0, 0.0, LoraInit::Kaiming, 3);
  set_b(lora, 4);
  EXPECT_EQ(lora.lora_A.scalar_type(), at::kFloat);
  const at::Tensor x = seeded_randn({2, 3, 32}, 5).to(at::kBFloat16);
  const at::Tensor y = lora.forward(x);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  // PEFT: result = base(x) (bf16); x cast to fp32 for the adapter; the sum
  // promotes to fp32; one cast back to bf16.
  const at::Tensor lora_path = at::linear(at::linear(x.to(at::kFloat), lora.lora_A), lora.lora_B) * 2.0;
  const at::Tensor expected = (base->forward(x).to(at::kFloat) + lora_path).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(y, expected));
  y.to(at::kFloat).sum().backward();
  EXPECT_EQ(lora.lora_A.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(lora.lora_B.grad().scalar_type(), at::kFloat);
  EXPECT_FALSE(base->weight.grad().defined());
  // Merging keeps the base dtype.
  EXPECT_EQ(lora.merged()->parameters().front().scalar_type(), at::kBFloat16);
}

TEST(LoraLinear, DropoutOnlyInTraining) {
  LoraLinear lora(linear(16, 8, false), 4, 1.0, 0.5, LoraInit::Kaiming, 1);
  set_b(lora, 2);
  const at::Tensor x = seeded_randn({4, 16}, 3);
  lora.train();
  EXPECT_FALSE(at::equal(lora.forward(x), lora.forward(x)));
  lora.eval();
  const at::Tensor expected = lora.base()->forward(x) + at::linear(at::linear(x, lora.lora_A), lora.lora_B);
  EXPECT_LE(max_rel_diff(lora.forward(x), expected), 1e-6);
}

// fuse_projections() merges q/k/v and gate/up into one matmul for inference;
// with LoRA on q_proj and gate_proj it must leave those projections alone (the
// merged matmul would drop the adapters), so eval logits stay the same.
TEST(LoraLinear, FuseProjectionsSkipsLoraLayers) {
  auto model = testing::tiny_llama(5);
  apply_lora(*model, {.r = 4, .target_modules = {"q_proj", "gate_proj"}});
  for (const auto& [path, layer] : lora_layers(*model)) set_b(*layer, 6);
  model->eval();
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor ids = at::randint(64, {2, 9}, generator, at::kLong);
  const at::Tensor before = model->forward(ids);
  model->fuse_projections();
  EXPECT_TRUE(at::equal(model->forward(ids), before));
  EXPECT_EQ(lora_layers(*model).size(), 4u);
  // After merging, the plain layers fuse as before and give the same logits.
  merge_lora(*model);
  model->fuse_projections();
  EXPECT_LE(max_rel_diff(model->forward(ids), before), 1e-5);
  // The adapters did contribute, so the checks above could fail.
  auto plain = testing::tiny_llama(5);
  plain->eval();
  EXPECT_GT(max_rel_diff(plain->forward(ids), before), 1e-3);
}

// Training merges q/k/v and gate/up into one matmul each way (merged_linear.h)
// only where every projection is a plain Linear: with LoRA on q_proj and
// up_proj the separate layers run, so training's logits are eval's (no
// dropout), adapters included, and the adapters get gradients.
TEST(LoraLinear, TrainingMergedProjectionsSkipLoraLayers) {
  auto model = testing::tiny_llama(5);
  apply_lora(*model, {.r = 4, .target_modules = {"q_proj", "up_proj"}});
  for (const auto& [path, layer] : lora_layers(*model)) set_b(*layer, 6);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(8);
  const at::Tensor ids = at::randint(64, {2, 9}, generator, at::kLong);
  model->eval();
  at::Tensor eval_logits;
  {
    at::NoGradGuard no_grad;
    eval_logits = model->forward(ids);
  }
  model->train();
  const at::Tensor logits = model->forward(ids);
  EXPECT_LE(max_rel_diff(logits.detach(), eval_logits), 1e-6);
  model->loss(logits, ids).backward();
  for (const auto& [path, layer] : lora_layers(*model)) {
    ASSERT_TRUE(layer->lora_B.grad().defined()) << path;
    EXPECT_GT(layer->lora_B.grad().abs().sum().item<double>(), 0.0) << path;
  }
  auto plain = testing::tiny_llama(5);
  plain->eval();
  at::NoGradGuard no_grad;
  EXPECT_GT(max_rel_diff(plain->forward(ids), eval_logits), 1e-3) << "the adapters contributed nothing: no check";
}

}  // namespace
}  // namespace colossus::lora
