// The LM head fused with the cross-entropy (models/linear_cross_entropy.h)
// against the unfused head + causal_lm_loss: loss and every gradient, fp32
// and bf16, odd vocab sizes (padding), several chunks, ignored labels,
// num_items, evaluation without autograd, bad input; on CUDA (when present)
// the fused row kernel against the CPU on the same inputs.
#include "colossus/core/errors.h"
#include "colossus/models/causal_lm.h"
#include "colossus/models/linear_cross_entropy.h"
#include "colossus/models/pretrained.h"
#include "tests/models/oracle.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>

namespace colossus::models {
namespace {

using testing::random_ids;

double rel_norm(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() / b.to(at::kDouble).norm().item<double>();
}

struct Grads {
  at::Tensor loss, hidden, weight;
};

Grads run(bool fused, const at::Tensor& hidden0, const at::Tensor& weight0, const at::Tensor& labels,
          std::optional<int64_t> num_items, const LinearCrossEntropyOptions& options = {}) {
  at::Tensor hidden = hidden0.detach().clone().requires_grad_(true);
  at::Tensor weight = weight0.detach().clone().requires_grad_(true);
  at::Tensor loss = fused ? causal_lm_linear_cross_entropy(hidden, weight, labels, num_items, options)
                          : causal_lm_loss(at::linear(hidden, weight), labels, num_items);
  loss.backward();
  return {loss.detach(), hidden.grad(), weight.grad()};
}

TEST(LinearCrossEntropy, ReferenceRowsMatchLogSoftmax) {
  const int64_t rows = 9, vocab = 37, ld = 64;
  at::Tensor logits = at::randn({rows, ld}) * 4;
  at::Tensor targets = at::randint(vocab, {rows}, at::kLong);
  targets[3] = -100;
  const at::Tensor x = logits.narrow(1, 0, vocab).to(at::kDouble);
  const at::Tensor logp = at::log_softmax(x, 1);
  at::Tensor row_loss = cross_entropy_rows_reference(logits, vocab, targets, -100, 0.5, /*write_grad=*/true);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = targets[r].item<int64_t>();
    const double expect = t == -100 ? 0.0 : -logp[r][t].item<double>();
    EXPECT_NEAR(row_loss[r].item<double>(), expect, 1e-5 * (1 + std::abs(expect))) << "row " << r;
    for (int64_t c = 0; c < ld; ++c) {
      double g = 0;
      if (t != -100 && c < vocab) g = 0.5 * (std::exp(logp[r][c].item<double>()) - (c == t ? 1.0 : 0.0));
      ASSERT_NEAR(logits[r][c].item<double>(), g, 1e-6) << "row " << r << " column " << c;
    }
  }
}

TEST(LinearCrossEntropy, MatchesUnfusedLossAndGradsAcrossChunksAndPadding) {
  // Vocab 203 pads to 256; 64-byte chunks of logits rows give one row per
  // chunk, 4096 bytes several rows, the default one chunk.
  const int64_t batch = 3, seq = 11, width = 16, vocab = 203;
  const at::Tensor hidden = at::randn({batch, seq, width});
  const at::Tensor weight = at::randn({vocab, width}) * 0.3;
  at::Tensor labels = random_ids(batch, seq, vocab, 7);
  labels[1][4] = -100;
  labels[2][0] = -100;
  const Grads ref = run(false, hidden, weight, labels, std::nullopt);
  for (int64_t chunk_bytes : {int64_t{64}, int64_t{4096}, LinearCrossEntropyOptions{}.chunk_bytes}) {
    for (std::optional<int64_t> num_items : {std::optional<int64_t>(), std::optional<int64_t>(50)}) {
      const Grads expect = num_items ? run(false, hidden, weight, labels, num_items) : ref;
      const Grads got = run(true, hidden, weight, labels, num_items, {.chunk_bytes = chunk_bytes});
      SCOPED_TRACE(::testing::Message() << "chunk_bytes " << chunk_bytes << " num_items " << num_items.value_or(0));
      EXPECT_LE(rel_norm(got.loss, expect.loss), 1e-6);
      EXPECT_LE(rel_norm(got.hidden, expect.hidden), 1e-5);
      EXPECT_LE(rel_norm(got.weight, expect.weight), 1e-5);
      EXPECT_EQ(got.weight.sizes(), weight.sizes());  // the padding never leaks out
      EXPECT_EQ(got.weight.scalar_type(), at::kFloat);
    }
  }
}

TEST(LinearCrossEntropy, Bf16FollowsTheUnfusedBf16Path) {
  const at::Tensor hidden = at::randn({2, 24, 32}).to(at::kBFloat16);
  const at::Tensor weight = (at::randn({131, 32}) * 0.2).to(at::kBFloat16);
  const at::Tensor labels = random_ids(2, 24, 131, 3);
  const Grads expect = run(false, hidden, weight, labels, std::nullopt);
  const Grads got = run(true, hidden, weight, labels, std::nullopt, {.chunk_bytes = 2048});
  EXPECT_EQ(got.hidden.scalar_type(), at::kBFloat16);
  EXPECT_EQ(got.weight.scalar_type(), at::kBFloat16);
  EXPECT_LE(rel_norm(got.loss, expect.loss), 1e-3);
  EXPECT_LE(rel_norm(got.hidden, expect.hidden), 2e-2);
  EXPECT_LE(rel_norm(got.weight, expect.weight), 2e-2);
}

TEST(LinearCrossEntropy, ModelForwardLossEqualsLossOfForward) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(name);
    ModelConfig config = preset(name);
    // An odd vocab, so the head is padded (GPT-2 tied, LLaMA untied).
    std::visit([](auto& c) { c.vocab_size = 131; }, config);
    auto fused = create_model(config, {.seed = 5});
    auto plain = create_model(config, {.seed = 5});
    const at::Tensor ids = random_ids(2, 16, 131, 1);
    at::Tensor loss_fused = fused->forward_loss(ids, ids);
    at::Tensor loss_plain = plain->loss(plain->forward(ids), ids);
    loss_fused.backward();
    loss_plain.backward();
    EXPECT_LE(rel_norm(loss_fused.detach(), loss_plain.detach()), 1e-6);
    auto a = fused->named_parameters(), b = plain->named_parameters();
    for (const auto& item : a) {
      const at::Tensor& g = item.value().grad();
      ASSERT_TRUE(g.defined()) << item.key();
      EXPECT_LE(rel_norm(g, b[item.key()].grad()), 1e-5) << item.key();
    }
  }
}

