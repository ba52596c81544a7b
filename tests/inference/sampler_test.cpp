// The sampler against hand-computed cases and HF's formulas: greedy, top-k,
// top-p, temperature, repetition penalty, seeding, and the empirical
// distribution of many draws.
#include "colossus/inference/sampler.h"
#include "colossus/core/errors.h"

#include <ATen/ops/argmax.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/log.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace colossus::inference {
namespace {

at::Tensor row(std::vector<float> values) { return at::tensor(values, at::kFloat); }

// The ids whose processed logit is still finite.
std::vector<int64_t> kept(const at::Tensor& processed_row) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < processed_row.size(0); ++i) {
    if (std::isfinite(processed_row[i].item<float>())) ids.push_back(i);
  }
  return ids;
}

TEST(Sampler, GreedyIsArgmax) {
  auto generator = make_cpu_generator(1);
  const at::Tensor logits = at::randn({8, 50}, generator);
  const SamplingParams greedy{.do_sample = false};
  EXPECT_TRUE(at::equal(sample_next_batch(logits, {}, greedy, generator), at::argmax(logits, -1)));
  for (int64_t b = 0; b < 8; ++b) {
    EXPECT_EQ(sample_next(logits[b], {}, greedy, generator), at::argmax(logits[b]).item<int64_t>());
  }
}

TEST(Sampler, TopKOneIsGreedy) {
  auto generator = make_cpu_generator(2);
  const at::Tensor logits = at::randn({16, 40}, generator);
  const at::Tensor expected = at::argmax(logits, -1);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto g = make_cpu_generator(seed);
    EXPECT_TRUE(at::equal(sample_next_batch(logits, {}, {.top_k = 1}, g), expected));
  }
}

