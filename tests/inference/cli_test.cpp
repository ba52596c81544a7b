// `colossus generate` end to end: a tiny GPT-2 checkpoint in the trainer's
// layout (run/checkpoints/latest -> step dir -> model/ with the byte
// tokenizer's files), output (and --ids_out's ids) equal to the library's, and its errors.
#include "colossus/data/corpus.h"
#include "colossus/data/tokenizer.h"
#include "colossus/inference/generate.h"
#include "colossus/models/pretrained.h"
#include "tests/inference/support.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace colossus::inference {
namespace {

namespace fs = std::filesystem;

struct CliResult {
  int exit_code;
  std::string out;
  std::string err;
};

CliResult colossus(const std::string& arguments) {
  const fs::path err_file = testing::scratch_dir() / "stderr.txt";
  const auto result =
      testing::run_command(fmt::format("'{}' generate {} 2>'{}'", COLOSSUS_BIN, arguments, err_file.string()));
  std::ifstream in(err_file);
  std::stringstream err;
  err << in.rdbuf();
  return {result.exit_code, result.output, err.str()};
}

class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    run_ = new fs::path(testing::scratch_dir() / "run");
    model_dir_ = new fs::path(*run_ / "checkpoints" / "step-00000003" / "model");
    model_ = new std::shared_ptr<models::CausalLM>(testing::tiny_gpt2(/*vocab=*/257, /*n_positions=*/64));
    models::save_pretrained(**model_, model_dir_->string());
    data::save_byte_tokenizer(model_dir_->string());
    std::ofstream(*run_ / "checkpoints" / "latest") << "step-00000003\n";
  }
  static void TearDownTestSuite() {
    delete run_;
    delete model_dir_;
    delete model_;
  }

  // What the library generates for `prompt`, as the CLI prints it.
  static std::string expected_output(const std::string& prompt, const GenerateOptions& base) {
    auto tokenizer = data::load_tokenizer(model_dir_->string());
    const auto ids32 = tokenizer->encode(prompt, /*add_special_tokens=*/true);
    const std::vector<int64_t> ids(ids32.begin(), ids32.end());
    GenerateOptions options = base;
    options.eos_id = tokenizer->eos_id();
    const auto all = generate(**model_, ids, options);
    const std::vector<int32_t> generated(all.begin() + static_cast<int64_t>(ids.size()), all.end());
    return prompt + tokenizer->decode(generated, /*skip_special_tokens=*/true) + "\n";
  }

  static fs::path* run_;
  static fs::path* model_dir_;
  static std::shared_ptr<models::CausalLM>* model_;
};

fs::path* GenerateCli::run_ = nullptr;
fs::path* GenerateCli::model_dir_ = nullptr;
std::shared_ptr<models::CausalLM>* GenerateCli::model_ = nullptr;

// --ids_out: one JSON line per prompt with its ids and the generated ids,
// the library's greedy continuation.
TEST_F(GenerateCli, IdsOutHoldsPromptAndGeneratedIds) {
  const fs::path ids_file = testing::scratch_dir() / "ids.jsonl";
  const auto result = colossus(fmt::format("'{}' --prompt 'Hi' --prompt 'Yo' --max_new_tokens 6 --greedy --ids_out '{}'",
                                           run_->string(), ids_file.string()));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::ifstream in(ids_file);
  std::string line;
  int lines = 0;
  auto tokenizer = data::load_tokenizer(model_dir_->string());
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    const std::string prompt = row["prompt"].get<std::string>();
    const auto ids32 = tokenizer->encode(prompt, /*add_special_tokens=*/true);
    const std::vector<int64_t> prompt_ids(ids32.begin(), ids32.end());
    EXPECT_EQ(row["prompt_ids"].get<std::vector<int64_t>>(), prompt_ids);
    auto all = generate(**model_, prompt_ids,
                        {.max_new_tokens = 6, .sampling = {.do_sample = false}, .eos_id = tokenizer->eos_id()});
    EXPECT_EQ(row["ids"].get<std::vector<int64_t>>(), std::vector<int64_t>(all.begin() + std::ssize(prompt_ids), all.end()))
        << prompt;
    ++lines;
  }
  EXPECT_EQ(lines, 2);
}

