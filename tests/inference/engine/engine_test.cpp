// The engine against step-by-step full-recompute decoding (generate()):
// greedy and seeded sampling token for token for GPT-2 and LLaMA, with
// mixed prompt lengths, more requests than batch slots, requests arriving
// between steps, chunked prefill, preemption in a tiny pool and prefix-cache
// reuse; then stop conditions, StreamingLLM's bounded memory, aborts and the
// errors bad requests get.
#include "colossus/inference/engine/engine.h"

#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"
#include "colossus/inference/generate.h"
#include "tests/inference/support.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <random>

namespace colossus::inference {
namespace {

using testing::tiny_gpt2;
using testing::tiny_llama;

std::vector<std::vector<int64_t>> random_prompts(const std::vector<int64_t>& lengths, int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t len : lengths) {
    std::vector<int64_t> p;
    for (int64_t i = 0; i < len; ++i) p.push_back(token(rng));
    prompts.push_back(p);
  }
  return prompts;
}

// What full-recompute decoding gives for one prompt (generated ids only).
std::vector<int64_t> reference(models::CausalLM& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                               const SamplingParams& sampling = {.do_sample = false}) {
  std::vector<int64_t> all = generate(model, prompt, {.max_new_tokens = max_new_tokens, .sampling = sampling});
  return {all.begin() + static_cast<std::ptrdiff_t>(prompt.size()), all.end()};
}

void expect_matches_reference(InferenceEngine& engine, const std::vector<std::vector<int64_t>>& prompts,
                              int64_t max_new_tokens, const std::string& what) {
  const auto outputs = engine.generate(prompts, {.max_new_tokens = max_new_tokens});
  ASSERT_EQ(outputs.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(outputs[i], reference(engine.model(), prompts[i], max_new_tokens))
        << what << ": prompt " << i << " (" << prompts[i].size() << " tokens)";
  }
  EXPECT_EQ(engine.stats().running, 0);
  EXPECT_EQ(engine.stats().waiting, 0);
}

InferenceConfig small_config() {
  return {.max_batch_size = 3, .max_input_len = 20, .max_output_len = 10, .block_size = 4};
}

TEST(InferenceEngine, GreedyMatchesFullRecomputeForEveryFamily) {
  const std::vector<int64_t> lengths = {1, 7, 4, 13, 2, 9, 16};  // 7 requests, 3 slots: they queue
  // generate() equals transformers' greedy for each (generate_test.cpp).
  for (auto [name, model] : {std::pair{"gpt2", tiny_gpt2()}, std::pair{"llama", tiny_llama()},
                             std::pair{"qwen2", testing::tiny_family("qwen2-tiny")},
                             std::pair{"qwen3", testing::tiny_family("qwen3-tiny")},
                             std::pair{"mistral", testing::tiny_family("mistral-tiny")},
                             std::pair{"gemma2", testing::tiny_family("gemma2-tiny")},
                             std::pair{"gemma3", testing::tiny_family("gemma3-tiny")},
                             std::pair{"phi3", testing::tiny_family("phi3-tiny")},
                             std::pair{"phi3 partial RoPE", testing::tiny_phi3_partial()}}) {
    InferenceEngine engine(model, nullptr, small_config());
    expect_matches_reference(engine, random_prompts(lengths, 96, 1), 10, name);
    EXPECT_GT(engine.stats().steps, 10);
  }
}

// phi3-tiny's longrope has 32 original positions: a request that could grow
// past them (where transformers switches the whole sequence to long_factor)
// is refused by name; one that stays within them runs (the test above).
TEST(InferenceEngine, LongropeRequestsPastTheOriginalLengthAreRefused) {
  InferenceEngine engine(testing::tiny_family("phi3-tiny"), nullptr,
                         {.max_batch_size = 2, .max_input_len = 30, .max_output_len = 10, .block_size = 4});
  try {
    engine.add_request(std::vector<int64_t>(25, 3), {.max_new_tokens = 8});
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("original_max_position_embeddings (32)"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(engine.add_request(std::vector<int64_t>(25, 3), {.max_new_tokens = 7}));
}

// mistral-tiny slides a window of 8 on every layer: blocks wholly before the
// window are dropped as decoding goes on, and the tokens stay the same.
TEST(InferenceEngine, SlidingWindowDropsBlocksBehindTheWindow) {
  auto model = testing::tiny_family("mistral-tiny");
  InferenceEngine engine(model, nullptr, small_config());  // blocks of 4
  const auto prompt = random_prompts({16}, 96, 5).front();
  engine.add_request(prompt, {.max_new_tokens = 10});
  std::vector<int64_t> got;
  int64_t most_blocks_decoding = 0;
  while (engine.has_unfinished()) {
    for (const auto& out : engine.step()) got.insert(got.end(), out.new_tokens.begin(), out.new_tokens.end());
    if (engine.stats().steps > 1) most_blocks_decoding = std::max(most_blocks_decoding, engine.stats().blocks_used);
  }
  EXPECT_EQ(got, reference(*model, prompt, 10));
  // At most 8 + 3 cached tokens before a step and one more written: 3 blocks, not the 7 of 26 tokens.
  EXPECT_LE(most_blocks_decoding, 3);
  EXPECT_GT(most_blocks_decoding, 0);
}

// Under a window on every layer a request needs blocks for the window and a
// step's tokens, not for its whole length: a pool of 10 blocks of 4 serves 50
// tokens of mistral-tiny (window 8), and refuses them for LLaMA.
TEST(InferenceEngine, SlidingWindowAdmitsRequestsLongerThanThePool) {
  const InferenceConfig config{.max_batch_size = 1, .max_input_len = 20, .max_output_len = 30,
                               .max_num_batched_tokens = 8, .block_size = 4, .num_blocks = 10};
  const auto prompt = random_prompts({20}, 96, 7).front();
  auto mistral = testing::tiny_family("mistral-tiny");
  InferenceEngine windowed(mistral, nullptr, config);
  const auto outputs = windowed.generate({prompt}, {.max_new_tokens = 30});
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0], reference(*mistral, prompt, 30));
  InferenceEngine full(tiny_llama(), nullptr, config);
  EXPECT_THROW(full.add_request(prompt, {.max_new_tokens = 30}), ConfigError);
}

TEST(InferenceEngine, RequestsArrivingBetweenStepsJoinTheRunningBatch) {
  auto model = tiny_llama();
  InferenceEngine engine(model, nullptr, small_config());
  const auto prompts = random_prompts({5, 11, 3, 8, 14}, 96, 2);
  std::map<int64_t, size_t> index;
  std::vector<std::vector<int64_t>> got(prompts.size());
  size_t added = 0, finished = 0;
  int64_t max_running = 0;
  while (finished < prompts.size()) {
    // One new request every other step, while others are mid-decode.
    if (added < prompts.size() && engine.stats().steps % 2 == 0) {
      index[engine.add_request(prompts[added], {.max_new_tokens = 8})] = added;
      ++added;
    }
    for (const auto& out : engine.step()) {
      auto& tokens = got[index.at(out.request_id)];
      tokens.insert(tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
      if (out.finished) {
        EXPECT_EQ(out.finish_reason, FinishReason::Length);
        ++finished;
      }
    }
    max_running = std::max(max_running, engine.stats().running);
  }
  EXPECT_GE(max_running, 2) << "later requests should have joined running ones";
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], reference(*model, prompts[i], 8)) << "prompt " << i;
  EXPECT_EQ(engine.stats().blocks_used, 0) << "finished requests free their blocks (prefix cache aside)";
}

