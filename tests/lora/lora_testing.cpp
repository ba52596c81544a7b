#include "tests/lora/lora_testing.h"

#include "colossus/models/pretrained.h"
#include "tests/testing/command.h"

#include <ATen/ops/abs.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace colossus::lora::testing {

namespace fs = std::filesystem;

const fs::path& scratch_dir() { return colossus::testing::scratch_dir("lora"); }

OracleResult run_oracle(const std::string& arguments) {
  auto result = colossus::testing::run_command(
      fmt::format("'{}' '{}' {} 2>&1", COLOSSUS_PYTHON, COLOSSUS_PEFT_ORACLE, arguments));
  return {result.exit_code, std::move(result.output)};
}

const fs::path& peft_reference_dir() {
  static const fs::path dir = [] {
    fs::path out = scratch_dir() / "peft";
    OracleResult result = run_oracle(fmt::format("make '{}'", out.string()));
    if (result.exit_code != 0)
      ADD_FAILURE() << "peft_oracle.py make failed (" << result.exit_code << "):\n" << result.output;
    return out;
  }();
  return dir;
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.detach().to(at::kDouble), b64 = b.detach().to(at::kDouble);
  const double scale = b64.abs().max().item<double>();
  return (a64 - b64).abs().max().item<double>() / std::max(scale, 1e-30);
}

std::shared_ptr<models::CausalLM> tiny_llama(uint64_t seed) {
  models::LlamaConfig config{.vocab_size = 64,
                             .hidden_size = 32,
                             .intermediate_size = 48,
                             .num_hidden_layers = 2,
                             .num_attention_heads = 4,
                             .num_key_value_heads = 2,
                             .max_position_embeddings = 64,
                             .initializer_range = 0.2};
  return models::create_model(config, {.seed = seed});
}

std::shared_ptr<models::CausalLM> tiny_gpt2(uint64_t seed) {
  models::GPT2Config config{.vocab_size = 64,
                            .n_positions = 32,
                            .n_embd = 32,
                            .n_layer = 2,
                            .n_head = 4,
                            .resid_pdrop = 0.0,
                            .embd_pdrop = 0.0,
                            .attn_pdrop = 0.0};
  return models::create_model(config, {.seed = seed});
}

}  // namespace colossus::lora::testing
