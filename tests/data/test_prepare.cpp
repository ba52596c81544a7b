// data::prepare_token_shards (colossus data prepare): the shards hold every
// document's ids followed by the end-of-text token, in input order (JSONL
// records, whole text files with their blank lines, or lines), cut into
// shards of exactly shard_tokens; the same bytes for 1 and 3 threads; an
// interrupted run resumes to the same shards; a changed input or option is
// refused, a bad record named by file:line.
#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"
#include "colossus/data/prepare.h"
#include "colossus/data/token_shards.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace colossus;
namespace fs = std::filesystem;

namespace {

struct Scratch {
  fs::path dir;
  Scratch() {
    dir = fs::temp_directory_path() / ("colossus_prepare_" + std::to_string(::getpid()) + "_" +
                                       std::to_string(std::random_device{}()));
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
};

std::string random_text(std::mt19937& rng, int words) {
  static const char* vocab[] = {"alpha", "beta", "gamma", "\xc3\xa9t\xc3\xa9", "\xe4\xb8\x96\xe7\x95\x8c", "42", "\n\n",
                                "delta,", "eps."};
  std::string text;
  for (int i = 0; i < words; ++i) text += std::string(vocab[rng() % 9]) + " ";
  return text;
}

// A corpus of 3 files: records.jsonl (40 records), notes.txt (one document
// with blank lines), lines.txt (one document per file unless per_line).
std::vector<std::string> make_corpus(const fs::path& dir, std::vector<std::string>& documents, bool per_line) {
  std::mt19937 rng(7);
  std::ofstream jsonl(dir / "a_records.jsonl");
  for (int i = 0; i < 40; ++i) {
    std::string text = random_text(rng, 5 + static_cast<int>(rng() % 60));
    jsonl << nlohmann::json{{"text", text}, {"id", i}}.dump() << "\n";
    if (i % 7 == 3) jsonl << "\n";  // blank lines between records are skipped
    documents.push_back(text);
  }
  jsonl.close();
  const std::string notes = "First paragraph.\n\nSecond paragraph after a blank line.\n";
  std::ofstream(dir / "b_notes.txt") << notes;
  documents.push_back(notes);
  std::ofstream lines(dir / "c_lines.txt");
  std::string whole;
  for (int i = 0; i < 5; ++i) {
    const std::string line = "line " + std::to_string(i) + " \xc3\xa9t\xc3\xa9 " + std::to_string(rng() % 1000);
    lines << line << "\n";
    whole += line + "\n";
  }
  lines.close();
  if (per_line) {
    // b_notes.txt's non-empty lines are documents too.
    documents.pop_back();
    documents.push_back("First paragraph.");
    documents.push_back("Second paragraph after a blank line.");
    size_t start = 0;
    for (int i = 0; i < 5; ++i) {
      const size_t end = whole.find('\n', start);
      documents.push_back(whole.substr(start, end - start));
      start = end + 1;
    }
  } else {
    documents.push_back(whole);
  }
  return {(dir / "a_records.jsonl").string(), (dir / "b_notes.txt").string(), (dir / "c_lines.txt").string()};
}

std::vector<int64_t> read_all(const std::vector<std::string>& shards) {
  std::vector<int64_t> out;
  for (const auto& path : shards) {
    auto shard = data::TokenShard::open(path);
    std::vector<int64_t> part(static_cast<size_t>(shard.size()));
    shard.read(0, shard.size(), part.data());
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST(DataPrepare, ShardsHoldEachDocumentThenEosInOrderForAnyThreadCount) {
  for (bool per_line : {false, true}) {
    Scratch scratch;
    std::vector<std::string> documents;
    const auto inputs = make_corpus(scratch.dir, documents, per_line);
    const auto tokenizer = data::make_byte_tokenizer();
    std::vector<int64_t> expected;
    for (const auto& doc : documents) {
      for (int32_t id : tokenizer->encode(doc, false)) expected.push_back(id);
      expected.push_back(*tokenizer->eos_id());
    }
    std::vector<std::vector<std::string>> shard_sets;
    for (int threads : {1, 3}) {
      data::PrepareOptions options{.inputs = {(scratch.dir / "*.jsonl").string(), inputs[1], inputs[2]},
                                   .output_dir = (scratch.dir / ("out" + std::to_string(threads))).string(),
                                   .per_line = per_line,
                                   .shard_tokens = 500,
                                   .threads = threads,
                                   .batch_documents = 4};
      const auto result = data::prepare_token_shards(*tokenizer, options);
      EXPECT_EQ(result.documents, static_cast<int64_t>(documents.size()));
      EXPECT_EQ(result.tokens, static_cast<int64_t>(expected.size()));
      EXPECT_FALSE(result.resumed);
      EXPECT_EQ(read_all(result.shards), expected) << "per_line " << per_line << ", " << threads << " threads";
      for (size_t k = 0; k + 1 < result.shards.size(); ++k) EXPECT_EQ(data::TokenShard::open(result.shards[k]).size(), 500);
      shard_sets.push_back(result.shards);
    }
    ASSERT_EQ(shard_sets[0].size(), shard_sets[1].size());
    for (size_t k = 0; k < shard_sets[0].size(); ++k) EXPECT_EQ(bytes_of(shard_sets[0][k]), bytes_of(shard_sets[1][k]));
  }
}

TEST(DataPrepare, AnInterruptedRunResumesToTheSameShards) {
  Scratch scratch;
  std::vector<std::string> documents;
  const auto inputs = make_corpus(scratch.dir, documents, false);
  const auto tokenizer = data::make_byte_tokenizer();
  auto options_for = [&](const std::string& out) {
    return data::PrepareOptions{.inputs = inputs, .output_dir = (scratch.dir / out).string(), .shard_tokens = 333,
                                .threads = 2, .batch_documents = 3};
  };
  const auto whole = data::prepare_token_shards(*tokenizer, options_for("whole"));
  auto interrupted = options_for("resumed");
  int batches = 0;
  interrupted.progress = [&](int64_t, int64_t, int64_t) {
    if (++batches == 5) throw std::runtime_error("interrupted");
  };
  EXPECT_THROW(data::prepare_token_shards(*tokenizer, interrupted), std::runtime_error);
  ASSERT_TRUE(fs::exists(scratch.dir / "resumed" / "prepare_state.json"));
  const auto resumed = data::prepare_token_shards(*tokenizer, options_for("resumed"));
  EXPECT_TRUE(resumed.resumed);
  EXPECT_EQ(resumed.tokens, whole.tokens);
  EXPECT_EQ(resumed.documents, whole.documents);
  ASSERT_EQ(resumed.shards.size(), whole.shards.size());
  for (size_t k = 0; k < whole.shards.size(); ++k) EXPECT_EQ(bytes_of(resumed.shards[k]), bytes_of(whole.shards[k]));
  // A finished output is left alone.
  const auto again = data::prepare_token_shards(*tokenizer, options_for("resumed"));
  EXPECT_TRUE(again.already_done);
  EXPECT_EQ(again.tokens, whole.tokens);
}

TEST(DataPrepare, ChangedInputsOptionsAndBadRecordsAreRefused) {
  Scratch scratch;
  std::vector<std::string> documents;
  const auto inputs = make_corpus(scratch.dir, documents, false);
  const auto tokenizer = data::make_byte_tokenizer();
  data::PrepareOptions options{.inputs = inputs, .output_dir = (scratch.dir / "out").string(), .shard_tokens = 400};
  data::prepare_token_shards(*tokenizer, options);
  auto other = options;
  other.shard_tokens = 401;
  try {
    data::prepare_token_shards(*tokenizer, other);
    FAIL() << "another shard_tokens into the same output should be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("shard_tokens"), std::string::npos) << e.what();
  }
  std::ofstream(scratch.dir / "bad.jsonl") << "{\"text\": \"fine\"}\n{\"content\": \"no text field\"}\n";
  data::PrepareOptions bad{.inputs = {(scratch.dir / "bad.jsonl").string()}, .output_dir = (scratch.dir / "bad").string()};
  try {
    data::prepare_token_shards(*tokenizer, bad);
    FAIL() << "a record without its text field should be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--text_key"), std::string::npos) << e.what();
  }
  EXPECT_THROW(data::prepare_token_shards(*tokenizer, {.inputs = {(scratch.dir / "missing*.txt").string()},
                                                        .output_dir = (scratch.dir / "none").string()}),
               ConfigError);
  EXPECT_THROW(data::prepare_token_shards(*tokenizer, {.inputs = inputs, .output_dir = (scratch.dir / "z").string(),
                                                        .shard_tokens = 0}),
               ConfigError);
}