TEST(LinearCrossEntropy, EvaluationComputesOnlyTheLoss) {
  const at::Tensor hidden = at::randn({1, 8, 16}, at::TensorOptions().requires_grad(true));
  const at::Tensor weight = at::randn({70, 16});
  const at::Tensor labels = random_ids(1, 8, 70, 2);
  at::NoGradGuard no_grad;
  at::Tensor loss = causal_lm_linear_cross_entropy(hidden, weight, labels);
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_LE(rel_norm(loss, causal_lm_loss(at::linear(hidden, weight), labels)), 1e-6);
}

TEST(LinearCrossEntropy, AllLabelsIgnoredGivesNanAsTheMean) {
  const at::Tensor labels = at::full({1, 4}, -100, at::kLong);
  at::Tensor loss = causal_lm_linear_cross_entropy(at::randn({1, 4, 8}), at::randn({10, 8}), labels);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  EXPECT_TRUE(std::isnan(causal_lm_loss(at::randn({1, 4, 10}), labels).item<double>()));
}

TEST(LinearCrossEntropy, BadInputIsRefusedWithTheReason) {
  const at::Tensor hidden = at::randn({4, 8});
  const at::Tensor weight = at::randn({10, 8});
  const at::Tensor targets = at::zeros({4}, at::kLong);
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { linear_cross_entropy(hidden, at::randn({10, 7}), targets); }).find("weight (V, C)"),
            std::string::npos);
  EXPECT_NE(message([&] { linear_cross_entropy(hidden, weight, targets.to(at::kInt)); }).find("int64 targets"),
            std::string::npos);
  EXPECT_NE(message([&] { linear_cross_entropy(hidden, weight, targets, 0); }).find("num_items is 0"), std::string::npos);
  EXPECT_NE(message([&] { linear_cross_entropy(hidden, weight.to(at::kBFloat16), targets); }).find("cast one"),
            std::string::npos);
}

TEST(LinearCrossEntropy, CudaKernelMatchesTheCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  // GPT-2's vocab (odd, padded to 50304), 3 chunks, bf16 as in training.
  const int64_t batch = 4, seq = 128, width = 64, vocab = 50257;
  const at::Tensor hidden = at::randn({batch, seq, width}).to(at::kBFloat16);
  const at::Tensor weight = (at::randn({vocab, width}) * 0.1).to(at::kBFloat16);
  at::Tensor labels = random_ids(batch, seq, vocab, 11);
  labels[0][5] = -100;
  const LinearCrossEntropyOptions options{.chunk_bytes = 200 * 50304 * 2};
  const Grads cpu = run(true, hidden, weight, labels, std::nullopt, options);
  const at::Device cuda(at::kCUDA, 0);
  const Grads gpu = run(true, hidden.to(cuda), weight.to(cuda), labels.to(cuda), std::nullopt, options);
  ASSERT_TRUE(gpu.loss.is_cuda());
  EXPECT_TRUE(std::isfinite(gpu.loss.item<double>()));
  EXPECT_LE(rel_norm(gpu.loss.cpu(), cpu.loss), 1e-3);
  EXPECT_LE(rel_norm(gpu.hidden.cpu(), cpu.hidden), 2e-2);
  EXPECT_LE(rel_norm(gpu.weight.cpu(), cpu.weight), 2e-2);
  // And against the unfused CUDA path (cuBLAS head, ATen cross-entropy).
  const Grads plain = run(false, hidden.to(cuda), weight.to(cuda), labels.to(cuda), std::nullopt);
  EXPECT_LE(rel_norm(gpu.loss.cpu(), plain.loss.cpu()), 1e-3);
  EXPECT_LE(rel_norm(gpu.hidden.cpu(), plain.hidden.cpu()), 2e-2);
  EXPECT_LE(rel_norm(gpu.weight.cpu(), plain.weight.cpu()), 2e-2);
}

}  // namespace
}  // namespace colossus::models