TEST(Sampler, TopKKeepsTiesWithTheKth) {
  const at::Tensor processed = process_logits(row({1, 3, 2, 3, 0}).unsqueeze(0), {}, {.top_k = 2})[0];
  EXPECT_EQ(kept(processed), (std::vector<int64_t>{1, 3}));
  const at::Tensor three = process_logits(row({1, 3, 2, 2, 0}).unsqueeze(0), {}, {.top_k = 2})[0];
  EXPECT_EQ(kept(three), (std::vector<int64_t>{1, 2, 3}));  // HF keeps every logit >= the k-th
  const at::Tensor all = process_logits(row({1, 3, 2}).unsqueeze(0), {}, {.top_k = 10})[0];
  EXPECT_EQ(kept(all), (std::vector<int64_t>{0, 1, 2}));  // k larger than V keeps everything
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 in a shuffled order.
  const at::Tensor logits = at::log(row({0.15F, 0.5F, 0.05F, 0.3F})).unsqueeze(0);
  auto keep = [&](double p) { return kept(process_logits(logits, {}, {.top_p = p})[0]); };
  EXPECT_EQ(keep(0.4), (std::vector<int64_t>{1}));
  EXPECT_EQ(keep(0.75), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(keep(0.85), (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(keep(0.99), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(keep(1.0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(keep(1e-6), (std::vector<int64_t>{1}));  // min_tokens_to_keep = 1
}

TEST(Sampler, TemperatureZeroAndNearZeroAreGreedy) {
  auto generator = make_cpu_generator(3);
  const at::Tensor logits = at::randn({16, 30}, generator);
  const at::Tensor expected = at::argmax(logits, -1);
  EXPECT_TRUE(at::equal(sample_next_batch(logits, {}, {.temperature = 0.0}, generator), expected));
  for (uint64_t seed = 0; seed < 10; ++seed) {
    auto g = make_cpu_generator(seed);
    EXPECT_TRUE(at::equal(sample_next_batch(logits, {}, {.temperature = 1e-4}, g), expected));
  }
}

TEST(Sampler, TemperatureDividesTheLogits) {
  const at::Tensor processed = process_logits(row({1, -2, 4}).unsqueeze(0), {}, {.temperature = 0.5})[0];
  EXPECT_TRUE(at::equal(processed, row({2, -4, 8})));
}

TEST(Sampler, RepetitionPenaltyAsHf) {
  // HF: score < 0 ? score * penalty : score / penalty, for each distinct context token.
  const at::Tensor logits = row({2.0F, -1.0F, 0.5F, 3.0F}).unsqueeze(0);
  const at::Tensor processed = process_logits(logits, {{0, 1, 1, 0}}, {.repetition_penalty = 2.0})[0];
  EXPECT_TRUE(at::equal(processed, row({1.0F, -2.0F, 0.5F, 3.0F})));
  // It applies in greedy mode too and can change the argmax.
  auto generator = make_cpu_generator(0);
  EXPECT_EQ(sample_next(row({2.0F, 1.5F}), {}, {.do_sample = false, .repetition_penalty = 2.0}, generator), 0);
  EXPECT_EQ(sample_next(row({2.0F, 1.5F}), {0}, {.do_sample = false, .repetition_penalty = 2.0}, generator), 1);
  // A penalty below 1 favours repeats.
  const at::Tensor favoured = process_logits(logits, {{1, 3}}, {.repetition_penalty = 0.5})[0];
  EXPECT_TRUE(at::equal(favoured, row({2.0F, -0.5F, 0.5F, 6.0F})));
  EXPECT_THROW(process_logits(logits, {{4}}, {.repetition_penalty = 2.0}), ConfigError);
}

TEST(Sampler, SeededSamplingIsReproducible) {
  auto generator = make_cpu_generator(4);
  const at::Tensor logits = at::randn({100}, generator);
  auto draw = [&](uint64_t seed) {
    auto g = make_cpu_generator(seed);
    std::vector<int64_t> ids;
    for (int i = 0; i < 200; ++i) ids.push_back(sample_next(logits, {}, {.temperature = 1.5, .top_p = 0.95}, g));
    return ids;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

// 20k draws in one batch: each token's frequency within 0.012 of its
// probability (about 4 standard deviations at p = 0.5).
void expect_frequencies(const at::Tensor& logits, const SamplingParams& params, const at::Tensor& probs) {
  constexpr int64_t kDraws = 20000;
  auto generator = make_cpu_generator(5);
  const at::Tensor draws =
      sample_next_batch(logits.unsqueeze(0).expand({kDraws, logits.size(0)}), {}, params, generator);
  for (int64_t v = 0; v < logits.size(0); ++v) {
    const double frequency = (draws == v).sum().item<double>() / kDraws;
    EXPECT_NEAR(frequency, probs[v].item<double>(), 0.012) << "token " << v;
  }
}

TEST(Sampler, EmpiricalDistributionMatchesSoftmax) {
  const at::Tensor logits = row({1.0F, 0.2F, -0.5F, 2.0F, 0.0F, -3.0F});
  expect_frequencies(logits, {}, at::softmax(logits, 0));
  // Temperature and top-k: softmax of logits / T over the 3 largest.
  const at::Tensor top3 = row({1.0F, 0.2F, -INFINITY, 2.0F, -INFINITY, -INFINITY});
  expect_frequencies(logits, {.temperature = 0.7, .top_k = 3}, at::softmax(top3 / 0.7, 0));
}

TEST(Sampler, ValidateNamesTheBadValue) {
  auto message = [](const SamplingParams& p) {
    try {
      p.validate();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.top_p = 0.0}).find("top_p = 0"), std::string::npos);
  EXPECT_NE(message({.top_p = 1.5}).find("(0, 1]"), std::string::npos);
  EXPECT_NE(message({.temperature = -1}).find("temperature = -1"), std::string::npos);
  EXPECT_NE(message({.top_k = -3}).find("top_k = -3"), std::string::npos);
  EXPECT_NE(message({.repetition_penalty = 0}).find("repetition_penalty = 0"), std::string::npos);
  EXPECT_EQ(message({}), "no error");
  auto generator = make_cpu_generator(0);
  EXPECT_THROW(sample_next(row({1, 2}), {}, {.top_p = 2.0}, generator), ConfigError);
  EXPECT_THROW(sample_next(row({1, 2}).unsqueeze(0), {}, {}, generator), ConfigError);
}

}  // namespace
}  // namespace colossus::inference
