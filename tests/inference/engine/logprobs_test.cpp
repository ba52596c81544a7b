// Logprobs from the engine against transformers' log-softmax on the same
// model (hf_generate.py logprobs): each drawn token's and its top
// alternatives (raw logits, also when sampling with a temperature), and a
// prompt's own tokens' (echo) across chunked prefill, with the prefix cache
// holding the prompt's blocks from an earlier request.
#include "colossus/core/errors.h"
#include "colossus/inference/engine/engine.h"
#include "colossus/models/pretrained.h"
#include "tests/inference/support.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>

namespace colossus::inference {
namespace {

struct Collected {
  std::vector<int64_t> tokens;
  std::vector<TokenLogprob> logprobs, prompt_logprobs;
};

struct Oracle {
  std::vector<double> logprobs;                                 // position i >= 1, at index i - 1
  std::vector<std::vector<std::pair<int64_t, double>>> top;
};

// transformers' logprobs for each id sequence, in one oracle process.
std::vector<Oracle> hf_logprobs(const std::string& dir, const std::vector<std::vector<int64_t>>& sequences,
                                int64_t top) {
  std::vector<std::vector<std::string>> jobs;
  for (const auto& ids : sequences) {
    jobs.push_back(std::vector<std::string>{"logprobs", dir, "--ids", fmt::format("{}", fmt::join(ids, ",")), "--top",
                                            std::to_string(top)});
  }
  std::vector<Oracle> oracles;
  for (const std::string& line : testing::run_oracle_batch(jobs, "logprobs")) {
    const auto j = nlohmann::json::parse(line);
    oracles.push_back({j["logprobs"].get<std::vector<double>>(),
                       j["top"].get<std::vector<std::vector<std::pair<int64_t, double>>>>()});
  }
  return oracles;
}

// `ours` are the logprobs of positions first, first + 1, ... of `ids`.
void expect_logprobs(const std::vector<TokenLogprob>& ours, const Oracle& oracle, const std::vector<int64_t>& ids,
                     size_t first, size_t top, const std::string& what) {
  for (size_t i = 0; i < ours.size(); ++i) {
    const size_t position = first + i;
    ASSERT_LT(position - 1, oracle.logprobs.size()) << what;
    EXPECT_EQ(ours[i].token, ids[position]) << what << " position " << position;
    EXPECT_NEAR(ours[i].logprob, oracle.logprobs[position - 1], 1e-4) << what << " position " << position;
    ASSERT_EQ(ours[i].top.size(), top) << what << " position " << position;
    for (size_t k = 0; k < top; ++k) {
      EXPECT_EQ(ours[i].top[k].first, oracle.top[position - 1][k].first) << what << " position " << position;
      EXPECT_NEAR(ours[i].top[k].second, oracle.top[position - 1][k].second, 1e-4) << what << " position " << position;
    }
  }
}

TEST(EngineLogprobs, DrawnAndPromptLogprobsMatchTransformers) {
  auto model = testing::tiny_llama();
  const std::string dir = (testing::scratch_dir() / "logprobs").string();
  models::save_pretrained(*model, dir);
  InferenceConfig config;
  config.max_batch_size = 3;
  config.max_input_len = 20;
  config.max_output_len = 6;
  config.block_size = 4;
  config.max_num_batched_tokens = 5;  // prompts arrive in chunks of <= 5
  config.prefill_ratio = 0.4;
  InferenceEngine engine(model, nullptr, config);

  const std::vector<int64_t> shared = {5, 17, 3, 88, 41, 9, 60, 2};
  std::vector<int64_t> first = shared, second = shared;
  first.insert(first.end(), {31, 77, 12, 40, 8});
  second.insert(second.end(), {19, 4, 66, 70});
  const std::vector<int64_t> third = {7, 23, 50};
  std::map<int64_t, Collected> got;
  auto run = [&] {
    while (engine.has_unfinished()) {
      for (const RequestOutput& out : engine.step()) {
        Collected& c = got[out.request_id];
        c.tokens.insert(c.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
        c.logprobs.insert(c.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
        c.prompt_logprobs.insert(c.prompt_logprobs.end(), out.prompt_logprobs.begin(), out.prompt_logprobs.end());
      }
    }
  };
  // The first request fills the prefix cache with the shared blocks; the
  // second asks for its prompt's logprobs, so it must compute them anyway.
  const int64_t a = engine.add_request(first, {.max_new_tokens = 6, .logprobs = 3, .prompt_logprobs = 2});
  run();
  const int64_t b = engine.add_request(second, {.max_new_tokens = 4, .logprobs = 1, .prompt_logprobs = 0});
  const int64_t c = engine.add_request(
      third, {.max_new_tokens = 5,
              .sampling = SamplingParams{.do_sample = true, .temperature = 0.7, .seed = 3},
              .logprobs = 2});
  run();

  const std::vector<std::tuple<int64_t, std::vector<int64_t>, size_t, size_t, std::string>> cases = {
      {a, first, 3, 2, "greedy, 3 alternatives, prompt logprobs with 2"},
      {b, second, 1, 0, "after the cached prefix, prompt logprobs with none"},
      {c, third, 2, 0, "sampled at temperature 0.7 (raw logprobs)"}};
  std::vector<std::vector<int64_t>> sequences;
  for (const auto& [id, prompt, top, prompt_top, what] : cases) {
    std::vector<int64_t> ids = prompt;
    ids.insert(ids.end(), got.at(id).tokens.begin(), got.at(id).tokens.end());
    sequences.push_back(ids);
  }
  const std::vector<Oracle> oracles = hf_logprobs(dir, sequences, 3);
  ASSERT_EQ(oracles.size(), cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& [id, prompt, top, prompt_top, what] = cases[k];
    const Collected& r = got.at(id);
    const std::vector<int64_t>& ids = sequences[k];
    const Oracle& oracle = oracles[k];
    ASSERT_EQ(r.logprobs.size(), r.tokens.size()) << what;
    expect_logprobs(r.logprobs, oracle, ids, prompt.size(), top, what + ": drawn");
    if (id == c) {
      EXPECT_TRUE(r.prompt_logprobs.empty()) << "not asked for";
      continue;
    }
    ASSERT_EQ(r.prompt_logprobs.size(), prompt.size() - 1) << what;
    expect_logprobs(r.prompt_logprobs, oracle, ids, 1, prompt_top, what + ": prompt");
  }
  EXPECT_EQ(engine.stats().prefix_cache_hits, 0) << "a prompt-logprobs request reuses no blocks";
}

TEST(EngineLogprobs, OutOfRangeCountsAreRefusedByName) {
  InferenceEngine engine(testing::tiny_llama(), nullptr, {.max_batch_size = 2, .max_input_len = 8, .max_output_len = 4});
  for (const auto& [options, name] : {std::pair{RequestOptions{.logprobs = 21}, "logprobs = 21"},
                                      std::pair{RequestOptions{.prompt_logprobs = -1}, "prompt_logprobs = -1"}}) {
    try {
      engine.add_request(std::vector<int64_t>{1, 2, 3}, options);
      ADD_FAILURE() << "expected a ConfigError for " << name;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[0, 20]"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace colossus::inference
