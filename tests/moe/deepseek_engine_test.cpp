// The inference engine on DeepSeek-V2 and V3 (MLA's compressed paged cache,
// kv_b_proj absorbed): greedy tokens equal transformers' generate() with its
// own MLA cache, on the HF-made tiny checkpoints of deepseek_oracle.py.
#include "colossus/inference/engine/engine.h"
#include "colossus/models/deepseek.h"
#include "colossus/models/pretrained.h"
#include "tests/models/oracle.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <random>
#include <sstream>

namespace colossus::inference {
namespace {

struct HfGreedy {
  std::vector<int64_t> ids;  // prompt + new tokens
  double margin = 0;
};

// Greedy generate() of each prompt alone, in one oracle process.
std::vector<HfGreedy> hf_greedy(const std::string& dir, const std::vector<std::vector<int64_t>>& prompts,
                                int64_t new_tokens) {
  std::vector<std::string> joined;
  for (const auto& p : prompts) joined.push_back(fmt::format("{}", fmt::join(p, ",")));
  auto result = models::testing::run_oracle(
      fmt::format("generate '{}' --prompt '{}' --new {}", dir, fmt::join(joined, ";"), new_tokens));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // One JSON line a prompt, last; transformers may warn before them.
  std::vector<HfGreedy> out;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"ids\"", 0) != 0) continue;
    const auto json = nlohmann::json::parse(line);
    out.push_back({json["ids"].get<std::vector<int64_t>>(), json["margin"].get<double>()});
  }
  if (out.size() != prompts.size()) ADD_FAILURE() << "expected " << prompts.size() << " results:\n" << result.output;
  return out;
}

class DeepseekEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepseekEngine, GreedyMatchesTransformersGenerate) {
  const std::string dir = (models::testing::hf_reference_dir() / GetParam()).string();
  auto model = models::load_pretrained(dir);
  const auto& config = std::get<models::DeepseekConfig>(model->config());
  // Prompts of several lengths, queued through 2 slots and blocks of 4 tokens.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> token(0, config.vocab_size - 1);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t len : {5, 11, 1}) {
    std::vector<int64_t> p;
    for (int64_t i = 0; i < len; ++i) p.push_back(token(rng));
    prompts.push_back(p);
  }
  constexpr int64_t kNew = 12;
  InferenceEngine engine(model, nullptr, {.max_batch_size = 2, .max_input_len = 16, .max_output_len = kNew, .block_size = 4});
  const auto outputs = engine.generate(prompts, {.max_new_tokens = kNew});
  ASSERT_EQ(outputs.size(), prompts.size());
  const std::vector<HfGreedy> hf_all = hf_greedy(dir, prompts, kNew);
  ASSERT_EQ(hf_all.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const HfGreedy& hf = hf_all[i];
    ASSERT_EQ(hf.ids.size(), prompts[i].size() + kNew);
    const std::vector<int64_t> hf_new(hf.ids.begin() + std::ssize(prompts[i]), hf.ids.end());
    EXPECT_EQ(outputs[i], hf_new) << GetParam() << " prompt " << i << " (smallest top-2 logit gap " << hf.margin << ")";
  }
  // The cache stores kv_lora_rank + qk_rope_head_dim elements per token and layer, once.
  const KVCacheShape shape = kv_cache_shape(*model, 4);
  EXPECT_TRUE(shape.values_alias_keys);
  EXPECT_EQ(shape.kv_heads * shape.head_dim, config.kv_lora_rank + config.qk_rope_head_dim);
  std::cout << GetParam() << ": cache " << shape.bytes_per_block(4) / 4 / config.num_hidden_layers
            << " bytes/token/layer in fp32 vs " << 2 * config.num_attention_heads * config.qk_head_dim() * 4
            << " for expanded per-head K and V\n";
}

INSTANTIATE_TEST_SUITE_P(Cases, DeepseekEngine, ::testing::Values("v2_lite_yarn", "v3_noaux_yarn"));

}  // namespace
}  // namespace colossus::inference