TEST(InferenceEngine, ChunkedPrefillUnderASmallTokenBudgetGivesTheSameTokens) {
  for (auto [name, model] : {std::pair{"gpt2", tiny_gpt2()}, std::pair{"llama", tiny_llama()}}) {
    InferenceConfig config = small_config();
    config.max_num_batched_tokens = 5;  // prompts up to 19 tokens arrive in chunks of <= 5
    config.prefill_ratio = 0.4;
    InferenceEngine engine(model, nullptr, config);
    expect_matches_reference(engine, random_prompts({19, 3, 12, 6}, 96, 3), 9, name);
  }
}

TEST(InferenceEngine, PreemptionInATinyPoolRecomputesAndGivesTheSameTokens) {
  auto model = tiny_llama();
  InferenceConfig config = small_config();
  config.num_blocks = 9;  // three requests of up to 7 blocks each cannot all stay
  config.max_output_len = 12;
  InferenceEngine engine(model, nullptr, config);
  expect_matches_reference(engine, random_prompts({14, 12, 10, 9}, 96, 4), 12, "tiny pool");
  EXPECT_GT(engine.stats().preemptions, 0) << "the pool was meant to run out";
}

TEST(InferenceEngine, PrefixCacheReusesSharedPromptBlocks) {
  auto model = tiny_gpt2();
  InferenceEngine engine(model, nullptr, small_config());
  auto prompts = random_prompts({9, 5, 3}, 96, 5);
  const std::vector<int64_t> system = random_prompts({8}, 96, 6)[0];
  for (auto& p : prompts) p.insert(p.begin(), system.begin(), system.end());
  // The first request fills the cache; the others reuse its 2 system-prompt blocks.
  expect_matches_reference(engine, {prompts[0]}, 6, "first");
  expect_matches_reference(engine, {prompts[1], prompts[2], prompts[0]}, 6, "cached");
  const EngineStats stats = engine.stats();
  EXPECT_GE(stats.prefix_cache_hits, 6) << "three requests x two system-prompt blocks";
  EXPECT_LT(stats.prompt_tokens, static_cast<int64_t>(prompts[0].size() * 2 + prompts[1].size() + prompts[2].size()));
}