TEST_F(GenerateCli, GreedyOutputFromARunDirectoryMatchesTheLibrary) {
  const auto result = colossus(fmt::format("'{}' --prompt 'Hello' --max_new_tokens 12 --greedy", run_->string()));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, expected_output("Hello", {.max_new_tokens = 12, .sampling = {.do_sample = false}}));
  EXPECT_NE(result.err.find("tok/s"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("gpt2"), std::string::npos) << result.err;
}

TEST_F(GenerateCli, SeededSamplingIsReproducibleAndMatchesTheLibrary) {
  const std::string args = fmt::format(
      "'{}' --prompt 'Once upon' --max_new_tokens 10 --seed 5 --temperature 0.9 --top_k 40 --top_p 0.95 "
      "--repetition_penalty 1.1",
      model_dir_->string());
  const auto first = colossus(args);
  const auto second = colossus(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(first.out, second.out);
  const SamplingParams sampling{.temperature = 0.9, .top_k = 40, .top_p = 0.95, .repetition_penalty = 1.1, .seed = 5};
  EXPECT_EQ(first.out, expected_output("Once upon", {.max_new_tokens = 10, .sampling = sampling}));
}

TEST_F(GenerateCli, SeveralPromptsAndTheStepDirectory) {
  const auto result =
      colossus(fmt::format("'{}' --prompt 'A' --prompt 'B' --max_new_tokens 3 --greedy --tokenizer byte",
                           model_dir_->parent_path().string()));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out.rfind("A", 0), 0u) << result.out;
  EXPECT_NE(result.out.find("\nB"), std::string::npos) << result.out;
}

TEST_F(GenerateCli, ErrorsAreOneLineWithExitCode) {
  const auto missing = colossus("/no/such/run --prompt x");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("'/no/such/run' does not exist"), std::string::npos) << missing.err;
  const auto bad_top_p = colossus(fmt::format("'{}' --top_p 0", model_dir_->string()));
  EXPECT_EQ(bad_top_p.exit_code, 1);
  EXPECT_NE(bad_top_p.err.find("top_p = 0"), std::string::npos) << bad_top_p.err;
  const auto no_tokenizer = colossus(fmt::format("'{}' --tokenizer '{}'", model_dir_->string(), run_->string()));
  EXPECT_EQ(no_tokenizer.exit_code, 1);
  EXPECT_NE(no_tokenizer.err.find("tokenizer"), std::string::npos) << no_tokenizer.err;
  const auto usage = colossus("");
  EXPECT_EQ(usage.exit_code, 2);
}

TEST_F(GenerateCli, SizesBeyondTheModelAreRefusedOrCapped) {
  // A prompt that fills the 64-position context: an error, not an empty success.
  const auto too_long = colossus(fmt::format("'{}' --prompt '{}' --greedy", model_dir_->string(), std::string(80, 'x')));
  EXPECT_EQ(too_long.exit_code, 1) << too_long.out;
  EXPECT_NE(too_long.err.find("context is 64 positions"), std::string::npos) << too_long.err;
  // A huge max_new_tokens is capped by the context instead of sizing the cache from it.
  const auto huge = colossus(fmt::format("'{}' --prompt 'Hi' --max_new_tokens 1000000000 --greedy", model_dir_->string()));
  EXPECT_EQ(huge.exit_code, 0) << huge.err;
  const auto prompt_tokens = static_cast<int64_t>(data::load_tokenizer(model_dir_->string())->encode("Hi", true).size());
  EXPECT_EQ(huge.out, expected_output("Hi", {.max_new_tokens = 64 - prompt_tokens, .sampling = {.do_sample = false}}));
  const auto block = colossus(fmt::format("'{}' --prompt 'Hi' --block_size 1000000000", model_dir_->string()));
  EXPECT_NE(block.exit_code, 0);
  EXPECT_NE(block.err.find("--block_size"), std::string::npos) << block.err;
}

TEST_F(GenerateCli, HelpExplainsThePaths) {
  const auto help = colossus("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("checkpoint step directory"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--repetition_penalty"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace colossus::inference
