// Beam search in the engine against transformers' generate(num_beams=...)
// on the same saved weights: several requests at once (their beams share
// the batch and fork KV blocks), with and without eos, length penalty and
// early stopping; then a pool so small that beam searches are preempted and
// restarted, which must not change their result.
#include "colossus/inference/engine/engine.h"

#include "colossus/models/pretrained.h"
#include "tests/inference/support.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <optional>

namespace colossus::inference {
namespace {

struct BeamCase {
  std::string name;
  bool llama;
  int64_t width;
  std::optional<int64_t> eos;
  double length_penalty;
  bool early_stopping;
};

const std::vector<std::vector<int64_t>> kPrompts = {{5, 17, 3, 88, 41}, {7}, {60, 2, 2, 9, 31, 77, 12, 40, 8, 1, 19}};
constexpr int64_t kNew = 12;
constexpr int64_t kEmitted = -1;

// The oracle's arguments for one case (its model saved under `dir`).
std::vector<std::string> beam_job(const std::string& dir, const BeamCase& c) {
  std::vector<std::string> prompts;
  for (const auto& p : kPrompts) prompts.push_back(fmt::format("{}", fmt::join(p, ",")));
  std::vector<std::string> job{"beam", dir, "--prompts", fmt::format("{}", fmt::join(prompts, ";")), "--new",
                               std::to_string(kNew), "--num_beams", std::to_string(c.width), "--length_penalty",
                               fmt::format("{}", c.length_penalty)};
  if (c.eos) job.insert(job.end(), {"--eos", std::to_string(*c.eos)});
  if (c.early_stopping) job.push_back("--early_stopping");
  return job;
}

InferenceConfig beam_config(const BeamCase& c) {
  return {.max_batch_size = 12, .max_input_len = 16, .max_output_len = kNew, .block_size = 4,
          .eos_token_id = c.eos, .beam_width = c.width, .length_penalty = c.length_penalty,
          .early_stopping = c.early_stopping};
}

const std::vector<BeamCase>& beam_cases() {
  // kEmitted: eos is the 4th token of the first prompt's best beam without
  // eos, so some beams end early and the finished hypotheses are exercised.
  static const std::vector<BeamCase> cases{{"gpt2_w4", false, 4, std::nullopt, 1.0, false},
                                           {"gpt2_w3_eos", false, 3, kEmitted, 1.0, false},
                                           {"llama_w4_eos_lp", true, 4, kEmitted, 0.6, true},
                                           {"llama_w2", true, 2, std::nullopt, 1.0, false}};
  return cases;
}

std::shared_ptr<models::CausalLM> beam_model(const BeamCase& c) {
  return c.llama ? testing::tiny_llama() : testing::tiny_gpt2();
}

// The case with kEmitted replaced by the token our engine emits there.
BeamCase resolved(BeamCase c) {
  if (c.eos == kEmitted) {
    BeamCase free_run = c;
    free_run.eos.reset();
    InferenceEngine engine(beam_model(c), nullptr, beam_config(free_run));
    c.eos = engine.generate({kPrompts[0]}, {.max_new_tokens = kNew})[0].at(3);
  }
  return c;
}

// transformers' beams for every case in one oracle process (importing
// transformers is most of a call's time): case name -> per-prompt outputs.
const std::map<std::string, std::vector<std::vector<int64_t>>>& hf_beams() {
  static const std::map<std::string, std::vector<std::vector<int64_t>>> results = [] {
    std::map<std::string, std::vector<std::vector<int64_t>>> by_name;
    std::vector<std::vector<std::string>> jobs;
    for (const BeamCase& c : beam_cases()) {
      const std::string dir = (testing::scratch_dir() / ("beam_" + c.name)).string();
      models::save_pretrained(*beam_model(c), dir);
      jobs.push_back(beam_job(dir, resolved(c)));
    }
    const std::vector<std::string> outputs = testing::run_oracle_batch(jobs, "beam");
    for (size_t i = 0; i < beam_cases().size() && i < outputs.size(); ++i) {
      const std::string& line = outputs[i];
      if (line.rfind("{\"outputs\"", 0) != 0) continue;  // the case's test reports it missing
      by_name[beam_cases()[i].name] =
          nlohmann::json::parse(line)["outputs"].get<std::vector<std::vector<int64_t>>>();
    }
    return by_name;
  }();
  return results;
}

class BeamSearchParity : public ::testing::TestWithParam<BeamCase> {};

TEST_P(BeamSearchParity, SameBestBeamAsTransformers) {
  const BeamCase c = resolved(GetParam());
  const auto found = hf_beams().find(c.name);
  ASSERT_NE(found, hf_beams().end()) << "transformers gave no beams for " << c.name;
  const auto& expected = found->second;
  ASSERT_EQ(expected.size(), kPrompts.size());
  InferenceEngine engine(beam_model(c), nullptr, beam_config(c));
  const auto ours = engine.generate(kPrompts, {.max_new_tokens = kNew});
  bool ended_early = false;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(ours[i], expected[i]) << c.name << ", prompt " << i;
    ended_early = ended_early || static_cast<int64_t>(expected[i].size()) < kNew;
  }
  if (c.eos) {
    EXPECT_TRUE(ended_early) << "eos " << *c.eos << " should end some best beam early";
  }
  EXPECT_EQ(engine.stats().running, 0);
}

INSTANTIATE_TEST_SUITE_P(Engine, BeamSearchParity, ::testing::ValuesIn(beam_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(BeamSearch, PreemptedSearchesRestartAndGiveTheSameBeams) {
  const BeamCase c{"tiny_pool", true, 3, std::nullopt, 1.0, false};
  auto model = testing::tiny_llama();
  std::vector<std::vector<int64_t>> prompts = kPrompts;
  prompts.insert(prompts.end(), kPrompts.rbegin(), kPrompts.rend());
  InferenceEngine roomy(model, nullptr, beam_config(c));
  const auto expected = roomy.generate(prompts, {.max_new_tokens = kNew});
  InferenceConfig config = beam_config(c);
  config.num_blocks = 24;  // three requests' beams peak at 19 blocks: six cannot all run
  config.enable_prefix_caching = false;
  InferenceEngine cramped(model, nullptr, config);
  EXPECT_EQ(cramped.generate(prompts, {.max_new_tokens = kNew}), expected);
  EXPECT_GT(cramped.stats().preemptions, 0);
  EXPECT_EQ(cramped.stats().blocks_used, 0);
}

}  // namespace
}  // namespace colossus::inference
