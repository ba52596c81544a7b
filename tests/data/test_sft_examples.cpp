// SFT examples against TRL: the ids and targets SftExampleBuilder makes from
// JSONL records equal what TRL's SFTTrainer prepares from the same records
// with the same tokenizer (sft_oracle.py; prompt/completion split where the
// tokenizations diverge, EOS appended unless present, truncation at
// max_length, examples left with no target dropped); options refused by name.
#include "colossus/core/errors.h"
#include "colossus/data/chat/chat_template.h"
#include "colossus/data/jsonl_source.h"
#include "colossus/data/sft_examples.h"
#include "colossus/data/sft_stream.h"
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

// The options of sft_oracle.py's case: chat records with max_length 64, and
// assistant_only_loss as train_on = "assistant".
SftExampleOptions case_options(const std::string& name) {
  SftExampleOptions options{.max_length = name.starts_with("chat") ? 64 : 24};
  if (name.ends_with("assistant")) options.train_on = TrainOn::Assistant;
  return options;
}

TEST_P(SftMatchesTrl, SameIdsAndTargetsAsSftTrainer) {
  const fs::path dir = oracle_dir();
  const auto tokenizer = load_tokenizer((dir / "tokenizer").string());
  const auto chat = chat::ChatTemplate::find_in_model_dir((dir / "tokenizer").string());
  ASSERT_TRUE(chat.has_value());
  const SftExampleBuilder builder(*tokenizer, case_options(GetParam()), &*chat);
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

INSTANTIATE_TEST_SUITE_P(Formats, SftMatchesTrl,
                         ::testing::Values("prompt_completion", "text", "chat_all", "chat_assistant",
                                           "chat_prompt_completion", "chat_prompt_completion_assistant"));

// The assistant spans are what a template's generation blocks cover, mapped
// onto the tokens that overlap them; unmarked templates are refused for
// train_on = "assistant", and every-token training needs no markers.
TEST(SftExamples, AssistantTurnsComeFromGenerationBlocks) {
  const auto tokenizer = load_tokenizer((oracle_dir() / "tokenizer").string());
  const chat::ChatTemplate marked = *chat::ChatTemplate::find_in_model_dir((oracle_dir() / "tokenizer").string());
  const Record chat{.format = RecordFormat::Chat, .messages = {{"user", "hi"}, {"assistant", "hello"}}};
  const auto rendered = marked.apply_marking_generation(nlohmann::ordered_json::parse(
                                                            R"([{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}])"),
                                                        false);
  ASSERT_EQ(rendered.generation_spans.size(), 1U);
  const auto [begin, end] = rendered.generation_spans[0];
  EXPECT_EQ(rendered.text.substr(begin, end - begin), "hello<|im_end|>");
  const SftExample example = SftExampleBuilder(*tokenizer, {.train_on = TrainOn::Assistant}, &marked).build(chat);
  std::vector<int32_t> trained_ids;
  for (size_t i = 0; i < example.input_ids.size(); ++i)
    if (example.trained[i]) trained_ids.push_back(example.input_ids[i]);
  EXPECT_EQ(tokenizer->decode(trained_ids), "hello<|im_end|>");

  const chat::ChatTemplate plain("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
  EXPECT_FALSE(plain.has_generation_blocks());
  EXPECT_NE(config_error([&] { SftExampleBuilder(*tokenizer, {.train_on = TrainOn::Assistant}, &plain).build(chat); })
                .find("{% generation %}"),
            std::string::npos);
  const SftExample all = SftExampleBuilder(*tokenizer, {}, &plain).build(chat);
  EXPECT_EQ(tokenizer->decode(all.input_ids), "user: hi\nassistant: hello\n");
  EXPECT_EQ(all.targets(), static_cast<int64_t>(all.input_ids.size()) - 1);
  EXPECT_NE(config_error([&] { SftExampleBuilder(*tokenizer, {.train_on = TrainOn::Completion}, &plain).build(chat); })
                .find("prompt/completion records"),
            std::string::npos);
  // A generation block in a macro renders into the macro's value, not the output: refused.
  const chat::ChatTemplate in_macro(
      "{% macro turn(m) %}{% generation %}{{ m.content }}{% endgeneration %}{% endmacro %}"
      "{% for m in messages %}{{ turn(m) }}{% endfor %}");
  EXPECT_NE(config_error([&] { SftExampleBuilder(*tokenizer, {.train_on = TrainOn::Assistant}, &in_macro).build(chat); })
                .find("inside a macro"),
            std::string::npos);
}

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

// The examples a builder makes of records [first, ...) of the file, every
// `step`-th, without those that train nothing.
std::vector<SftExample> built(const std::string& name, int64_t first, int64_t step) {
  const auto tokenizer = load_tokenizer((oracle_dir() / "tokenizer").string());
  const SftExampleBuilder builder(*tokenizer, {.max_length = 24});
  JsonlSource source((oracle_dir() / (name + ".jsonl")).string());
  std::vector<SftExample> out;
  for (int64_t index = 0; auto record = source.next(); ++index) {
    if (index < first || (index - first) % step != 0) continue;
    SftExample example = builder.build(record->record);
    if (!example.trains_nothing()) out.push_back(std::move(example));
  }
  return out;
}

bool same(const SftExample& a, const SftExample& b) { return a.input_ids == b.input_ids && a.trained == b.trained; }

TEST(SftExampleStream, RanksTakeRecordsRoundRobinEpochAfterEpoch) {
  const auto tokenizer = load_tokenizer((oracle_dir() / "tokenizer").string());
  const std::string file = (oracle_dir() / "prompt_completion.jsonl").string();
  for (int64_t rank = 0; rank < 2; ++rank) {
    const auto expected = built("prompt_completion", rank, 2);
    ASSERT_FALSE(expected.empty());
    SftExampleStream stream(file, {}, SftExampleBuilder(*tokenizer, {.max_length = 24}), {.rank = rank, .world = 2, .threads = 3});
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      for (const auto& want : expected) {
        auto got = stream.next();
        ASSERT_TRUE(got.has_value());
        EXPECT_TRUE(same(*got, want)) << "rank " << rank << " epoch " << epoch;
      }
    }
  }
  // Without loop the stream ends after one pass; the record whose prompt
  // fills max_length trains nothing and is dropped (and counted).
  SftExampleStream once(file, {}, SftExampleBuilder(*tokenizer, {.max_length = 24}), {.threads = 2, .loop = false});
  int64_t count = 0;
  while (once.next()) ++count;
  EXPECT_EQ(count, static_cast<int64_t>(built("prompt_completion", 0, 1).size()));
  EXPECT_EQ(once.dropped(), 1);
}

TEST(SftExampleStream, ResumesAtExactlyTheNextExampleWithAnyThreadCount) {
  const auto tokenizer = load_tokenizer((oracle_dir() / "tokenizer").string());
  const std::string file = (oracle_dir() / "prompt_completion.jsonl").string();
  std::vector<SftExample> reference;
  std::vector<int64_t> dropped_after;  // dropped_after[k]: dropped once k + 1 examples were taken
  {
    SftExampleStream stream(file, {}, SftExampleBuilder(*tokenizer, {.max_length = 24}), {.threads = 1});
    for (int i = 0; i < 20; ++i) {
      reference.push_back(*stream.next());
      dropped_after.push_back(stream.dropped());
    }
  }
  for (int64_t taken = 0; taken < 13; ++taken) {
    SftExampleStream first(file, {}, SftExampleBuilder(*tokenizer, {.max_length = 24}), {.threads = 4, .lookahead = 3});
    for (int64_t i = 0; i < taken; ++i) ASSERT_TRUE(same(*first.next(), reference[static_cast<size_t>(i)]));
    const auto saved = SftStreamPosition::from_json(first.position().to_json());
    EXPECT_EQ(saved, first.position());
    SftExampleStream resumed(file, {}, SftExampleBuilder(*tokenizer, {.max_length = 24}), {.threads = 2});
    resumed.seek(saved);
    for (int64_t i = taken; i < taken + 6; ++i) {
      EXPECT_TRUE(same(*resumed.next(), reference[static_cast<size_t>(i)])) << "resumed after " << taken << " at " << i;
    }
    EXPECT_EQ(resumed.dropped(), dropped_after[static_cast<size_t>(taken + 5)]) << "resumed after " << taken;
  }
}

TEST(SftExampleStream, ShuffledOrderIsASeededPermutationPerEpoch) {
  const auto a = shuffled_order(1000, 7, 0);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_EQ(a, shuffled_order(1000, 7, 0));
  EXPECT_NE(a, shuffled_order(1000, 7, 1));
  EXPECT_NE(a, shuffled_order(1000, 8, 0));
  EXPECT_TRUE(shuffled_order(0, 7, 0).empty());
}

// With a shuffle seed each epoch deals the permuted records round-robin: the
// ranks together see every record once an epoch, in another order each epoch,
// and a stream resumed anywhere (any thread count) continues exactly.
TEST(SftExampleStream, ShuffledEpochsCoverEveryRecordAndResumeExactly) {
  const auto tokenizer = load_tokenizer((oracle_dir() / "tokenizer").string());
  const std::string file = (oracle_dir() / "text.jsonl").string();  // 4 records, all trainable
  const auto in_file_order = built("text", 0, 1);
  ASSERT_EQ(in_file_order.size(), 4U);
  const auto index_of = [&](const SftExample& e) {
    for (size_t i = 0; i < in_file_order.size(); ++i)
      if (same(e, in_file_order[i])) return static_cast<int64_t>(i);
    return int64_t{-1};
  };
  const SftExampleBuilder builder(*tokenizer, {.max_length = 24});
  std::vector<std::vector<int64_t>> epochs(3);
  for (int64_t rank = 0; rank < 2; ++rank) {
    SftExampleStream stream(file, {}, builder, {.rank = rank, .world = 2, .threads = 2, .shuffle_seed = 5});
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const auto order = shuffled_order(4, 5, epoch);
      for (int64_t k = rank; k < 4; k += 2) {
        const auto got = stream.next();
        ASSERT_TRUE(got.has_value());
        EXPECT_EQ(index_of(*got), order[static_cast<size_t>(k)]) << "rank " << rank << " epoch " << epoch;
        epochs[static_cast<size_t>(epoch)].push_back(index_of(*got));
      }
    }
  }
  for (auto& seen : epochs) {
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3}));
  }
  std::vector<SftExample> reference;
  {
    SftExampleStream stream(file, {}, builder, {.shuffle_seed = 5});
    for (int i = 0; i < 12; ++i) reference.push_back(*stream.next());
  }
  for (int64_t taken = 0; taken < 9; ++taken) {
    SftExampleStream first(file, {}, builder, {.threads = 3, .lookahead = 2, .shuffle_seed = 5});
    for (int64_t i = 0; i < taken; ++i) ASSERT_TRUE(same(*first.next(), reference[static_cast<size_t>(i)]));
    SftExampleStream resumed(file, {}, builder, {.shuffle_seed = 5});
    resumed.seek(SftStreamPosition::from_json(first.position().to_json()));
    for (int64_t i = taken; i < taken + 3; ++i)
      EXPECT_TRUE(same(*resumed.next(), reference[static_cast<size_t>(i)])) << "resumed after " << taken << " at " << i;
  }
}

