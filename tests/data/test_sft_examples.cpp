// SFT examples against TRL: the ids and targets SftExampleBuilder makes from
// JSONL records equal what TRL's SFTTrainer prepares from the same records
// with the same tokenizer (sft_oracle.py; prompt/completion split where the
// tokenizations diverge, EOS appended unless present, truncation at
// max_length, examples left with no target dropped); options refused by name.
#include "colossus/core/errors.h"
#include "colossus/data/jsonl_source.h"
#include "colossus/data/sft_examples.h"
#include "tests/testing/command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace colossus::data {
namespace {

namespace fs = std::filesystem;

const fs::path& oracle_dir() {
  static const fs::path dir = [] {
    fs::path out = colossus::testing::scratch_dir("sft_examples") / "trl";
    const auto result = colossus::testing::run_command(
        fmt::format("'{}' '{}' '{}' 2>&1", COLOSSUS_PYTHON, COLOSSUS_SFT_ORACLE, out.string()));
    if (result.exit_code != 0) throw std::runtime_error("sft_oracle.py failed:\n" + result.output);
    return out;
  }();
  return dir;
}

std::string config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

class SftMatchesTrl : public ::testing::TestWithParam<std::string> {};

TEST_P(SftMatchesTrl, SameIdsAndTargetsAsSftTrainer) {
  const fs::path dir = oracle_dir();
  const auto tokenizer = load_tokenizer((dir / "tokenizer").string());
  const SftExampleBuilder builder(*tokenizer, {.max_length = 24});
  std::ifstream trl_file(dir / (GetParam() + ".trl.json"));
  const auto trl = nlohmann::json::parse(trl_file);
  JsonlSource source((dir / (GetParam() + ".jsonl")).string());
  size_t row = 0, dropped = 0;
  while (auto record = source.next()) {
    const SftExample example = builder.build(record->record);
    if (example.trains_nothing()) {
      ++dropped;
      continue;
    }
    ASSERT_LT(row, trl.size()) << "more examples than TRL kept";
    const auto& expected = trl[row];
    EXPECT_EQ(example.input_ids, expected["input_ids"].get<std::vector<int32_t>>()) << "line " << record->line_number;
    std::vector<uint8_t> trained;
    for (const auto& label : expected["labels"]) trained.push_back(label.get<int64_t>() == -100 ? 0 : 1);
    EXPECT_EQ(example.trained, trained) << "line " << record->line_number;
    ++row;
  }
  EXPECT_EQ(row, trl.size());
  // The prompt longer than max_length leaves no target; TRL drops it too.
  EXPECT_EQ(dropped, GetParam() == "prompt_completion" ? 1U : 0U);
}

INSTANTIATE_TEST_SUITE_P(Formats, SftMatchesTrl, ::testing::Values("prompt_completion", "text"));

TEST(SftExamples, OptionsAndRecordsSftCannotTrainAreRefusedByName) {
  EXPECT_NE(config_error([] { parse_train_on("assistants"); }).find("valid: auto, assistant, completion, all"),
            std::string::npos);
  EXPECT_NE(config_error([] { parse_truncation("left"); }).find("keep_start, keep_end"), std::string::npos);
  const auto tokenizer = load_tokenizer((oracle_dir() / "tokenizer").string());
  EXPECT_NE(config_error([&] { SftExampleBuilder(*tokenizer, {.max_length = -1}); }).find("data.max_length is -1"),
            std::string::npos);
  const SftExampleBuilder builder(*tokenizer, {});
  Record chat{.format = RecordFormat::Chat, .messages = {{"user", "hi"}, {"assistant", "hello"}}};
  EXPECT_NE(config_error([&] { builder.build(chat); }).find("chat template"), std::string::npos);
  Record preference{.format = RecordFormat::Preference};
  EXPECT_NE(config_error([&] { builder.build(preference); }).find("DPO"), std::string::npos);
  Record text{.format = RecordFormat::Text, .text = "hello"};
  EXPECT_NE(config_error([&] { SftExampleBuilder(*tokenizer, {.train_on = TrainOn::Completion}).build(text); })
                .find("\"all\""),
            std::string::npos);
}

TEST(SftExamples, TrainOnAllAndKeepEnd) {
  const auto tokenizer = load_tokenizer((oracle_dir() / "tokenizer").string());
  Record pc{.format = RecordFormat::PromptCompletion};
  pc.prompt.text = "What is two plus two?";
  pc.completion.text = " The answer is four.";
  const SftExample completion_only = SftExampleBuilder(*tokenizer, {}).build(pc);
  const SftExample all = SftExampleBuilder(*tokenizer, {.train_on = TrainOn::All}).build(pc);
  EXPECT_EQ(all.input_ids, completion_only.input_ids);
  EXPECT_EQ(all.targets(), static_cast<int64_t>(all.input_ids.size()) - 1);
  EXPECT_LT(completion_only.targets(), all.targets());
  EXPECT_EQ(completion_only.input_ids.back(), *tokenizer->eos_id());
  // keep_end keeps the last tokens (the completion and its EOS).
  const SftExample end = SftExampleBuilder(*tokenizer, {.max_length = 4, .truncation = Truncation::KeepEnd}).build(pc);
  ASSERT_EQ(end.input_ids.size(), 4U);
  EXPECT_TRUE(std::equal(end.input_ids.begin(), end.input_ids.end(), completion_only.input_ids.end() - 4));
  EXPECT_EQ(end.trained, std::vector<uint8_t>(4, 1));
}

}  // namespace
}  // namespace colossus::data
