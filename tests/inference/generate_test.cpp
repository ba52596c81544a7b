// generate() against transformers' generate() on tiny GPT-2, LLaMA, Qwen2, Qwen3, Mistral, Gemma 2 and Gemma 3 models
// saved by our save_pretrained (greedy token for token; seeded sampling with
// every processor on, draw for draw), plus eos, stop strings, streaming,
// GPT-2's context window and input errors.
#include "colossus/inference/generate.h"
#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"
#include "colossus/models/pretrained.h"
#include "tests/inference/support.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <numeric>

namespace colossus::inference {
namespace {

using testing::scratch_dir;

struct HfResult {
  std::vector<int64_t> ids;
  double margin = 0.0;
};

std::string join(const std::vector<int64_t>& ids) {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? "," : "") + std::to_string(ids[i]);
  return text;
}

struct ParityCase {
  std::string name;
  std::string model;  // "gpt2", "llama" or a family preset ("qwen2-tiny", ...)
  SamplingParams params;
};

const std::vector<ParityCase>& parity_cases() {
  static const std::vector<ParityCase> cases{
      {"gpt2_greedy", "gpt2", {.do_sample = false}},
      {"llama_greedy", "llama", {.do_sample = false}},
      {"qwen2_greedy", "qwen2-tiny", {.do_sample = false}},
      {"qwen3_greedy", "qwen3-tiny", {.do_sample = false}},
      {"mistral_greedy", "mistral-tiny", {.do_sample = false}},
      {"gemma2_greedy", "gemma2-tiny", {.do_sample = false}},
      {"gemma3_greedy", "gemma3-tiny", {.do_sample = false}},
      {"phi3_greedy", "phi3-tiny", {.do_sample = false}},
      {"phi3_longrope_crossing_greedy", "phi3-crossing", {.do_sample = false}},
      {"phi3_partial_rope_greedy", "phi3-partial", {.do_sample = false}},
      {"gpt2_greedy_penalty", "gpt2", {.do_sample = false, .repetition_penalty = 1.5}},
      {"llama_sample", "llama", {.temperature = 0.8, .top_k = 20, .top_p = 0.9, .repetition_penalty = 1.3, .seed = 1234}},
      {"gpt2_sample", "gpt2", {.temperature = 1.3, .seed = 99}}};
  return cases;
}

// "phi3-crossing": longrope over 16 original positions, so the 8-token prompt
// crosses into long_factor at the 9th new token (transformers then recomputes
// the whole sequence with it; generate() recomputes every step).
std::shared_ptr<models::CausalLM> parity_model(const std::string& name) {
  if (name == "gpt2") return testing::tiny_gpt2();
  if (name == "llama") return testing::tiny_llama();
  if (name == "phi3-partial") return testing::tiny_phi3_partial();
  if (name == "phi3-crossing") {
    return testing::tiny_family_with(
        "phi3-tiny", [](models::LlamaConfig& config) { config.rope_scaling.original_max_position_embeddings = 16; });
  }
  return testing::tiny_family(name);
}

const std::vector<int64_t> kParityPrompt{5, 17, 3, 88, 41, 41, 2, 60};
constexpr int64_t kParityNew = 20;

// transformers' generate() for every parity case, in one oracle process
// (importing transformers is most of a call's time): case name -> result.
const std::map<std::string, HfResult>& hf_parity_results() {
  static const std::map<std::string, HfResult> results = [] {
    std::map<std::string, HfResult> by_name;
    std::vector<std::vector<std::string>> jobs;
    for (const ParityCase& c : parity_cases()) {
      const std::string dir = (scratch_dir() / ("parity_" + c.name)).string();
      models::save_pretrained(*parity_model(c.model), dir);
      std::vector<std::string> job{"generate", dir, "--prompt", join(kParityPrompt), "--new", std::to_string(kParityNew),
                                   "--repetition_penalty", fmt::format("{}", c.params.repetition_penalty)};
      if (c.params.do_sample) {
        job.insert(job.end(), {"--sample", "--seed", std::to_string(c.params.seed), "--temperature",
                               fmt::format("{}", c.params.temperature), "--top_k", std::to_string(c.params.top_k),
                               "--top_p", fmt::format("{}", c.params.top_p)});
      }
      jobs.push_back(job);
    }
    const std::vector<std::string> outputs = testing::run_oracle_batch(jobs, "parity");
    for (size_t i = 0; i < parity_cases().size() && i < outputs.size(); ++i) {
      const std::string& line = outputs[i];
      if (line.rfind("{\"ids\"", 0) != 0) continue;  // the case's test reports it missing
      const auto json = nlohmann::json::parse(line);
      by_name[parity_cases()[i].name] = {json["ids"].get<std::vector<int64_t>>(), json["margin"].get<double>()};
    }
    return by_name;
  }();
  return results;
}

class HfGenerateParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(HfGenerateParity, SameTokensAsTransformers) {
  const ParityCase& c = GetParam();
  const auto& results = hf_parity_results();
  const auto found = results.find(c.name);
  ASSERT_NE(found, results.end()) << "transformers gave no result for " << c.name;
  const HfResult& hf = found->second;
  ASSERT_EQ(hf.ids.size(), kParityPrompt.size() + kParityNew);
  // A margin near float rounding would make a greedy mismatch meaningless.
  if (!c.params.do_sample) {
    EXPECT_GT(hf.margin, 1e-3) << "the model's logits are too flat for a greedy comparison";
  }
  // The same weights the oracle read: every model here is built from a fixed seed.
  const std::vector<int64_t> ours =
      generate(*parity_model(c.model), kParityPrompt, {.max_new_tokens = kParityNew, .sampling = c.params});
  EXPECT_EQ(ours, hf.ids);
}

INSTANTIATE_TEST_SUITE_P(Models, HfGenerateParity, ::testing::ValuesIn(parity_cases()),
                         [](const ::testing::TestParamInfo<ParityCase>& info) { return info.param.name; });

TEST(Generate, StopsAfterEosAndStreamsEachToken) {
  auto model = testing::tiny_gpt2();
  const std::vector<int64_t> prompt{1, 2, 3};
  const auto free_run = generate(*model, prompt, {.max_new_tokens = 10, .sampling = {.do_sample = false}});
  ASSERT_EQ(free_run.size(), 13u);
  // The third generated token as eos: generation ends right after it.
  std::vector<int64_t> streamed;
  const auto stopped = generate(
      *model, prompt,
      {.max_new_tokens = 10, .sampling = {.do_sample = false}, .eos_id = free_run[5], .on_token = [&](int64_t t) {
         streamed.push_back(t);
       }});
  const auto first_eos = std::find(free_run.begin() + 3, free_run.end(), free_run[5]);
  EXPECT_EQ(stopped, std::vector<int64_t>(free_run.begin(), first_eos + 1));
  EXPECT_EQ(streamed, std::vector<int64_t>(stopped.begin() + 3, stopped.end()));
  EXPECT_EQ(generate(*model, prompt, {.max_new_tokens = 0}), prompt);
}

TEST(Generate, StopsOnAStopString) {
  auto model = testing::tiny_gpt2(/*vocab=*/257);
  auto tokenizer = data::make_byte_tokenizer();
  const std::vector<int64_t> prompt{72, 105};  // "Hi"
  const auto free_run = generate(*model, prompt, {.max_new_tokens = 12, .sampling = {.do_sample = false}});
  std::vector<int32_t> generated(free_run.begin() + 2, free_run.end());
  const std::string text = tokenizer->decode(generated);
  const std::string stop = text.substr(4, 2);
  // Expected end: the first token whose text completes the stop string.
  size_t end = 0;
  while (tokenizer->decode({generated.begin(), generated.begin() + end}).find(stop) == std::string::npos) ++end;
  const auto stopped = generate(
      *model, prompt,
      {.max_new_tokens = 12, .sampling = {.do_sample = false}, .stop_strings = {stop}, .tokenizer = tokenizer.get()});
  EXPECT_EQ(stopped.size(), 2 + end);
  EXPECT_THROW(generate(*model, prompt, {.stop_strings = {"x"}}), ConfigError);  // no tokenizer
}

TEST(Generate, Gpt2SlidesItsWindowPastNPositions) {
  auto model = testing::tiny_gpt2(/*vocab=*/96, /*n_positions=*/8);
  const auto ids = generate(*model, {1, 2, 3}, {.max_new_tokens = 12, .sampling = {.do_sample = false}});
  ASSERT_EQ(ids.size(), 15u);
  EXPECT_EQ(max_context(*model), 8);
  // The last token follows from the last 8 tokens before it alone.
  const std::vector<int64_t> window(ids.end() - 9, ids.end() - 1);
  EXPECT_EQ(next_token_logits(*model, window).argmax().item<int64_t>(), ids.back());
  EXPECT_EQ(max_context(*testing::tiny_llama()), std::nullopt);
}

TEST(Generate, RejectsBadInputAndRestoresTrainingMode) {
  auto model = testing::tiny_llama();
  model->train();
  EXPECT_THROW(generate(*model, {}, {}), ConfigError);
  EXPECT_THROW(generate(*model, {96}, {}), ConfigError);
  EXPECT_THROW(generate(*model, {1}, {.max_new_tokens = -1}), ConfigError);
  EXPECT_THROW(generate(*model, {1}, {.sampling = {.top_p = 0.0}}), ConfigError);
  generate(*model, {1}, {.max_new_tokens = 2});
  EXPECT_TRUE(model->is_training());
  model->eval();
  generate(*model, {1}, {.max_new_tokens = 2});
  EXPECT_FALSE(model->is_training());
}

}  // namespace
}  // namespace colossus::inference