TEST(SftExampleStream, FewerRecordsThanRanksAndUntrainableDataAreRefused) {
  const auto tokenizer = load_tokenizer((oracle_dir() / "tokenizer").string());
  const fs::path dir = colossus::testing::scratch_dir("sft_examples");
  {
    std::ofstream out(dir / "two.jsonl");
    out << R"({"prompt": "a", "completion": "b"})" << "\n" << R"({"prompt": "c", "completion": "d"})" << "\n";
  }
  SftExampleStream starved((dir / "two.jsonl").string(), {}, SftExampleBuilder(*tokenizer, {}), {.rank = 2, .world = 3});
  EXPECT_NE(config_error([&] { starved.next(); }).find("fewer than the 3 data-parallel ranks"), std::string::npos);
  // max_length 1 keeps only each prompt's first token: nothing to train, ever.
  SftExampleStream untrainable((dir / "two.jsonl").string(), {}, SftExampleBuilder(*tokenizer, {.max_length = 1}), {});
  EXPECT_NE(config_error([&] { untrainable.next(); }).find("gives data-parallel rank 0 of 1 a trained token"),
            std::string::npos);
  EXPECT_NE(config_error([&] { SftExampleStream(dir.string() + "/two.jsonl", {}, SftExampleBuilder(*tokenizer, {}), {.threads = 0}); })
                .find("SFT tokenizing threads is 0"),
            std::string::npos);
}

}  // namespace
}  // namespace colossus::data
