#include "tests/inference/support.h"

#include "tests/testing/command.h"

#include "colossus/models/pretrained.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <cstdio>
#include <fstream>

namespace colossus::inference::testing {

namespace fs = std::filesystem;

const fs::path& scratch_dir() { return colossus::testing::scratch_dir("inference"); }

CommandResult run_oracle(const std::string& arguments) {
  return run_command(fmt::format("'{}' '{}' {} 2>&1", COLOSSUS_PYTHON, COLOSSUS_GENERATE_ORACLE, arguments));
}

std::vector<std::string> run_oracle_batch(const std::vector<std::vector<std::string>>& jobs, const std::string& name) {
  const auto jobs_file = scratch_dir() / (name + "_jobs.json");
  std::ofstream(jobs_file) << nlohmann::json(jobs).dump();
  const auto result = run_oracle(fmt::format("batch '{}'", jobs_file.string()));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // The JSON is the last line; transformers may warn before it.
  const auto start = result.output.rfind("{\"outputs\"");
  if (start == std::string::npos) {
    ADD_FAILURE() << "no JSON in the oracle's output:\n" << result.output;
    return {};
  }
  return nlohmann::json::parse(result.output.substr(start))["outputs"].get<std::vector<std::string>>();
}

std::shared_ptr<models::CausalLM> tiny_gpt2(int64_t vocab, int64_t n_positions) {
  models::GPT2Config config{.vocab_size = vocab,
                            .n_positions = n_positions,
                            .n_embd = 32,
                            .n_layer = 2,
                            .n_head = 4,
                            .resid_pdrop = 0.0,
                            .embd_pdrop = 0.0,
                            .attn_pdrop = 0.0,
                            .initializer_range = 0.2};
  return models::create_model(config, {.seed = 11});
}

std::shared_ptr<models::CausalLM> tiny_llama(int64_t vocab, int64_t max_positions) {
  models::LlamaConfig config{.vocab_size = vocab,
                             .hidden_size = 64,
                             .intermediate_size = 96,
                             .num_hidden_layers = 2,
                             .num_attention_heads = 4,
                             .num_key_value_heads = 2,
                             .max_position_embeddings = max_positions,
                             .initializer_range = 0.2,
                             .rms_norm_eps = 1e-5};
  return models::create_model(config, {.seed = 12});
}

std::shared_ptr<models::CausalLM> tiny_family(const std::string& preset, int64_t vocab) {
  return tiny_family_with(preset, [](models::LlamaConfig&) {}, vocab);
}

std::shared_ptr<models::CausalLM> tiny_family_with(const std::string& preset,
                                                   const std::function<void(models::LlamaConfig&)>& change,
                                                   int64_t vocab) {
  auto config = std::get<models::LlamaConfig>(models::preset(preset));
  change(config);
  config.vocab_size = vocab;
  config.initializer_range = 0.2;
  config.rms_norm_eps = 1e-5;
  return models::create_model(config, {.seed = 13});
}

std::shared_ptr<models::CausalLM> tiny_phi3_partial(int64_t vocab) {
  return tiny_family_with(
      "phi3-tiny",
      [](models::LlamaConfig& config) {
        config.rope_scaling.partial_rotary_factor = 0.5;
        const auto frequencies = static_cast<size_t>(config.rotary_dim() / 2);
        config.rope_scaling.short_factor.resize(frequencies);
        config.rope_scaling.long_factor.resize(frequencies);
      },
      vocab);
}

}  // namespace colossus::inference::testing
