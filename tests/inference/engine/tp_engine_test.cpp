// Tensor-parallel inference on 2 MPI ranks: each rank shards the same full
// model, drives its engine with the same requests, and every rank's greedy
// outputs equal single-process full-recompute decoding of the unsharded
// model (GPT-2 with a tied head; LLaMA with GQA, kv heads = tp). Speculative
// decoding with a replicated drafter works unchanged on top.
#include "colossus/inference/engine/engine.h"

#include "colossus/core/errors.h"
#include "colossus/inference/generate.h"
#include "tests/inference/support.h"
#include "tests/testing/testing.h"

#include <gtest/gtest.h>

#include <random>

namespace colossus::inference {
namespace {

namespace ct = colossus::testing;

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

void expect_tp_matches_reference(bool llama, bool speculative) {
  auto world = ct::world();
  const auto prompts = prompts_of({4, 11, 1, 7, 15}, 31);
  auto reference_model = llama ? testing::tiny_llama() : testing::tiny_gpt2();
  auto sharded_model = llama ? testing::tiny_llama() : testing::tiny_gpt2();
  InferenceEngine engine(sharded_model, nullptr,
                         {.max_batch_size = 3, .max_input_len = 16, .max_output_len = 12, .block_size = 4,
                          .tp_size = world->size()},
                         world);
  const auto numel = [](models::CausalLM& m) {
    int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.numel();
    return n;
  };
  EXPECT_LT(numel(*sharded_model), numel(*reference_model)) << "the engine should have sharded the model";
  if (speculative) engine.enable_spec_dec(llama ? testing::tiny_llama() : testing::tiny_gpt2(), 3);
  const auto outputs = engine.generate(prompts, {.max_new_tokens = 12});
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> plain =
        generate(*reference_model, prompts[i], {.max_new_tokens = 12, .sampling = {.do_sample = false}});
    plain.erase(plain.begin(), plain.begin() + static_cast<std::ptrdiff_t>(prompts[i].size()));
    EXPECT_EQ(outputs[i], plain) << (llama ? "llama" : "gpt2") << " rank " << world->rank() << ", prompt " << i;
  }
}

TEST(TensorParallelEngine, Gpt2GreedyMatchesOneProcess) { expect_tp_matches_reference(false, false); }
TEST(TensorParallelEngine, LlamaGreedyMatchesOneProcess) { expect_tp_matches_reference(true, false); }
TEST(TensorParallelEngine, SpeculativeOnTopOfTpMatchesToo) { expect_tp_matches_reference(true, true); }

TEST(TensorParallelEngine, RefusesAGroupOfTheWrongSize) {
  auto world = ct::world();
  try {
    InferenceEngine engine(testing::tiny_llama(), nullptr, {.tp_size = world->size() + 1}, world);
    ADD_FAILURE() << "tp_size larger than the group must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tp_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace colossus::inference

int main(int argc, char** argv) { return colossus::testing::run_all_tests(argc, argv); }
