// LoRA from the command line, end to end: `colossus train` with [lora]
// writes checkpoints whose adapter/ PEFT loads; `colossus generate` on such a
// checkpoint merges its adapter by itself; `colossus lora merge` writes a
// plain Hugging Face directory that transformers loads with the logits of
// PEFT's adapted model, and that generates the same greedy tokens; a
// directory without an adapter is refused by name.
#include "tests/testing/command.h"
#ifdef COLOSSUS_TEST_SERVE
#include "tests/inference/serving/server_process.h"
#endif

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;
namespace ct = colossus::testing;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ct::CommandResult colossus(const std::string& args) {
  return ct::run_command(fmt::format("'{}' {} 2>&1", COLOSSUS_BIN, args));
}

TEST(LoraCli, TrainGenerateMergeRoundTrip) {
  const fs::path dir = ct::scratch_dir("lora_cli_test");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto made = ct::run_command(fmt::format("'{}' '{}' make '{}' 2>&1", COLOSSUS_PYTHON, COLOSSUS_LORA_CLI_ORACLE,
                                                (dir / "base").string()));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const fs::path config = dir / "lora.toml";
  std::ofstream(config) << fmt::format(R"([model]
pretrained = "{}"
[data]
source = "{}"
seq_len = 64
batch_size = 2
shuffle = false
[optimizer]
name = "adamw"
lr = 1e-2
[lr_scheduler]
name = "constant"
[train]
task = "sft"
steps = 3
log_every = 1
output_dir = "{}"
tensorboard = false
sample_tokens = 0
[lora]
r = 4
lora_alpha = 8
target_modules = "q_proj, v_proj, down_proj"
)",
                                       (dir / "base" / "model").string(), (dir / "base" / "data.jsonl").string(),
                                       (dir / "run").string());
  const auto trained = colossus("train '" + config.string() + "'");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("lora: r 4 on 6 layers"), std::string::npos) << trained.output;
  fs::path checkpoint;
  for (const auto& entry : fs::directory_iterator(dir / "run" / "checkpoints"))
    if (entry.path().filename().string().starts_with("step-")) checkpoint = entry.path();
  ASSERT_FALSE(checkpoint.empty());
  ASSERT_TRUE(fs::exists(checkpoint / "adapter" / "adapter_config.json"));
  ASSERT_TRUE(fs::exists(checkpoint / "adapter" / "adapter_model.safetensors"));

  const std::string prompt = "--prompt 'What is fox and dog? ' --max_new_tokens 8 --greedy";
  const auto adapted = colossus(fmt::format("generate '{}' {} --ids_out '{}'", checkpoint.string(), prompt,
                                            (dir / "adapted.jsonl").string()));
  ASSERT_EQ(adapted.exit_code, 0) << adapted.output;
  EXPECT_NE(adapted.output.find("+ LoRA"), std::string::npos) << adapted.output;

  const fs::path merged = dir / "merged";
  const auto merge = colossus(fmt::format("lora merge '{}' '{}' --dtype fp32", checkpoint.string(), merged.string()));
  ASSERT_EQ(merge.exit_code, 0) << merge.output;
  EXPECT_TRUE(fs::exists(merged / "config.json"));
  EXPECT_TRUE(fs::exists(merged / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(dir / "merged.partial"));
  const auto again = colossus(fmt::format("lora merge '{}' '{}'", checkpoint.string(), merged.string()));
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.output.find("already exists"), std::string::npos) << again.output;

  const auto plain = colossus(fmt::format("generate '{}' {} --ids_out '{}'", merged.string(), prompt,
                                          (dir / "merged.jsonl").string()));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(plain.output.find("+ LoRA"), std::string::npos) << plain.output;
  EXPECT_EQ(read_file(dir / "merged.jsonl"), read_file(dir / "adapted.jsonl"));

  // --lora on the base directory with the checkpoint's adapter: the same model.
  const auto explicit_adapter = colossus(fmt::format("generate '{}' {} --lora '{}' --ids_out '{}'",
                                                     (dir / "base" / "model").string(), prompt,
                                                     (checkpoint / "adapter").string(), (dir / "explicit.jsonl").string()));
  ASSERT_EQ(explicit_adapter.exit_code, 0) << explicit_adapter.output;
  EXPECT_EQ(read_file(dir / "explicit.jsonl"), read_file(dir / "adapted.jsonl"));

#ifdef COLOSSUS_TEST_SERVE
  // `colossus serve --lora`: the adapter merged into the served model; a
  // greedy completion continues the prompt exactly as `generate --lora` does.
  {
    colossus::inference::testing::ServerProcess server((dir / "base" / "model").string(),
                                             {"--served_model_name", "tiny-lora", "--lora", (checkpoint / "adapter").string()},
                                             dir / "serve.log");
    const fs::path request = dir / "request.json";
    std::ofstream(request) << nlohmann::json{{"model", "tiny-lora"}, {"prompt", "What is fox and dog? "},
                                             {"max_tokens", 8}, {"temperature", 0}}
                                  .dump();
    const auto reply = ct::run_command(fmt::format(
        "curl -s -S -H 'Content-Type: application/json' --data-binary '@{}' '{}/v1/completions'", request.string(),
        server.url()));
    ASSERT_EQ(reply.exit_code, 0) << reply.output << server.log();
    const auto body = nlohmann::json::parse(reply.output, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(body.is_discarded()) << reply.output;
    const std::string served = "What is fox and dog? " + body["choices"][0]["text"].get<std::string>();
    const auto generated = ct::run_command(fmt::format("'{}' generate '{}' {} --lora '{}' 2>/dev/null", COLOSSUS_BIN,
                                                       (dir / "base" / "model").string(), prompt,
                                                       (checkpoint / "adapter").string()));
    ASSERT_EQ(generated.exit_code, 0) << generated.output;
    ASSERT_GE(generated.output.size(), served.size()) << generated.output;
    EXPECT_EQ(generated.output.substr(0, served.size()), served);
    EXPECT_EQ(generated.output.find_first_not_of(" \n", served.size()), std::string::npos) << generated.output;
    EXPECT_NE(server.log().find("LoRA"), std::string::npos) << server.log();
  }
#endif

  const auto check = ct::run_command(fmt::format("'{}' '{}' check '{}' '{}' '{}' 2>&1", COLOSSUS_PYTHON,
                                                 COLOSSUS_LORA_CLI_ORACLE, (dir / "base" / "model").string(),
                                                 (checkpoint / "adapter").string(), merged.string()));
  EXPECT_EQ(check.exit_code, 0) << check.output;
  const std::string summary = check.output.substr(check.output.rfind('{') == std::string::npos ? 0 : check.output.rfind('{'));
  std::printf("PEFT vs colossus lora merge (relative max differences): %s", summary.c_str());

  const auto refused = colossus(fmt::format("lora merge '{}' '{}'", (dir / "base" / "model").string(),
                                            (dir / "nothing").string()));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.output.find("not a LoRA checkpoint"), std::string::npos) << refused.output;
}

}  // namespace
