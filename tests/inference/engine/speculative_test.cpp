// Speculative decoding: greedy output with a drafter equals plain greedy
// decoding (GPT-2 and LLaMA; a drafter that always agrees, one that often
// does not), rejection sampling reproduces the target distribution, seeded
// speculative sampling is reproducible, and a mismatched drafter is refused.
#include "colossus/inference/engine/engine.h"
#include "colossus/inference/engine/speculative.h"

#include "colossus/core/errors.h"
#include "colossus/inference/generate.h"
#include "colossus/inference/sampler.h"
#include "colossus/models/pretrained.h"
#include "tests/inference/support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <random>

namespace colossus::inference {
namespace {

std::vector<std::vector<int64_t>> prompts_of(const std::vector<int64_t>& lengths, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> token(0, 95);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t len : lengths) {
    std::vector<int64_t> p;
    for (int64_t i = 0; i < len; ++i) p.push_back(token(rng));
    prompts.push_back(p);
  }
  return prompts;
}

std::shared_ptr<models::CausalLM> small_drafter(bool llama) {
  if (llama) {
    models::LlamaConfig config{.vocab_size = 96, .hidden_size = 32, .intermediate_size = 48, .num_hidden_layers = 1,
                               .num_attention_heads = 2, .num_key_value_heads = 1, .max_position_embeddings = 64,
                               .initializer_range = 0.2};
    return models::create_model(config, {.seed = 99});
  }
  models::GPT2Config config{.vocab_size = 96, .n_positions = 32, .n_embd = 16, .n_layer = 1, .n_head = 2,
                            .resid_pdrop = 0.0, .embd_pdrop = 0.0, .attn_pdrop = 0.0, .initializer_range = 0.2};
  return models::create_model(config, {.seed = 98});
}

InferenceConfig spec_config() {
  return {.max_batch_size = 3, .max_input_len = 16, .max_output_len = 14, .block_size = 4, .max_n_spec_tokens = 4};
}

TEST(SpeculativeDecoding, GreedyEqualsPlainGreedy) {
  const auto prompts = prompts_of({3, 9, 1, 14, 6}, 21);
  for (bool llama : {false, true}) {
    auto target = llama ? testing::tiny_llama() : testing::tiny_gpt2();
    for (bool same : {true, false}) {
      const std::string what = std::string(llama ? "llama" : "gpt2") + (same ? ", drafter = target" : ", small drafter");
      InferenceEngine engine(target, nullptr, spec_config());
      engine.enable_spec_dec(same ? target : small_drafter(llama));
      const auto outputs = engine.generate(prompts, {.max_new_tokens = 14});
      for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<int64_t> plain = generate(*target, prompts[i], {.max_new_tokens = 14, .sampling = {.do_sample = false}});
        plain.erase(plain.begin(), plain.begin() + static_cast<std::ptrdiff_t>(prompts[i].size()));
        EXPECT_EQ(outputs[i], plain) << what << ", prompt " << i;
      }
      const EngineStats stats = engine.stats();
      EXPECT_GT(stats.draft_tokens, 0) << what;
      if (same) {
        EXPECT_EQ(stats.accepted_draft_tokens, stats.draft_tokens) << what << ": the target agrees with itself";
        EXPECT_LT(stats.steps, 5 * 14) << what << ": accepted drafts should save steps";
      } else {
        EXPECT_LT(stats.accepted_draft_tokens, stats.draft_tokens) << what << ": a different drafter is sometimes wrong";
      }
      EXPECT_EQ(stats.running, 0);
    }
  }
}

TEST(SpeculativeDecoding, RejectionSamplingKeepsTheTargetDistribution) {
  const at::Tensor p = at::tensor({0.05, 0.40, 0.15, 0.30, 0.10}, at::kDouble).to(at::kFloat);
  const at::Tensor q = at::tensor({0.30, 0.10, 0.30, 0.10, 0.20}, at::kDouble).to(at::kFloat);
  const at::Tensor p_next = at::tensor({0.2, 0.2, 0.2, 0.2, 0.2}, at::kDouble).to(at::kFloat);
  at::Generator generator = make_cpu_generator(5);
  constexpr int kTrials = 20000;
  std::vector<int> counts(5, 0);
  int accepted = 0;
  for (int t = 0; t < kTrials; ++t) {
    const int64_t draft = at::multinomial(q, 1, false, generator).item<int64_t>();
    const SpecVerdict v = verify_sampled_drafts(at::stack({p, p_next}), q.unsqueeze(0), {draft}, generator);
    const int64_t first = v.accepted == 1 ? draft : v.next_token;
    ++counts[static_cast<size_t>(first)];
    accepted += static_cast<int>(v.accepted);
  }
  for (int64_t x = 0; x < 5; ++x) {
    const double freq = counts[static_cast<size_t>(x)] / static_cast<double>(kTrials);
    // 4 standard errors of a frequency near 0.4 over 20000 trials is ~0.014.
    EXPECT_NEAR(freq, p[x].item<double>(), 0.015) << "token " << x;
  }
  // Acceptance rate = sum min(p, q) = 0.05 + 0.10 + 0.15 + 0.10 + 0.10 = 0.5.
  EXPECT_NEAR(accepted / static_cast<double>(kTrials), 0.5, 0.015);
}

TEST(SpeculativeDecoding, SeededSamplingIsReproducible) {
  auto target = testing::tiny_llama();
  auto drafter = small_drafter(true);
  const auto prompts = prompts_of({5, 8}, 22);
  const RequestOptions options{.max_new_tokens = 14, .sampling = SamplingParams{.temperature = 0.9, .top_k = 30, .seed = 4}};
  std::vector<std::vector<int64_t>> runs[2];
  for (auto& run : runs) {
    InferenceEngine engine(target, nullptr, spec_config());
    engine.enable_spec_dec(drafter, 3);
    run = engine.generate(prompts, options);
    EXPECT_GT(engine.stats().draft_tokens, 0);
  }
  EXPECT_EQ(runs[0], runs[1]);
  for (const auto& out : runs[0]) {
    EXPECT_EQ(out.size(), 14u);
    for (int64_t t : out) EXPECT_TRUE(t >= 0 && t < 96);
  }
}

TEST(SpeculativeDecoding, RefusesAMismatchedDrafter) {
  auto target = testing::tiny_llama();
  InferenceEngine engine(target, nullptr, spec_config());
  try {
    engine.enable_spec_dec(testing::tiny_llama(64));
    ADD_FAILURE() << "a drafter with another vocabulary must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  }
  InferenceConfig config = spec_config();
  config.use_spec_dec = true;
  InferenceEngine without(target, nullptr, config);
  without.add_request(std::vector<int64_t>{1, 2});
  EXPECT_THROW(without.step(), ConfigError);
}

}  // namespace
}  // namespace colossus::inference