TEST(InferenceEngine, SeededSamplingIsReproduciblePerRequestAndMatchesGenerate) {
  auto model = tiny_llama();
  InferenceEngine engine(model, nullptr, small_config());
  const auto prompts = random_prompts({6, 2, 10}, 96, 7);
  std::vector<SamplingParams> params = {{.temperature = 0.8, .top_k = 20, .seed = 1},
                                        {.temperature = 1.2, .top_p = 0.9, .repetition_penalty = 1.3, .seed = 2},
                                        {.top_k = 5, .top_p = 0.8, .seed = 3}};
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) index[engine.add_request(prompts[i], {.max_new_tokens = 10, .sampling = params[i]})] = i;
  std::vector<std::vector<int64_t>> got(prompts.size());
  while (engine.has_unfinished()) {
    for (const auto& out : engine.step()) {
      auto& tokens = got[index.at(out.request_id)];
      tokens.insert(tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], reference(*model, prompts[i], 10, params[i])) << "request " << i;
}

TEST(InferenceEngine, NoRepeatNgramNeverRepeatsAnNgram) {
  auto model = tiny_gpt2();
  InferenceEngine engine(model, nullptr, {.max_input_len = 8, .max_output_len = 20, .block_size = 4});
  const auto prompt = random_prompts({4}, 96, 8)[0];
  auto out = engine.generate({prompt}, {.max_new_tokens = 20, .no_repeat_ngram_size = 2})[0];
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  std::set<std::pair<int64_t, int64_t>> bigrams;
  for (size_t i = 0; i + 1 < all.size(); ++i) EXPECT_TRUE(bigrams.insert({all[i], all[i + 1]}).second) << "at " << i;
}

TEST(InferenceEngine, EosAndForcedEosEndRequests) {
  auto model = tiny_gpt2();
  const auto prompt = random_prompts({5}, 96, 9)[0];
  const auto free_run = reference(*model, prompt, 10);
  {
    InferenceConfig config = small_config();
    config.eos_token_id = free_run[3];  // the 4th greedy token ends it
    InferenceEngine engine(model, nullptr, config);
    auto out = engine.generate({prompt})[0];
    const auto first = std::find(free_run.begin(), free_run.end(), free_run[3]);
    EXPECT_EQ(out, std::vector<int64_t>(free_run.begin(), first + 1));
  }
  {
    InferenceConfig config = small_config();
    config.forced_eos_token_id = 95;
    InferenceEngine engine(model, nullptr, config);
    auto out = engine.generate({prompt}, {.max_new_tokens = 6})[0];
    ASSERT_EQ(out.size(), 6u);
    EXPECT_EQ(out.back(), 95);
    EXPECT_EQ(std::vector<int64_t>(out.begin(), out.end() - 1), std::vector<int64_t>(free_run.begin(), free_run.begin() + 5));
  }
}

TEST(InferenceEngine, StopStringsCutTheTextAndEndTheRequest) {
  std::shared_ptr<const data::Tokenizer> tokenizer = data::make_byte_tokenizer();
  auto model = tiny_llama(tokenizer->vocab_size());
  InferenceConfig config{.max_input_len = 32, .max_output_len = 24, .block_size = 4, .ignore_eos = true};
  InferenceEngine engine(model, tokenizer, config);
  const std::string full = engine.generate(std::vector<std::string>{"abc"}, {.max_new_tokens = 24})[0];
  ASSERT_GE(full.size(), 6u) << "the free run should produce text";
  const std::string stop = full.substr(3, 2);
  const std::string cut = engine.generate(std::vector<std::string>{"abc"}, {.max_new_tokens = 24, .stop = {stop}})[0];
  EXPECT_EQ(cut, full.substr(0, full.find(stop))) << "the text before the first occurrence of the stop string";
}

TEST(InferenceEngine, StreamingLlmGeneratesPastTheWindowWithBoundedBlocks) {
  auto model = tiny_llama();
  InferenceConfig config{.max_input_len = 8, .max_output_len = 200, .block_size = 4, .enable_streamingllm = true,
                         .start_token_size = 4, .generated_token_size = 16};
  InferenceEngine engine(model, nullptr, config);
  const auto prompt = random_prompts({6}, 96, 10)[0];
  const int64_t id = engine.add_request(prompt);
  int64_t generated = 0, peak = 0;
  while (engine.has_unfinished()) {
    for (const auto& out : engine.step()) if (out.request_id == id) generated += static_cast<int64_t>(out.new_tokens.size());
    peak = std::max(peak, engine.stats().blocks_used);
  }
  EXPECT_EQ(generated, 200);
  EXPECT_LE(peak, (4 + 16) / 4 + 2) << "sinks + window + the block being filled";
  // Until the window first fills, nothing is dropped: the start equals plain greedy.
  const auto head = reference(*model, prompt, 12);
  InferenceEngine again(model, nullptr, config);
  auto out = again.generate({prompt}, {.max_new_tokens = 12})[0];
  EXPECT_EQ(out, head);
}

TEST(InferenceEngine, AbortFreesTheBlocksAndReportsTheRequest) {
  auto model = tiny_gpt2();
  InferenceConfig config = small_config();
  config.enable_prefix_caching = false;
  InferenceEngine engine(model, nullptr, config);
  const int64_t keep = engine.add_request(random_prompts({6}, 96, 11)[0], {.max_new_tokens = 5});
  const int64_t gone = engine.add_request(random_prompts({15}, 96, 12)[0], {.max_new_tokens = 10});
  engine.step();
  EXPECT_GT(engine.stats().blocks_used, 2);
  engine.abort_request(gone);
  const auto outputs = engine.step();
  bool reported = false;
  for (const auto& out : outputs) {
    if (out.request_id == gone) {
      reported = true;
      EXPECT_EQ(out.finish_reason, FinishReason::Abort);
    }
  }
  EXPECT_TRUE(reported);
  EXPECT_EQ(engine.stats().running, 1);
  EXPECT_LE(engine.stats().blocks_used, 3);  // only `keep`'s blocks
  while (engine.has_unfinished()) engine.step();
  EXPECT_EQ(engine.stats().blocks_used, 0);
  engine.abort_request(keep);  // already finished: ignored
}

void expect_config_error(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    for (const auto& fragment : fragments) EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(InferenceEngine, BadRequestsAndConfigsGetErrorsNamingTheValue) {
  auto model = tiny_gpt2(96, /*n_positions=*/24);
  InferenceEngine engine(model, nullptr, small_config());
  expect_config_error([&] { engine.add_request(std::vector<int64_t>{}); }, {"empty"});
  expect_config_error([&] { engine.add_request(std::vector<int64_t>(21, 1)); }, {"21", "max_input_len"});
  expect_config_error([&] { engine.add_request(std::vector<int64_t>{3, 96}); }, {"96", "[0, 96)"});
  expect_config_error([&] { engine.add_request(std::vector<int64_t>{3}, {.max_new_tokens = 0}); }, {"max_new_tokens", "[1, 10]"});
  expect_config_error([&] { engine.add_request(std::string("hi")); }, {"tokenizer"});
  expect_config_error([&] { engine.add_request(std::vector<int64_t>(20, 1), {.max_new_tokens = 10}); },
                      {"n_positions 24"});
  InferenceConfig tiny = small_config();
  tiny.num_blocks = 2;
  InferenceEngine cramped(model, nullptr, tiny);
  expect_config_error([&] { cramped.add_request(std::vector<int64_t>(9, 1), {.max_new_tokens = 4}); }, {"pool has 2"});
  InferenceConfig bad = small_config();
  bad.block_size = 0;
  expect_config_error([&] { InferenceEngine(model, nullptr, bad); }, {"block_size"});
  InferenceConfig graphs = small_config();
  graphs.use_cuda_graph = true;
  expect_config_error([&] { InferenceEngine(model, nullptr, graphs); }, {"use_cuda_graph", "cpu"});
  EXPECT_EQ(engine.stats().waiting, 0) << "refused requests are not queued";
}

// A tokenizer of one character per id whose decode fails on one id: one
// request's text failing must end that request alone.
class FailingTokenizer : public data::Tokenizer {
 public:
  FailingTokenizer(int32_t vocab, int32_t failing_id) : vocab_(vocab), failing_id_(failing_id) {}
  int32_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::optional<int32_t> eos_id() const override { return std::nullopt; }
  std::optional<int32_t> pad_id() const override { return std::nullopt; }
  std::optional<int32_t> token_to_id(std::string_view) const override { return std::nullopt; }
  std::optional<std::string> id_to_token(int32_t id) const override { return std::string(1, static_cast<char>('a' + id % 26)); }

 protected:
  std::vector<int32_t> do_encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(static_cast<unsigned char>(c) % vocab_);
    return ids;
  }
  std::string do_decode(const std::vector<int32_t>& ids, bool) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id == failing_id_) throw ConfigError(fmt::format("cannot decode id {}", id));
      text += static_cast<char>('a' + id % 26);
    }
    return text;
  }

 private:
  int32_t vocab_;
  int32_t failing_id_;
};

TEST(InferenceEngine, ARequestWhoseTextFailsEndsAloneWithItsError) {
  auto model = tiny_gpt2(/*vocab=*/64, /*n_positions=*/64);
  // Two prompts whose greedy continuations differ in a token the first draws
  // after at least one good one: the tokenizer fails on exactly that token.
  std::vector<std::vector<int64_t>> prompts;
  std::vector<int64_t> first, second;
  int32_t failing = -1;
  for (unsigned seed = 0; seed < 200 && failing < 0; ++seed) {
    prompts = random_prompts({5, 7}, 64, seed);
    first = reference(*model, prompts[0], 6);
    second = reference(*model, prompts[1], 6);
    for (size_t k = 1; k < first.size() && failing < 0; ++k) {
      const bool elsewhere = std::find(second.begin(), second.end(), first[k]) != second.end() ||
                             std::find(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(k), first[k]) !=
                                 first.begin() + static_cast<std::ptrdiff_t>(k);
      if (!elsewhere) failing = static_cast<int32_t>(first[k]);
    }
  }
  ASSERT_GE(failing, 0) << "no pair of prompts with a token only the first one draws";
  InferenceEngine engine(model, std::make_shared<FailingTokenizer>(64, failing), small_config());
  const int64_t a = engine.add_request(prompts[0], {.max_new_tokens = 6});
  const int64_t b = engine.add_request(prompts[1], {.max_new_tokens = 6});
  std::map<int64_t, std::vector<int64_t>> tokens;
  std::map<int64_t, RequestOutput> last;
  for (int guard = 0; engine.has_unfinished() && guard < 100; ++guard) {
    for (RequestOutput& out : engine.step()) {
      for (int64_t t : out.new_tokens) tokens[out.request_id].push_back(t);
      if (out.finished) last[out.request_id] = out;
    }
  }
  ASSERT_TRUE(last.contains(a) && last.contains(b));
  ASSERT_TRUE(last[a].error.has_value());
  EXPECT_NE(last[a].error->find("cannot decode id"), std::string::npos) << *last[a].error;
  EXPECT_EQ(last[a].finish_reason, FinishReason::Abort);
  EXPECT_FALSE(last[b].error.has_value());
  EXPECT_EQ(tokens[b], second) << "the other request went on as if alone";
  EXPECT_EQ(engine.stats().running, 0);
  EXPECT_EQ(engine.stats().blocks_used, 0) << "the failed request's blocks were not freed";
}

}  // namespace
}  // namespace colossus::inference
