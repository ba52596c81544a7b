// Parity with Python: every fixture tokenizer must give exactly the ids,
// decoded text, vocabulary and special ids that tokenizers / transformers /
// sentencepiece give, on texts covering scripts, emoji, whitespace runs,
// numbers, contractions and special tokens inside the text.
#include "colossus/core/errors.h"
#include "colossus/data/pre_tokenize.h"
#include "colossus/data/regex_split.h"
#include "colossus/data/token_offsets.h"
#include "colossus/data/tokenizer.h"
#include "tests/data/tokenizer_fixtures.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <thread>

namespace colossus::data {
namespace {

using testing::fixtures;

std::optional<int32_t> optional_id(const nlohmann::json& value) {
  if (value.is_null()) return std::nullopt;
  return value.get<int32_t>();
}

class TokenizerParity : public ::testing::TestWithParam<std::string> {
 protected:
  const nlohmann::json& entry() const { return fixtures().tokenizer(GetParam()); }
  std::unique_ptr<Tokenizer> load() const { return load_tokenizer(fixtures().path(entry()["path"])); }
};

TEST_P(TokenizerParity, EncodeAndDecodeMatchPython) {
  auto tokenizer = load();
  for (const auto& c : entry()["cases"]) {
    const auto text = c["text"].get<std::string>();
    SCOPED_TRACE("text: " + text.substr(0, 80));
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto ids_special = c["ids_special"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer->encode(text), ids);
    EXPECT_EQ(tokenizer->encode(text, /*add_special_tokens=*/true), ids_special);
    EXPECT_EQ(tokenizer->decode(ids), c["decoded"].get<std::string>());
    EXPECT_EQ(tokenizer->decode(ids_special, /*skip_special_tokens=*/true),
              c["decoded_special_skip"].get<std::string>());
    if (c["roundtrip"].get<bool>()) {
      EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
    }
  }
}

// Token offsets (what SFT marks assistant turns by) equal the tokenizers
// package's, where it gives them and the tokens spell the text; a tokenizer
// whose normalizer rewrites the text is refused by name instead.
TEST_P(TokenizerParity, OffsetsMatchPython) {
  auto tokenizer = load();
  int compared = 0;
  for (const auto& c : entry()["cases"]) {
    if (!c.contains("byte_offsets")) continue;
    const auto text = c["text"].get<std::string>();
    SCOPED_TRACE("text: " + text.substr(0, 80));
    EncodedText encoded;
    try {
      encoded = encode_with_offsets(*tokenizer, text);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("normalizer"), std::string::npos) << e.what();
      continue;
    }
    EXPECT_EQ(encoded.ids, c["ids"].get<std::vector<int32_t>>());
    // tokenizers gives a token that holds part of a character the whole
    // character; ours are exact bytes. The same tokens overlap any span
    // that starts and ends between characters (a chat template's turns).
    for (auto& [begin, end] : encoded.offsets) {
      while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
      while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    }
    const auto expected = c["byte_offsets"].get<std::vector<std::pair<size_t, size_t>>>();
    EXPECT_EQ(encoded.offsets, expected);
    ++compared;
  }
  if (entry()["cases"][0].contains("byte_offsets")) {
    RecordProperty("compared", compared);
  }
}

TEST_P(TokenizerParity, VocabularyAndSpecialIdsMatchPython) {
  auto tokenizer = load();
  EXPECT_EQ(tokenizer->vocab_size(), entry()["vocab_size"].get<int32_t>());
  EXPECT_EQ(tokenizer->bos_id(), optional_id(entry()["bos"]));
  EXPECT_EQ(tokenizer->eos_id(), optional_id(entry()["eos"]));
  EXPECT_EQ(tokenizer->pad_id(), optional_id(entry()["pad"]));
  const auto& sample = entry()["vocab_sample"];
  ASSERT_GT(sample.size(), 20u);
  for (const auto& pair : sample) {
    const auto token = pair[0].get<std::string>();
    const auto id = pair[1].get<int32_t>();
    EXPECT_EQ(tokenizer->token_to_id(token), id) << token;
    EXPECT_EQ(tokenizer->id_to_token(id), token) << id;
  }
  EXPECT_EQ(tokenizer->token_to_id("no such token \x01\x02"), std::nullopt);
  EXPECT_EQ(tokenizer->id_to_token(tokenizer->vocab_size()), std::nullopt);
  EXPECT_EQ(tokenizer->id_to_token(-1), std::nullopt);
}

// The whole training corpus as one input (~170 KB, long lines, all scripts;
// one word for the BPE of a tokenizer without pre-tokenizer), and back.
TEST_P(TokenizerParity, LongInputMatchesPython) {
  auto tokenizer = load();
  std::ifstream in(fixtures().path("corpus.txt"), std::ios::binary);
  std::stringstream corpus;
  corpus << in.rdbuf();
  const auto expected = entry()["corpus_ids"].get<std::vector<int32_t>>();
  ASSERT_GT(expected.size(), 10000u);
  const auto ids = tokenizer->encode(corpus.str());
  EXPECT_EQ(ids, expected);
  if (entry().value("corpus_roundtrip", false)) {
    EXPECT_EQ(tokenizer->decode(ids), corpus.str());
  }
}

// One tokenizer shared by threads gives the same ids (the word cache is shared).
TEST_P(TokenizerParity, ConcurrentEncodeIsConsistent) {
  auto tokenizer = load();
  const auto& cases = entry()["cases"];
  std::vector<std::vector<std::vector<int32_t>>> results(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int repeat = 0; repeat < 3; ++repeat) {
        for (const auto& c : cases) results[t].push_back(tokenizer->encode(c["text"].get<std::string>()));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) {
    ASSERT_EQ(result.size(), 3 * cases.size());
    for (std::size_t i = 0; i < result.size(); ++i) {
      EXPECT_EQ(result[i], cases[i % cases.size()]["ids"].get<std::vector<int32_t>>());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerParity,
                         ::testing::Values("gpt2_json", "gpt2_legacy_merges", "gpt2_files", "gpt2_added", "llama3_json",
                                           "qwen2_json", "qwen2_nfc", "qwen2_nfkc", "custom_regex", "gpt2_digits",
                                           "llama2_json", "gemma_json", "metaspace_json", "words_json", "sp_bpe",
                                           "sp_unigram"));

// The hand-written regexes split exactly as Oniguruma does.
TEST(PreTokenize, SplitsMatchOniguruma) {
  const auto& expected = fixtures().expected;
  const auto& texts = expected["texts"];
  for (const auto& [name, pattern] :
       {std::pair{"gpt2", SplitPattern::kGpt2}, std::pair{"llama3", SplitPattern::kLlama3},
        std::pair{"qwen2", SplitPattern::kQwen2}}) {
    const auto& splits = expected["splits"][name];
    ASSERT_EQ(splits.size(), texts.size());
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const auto text = texts[i].get<std::string>();
      std::vector<std::string_view> pieces;
      pre_tokenize(text, pattern, pieces);
      EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()), splits[i].get<std::vector<std::string>>())
          << name << " on: " << text.substr(0, 80);
    }
  }
}

// Our Oniguruma splitter (any Split regex) gives what tokenizers' does, on the
// same three regexes, spelled as tokenizer.json spells them.
TEST(PreTokenize, RegexSplitterMatchesTokenizers) {
  const auto& expected = fixtures().expected;
  const auto& texts = expected["texts"];
  for (const auto& [name, pattern] :
       {std::pair{"gpt2", SplitPattern::kGpt2}, std::pair{"llama3", SplitPattern::kLlama3},
        std::pair{"qwen2", SplitPattern::kQwen2}}) {
    const RegexSplitter splitter{std::string(split_pattern_regex(pattern))};
    const auto& splits = expected["splits"][name];
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const auto text = texts[i].get<std::string>();
      std::vector<std::string_view> pieces;
      splitter.split(text, pieces);
      EXPECT_EQ(std::vector<std::string>(pieces.begin(), pieces.end()), splits[i].get<std::vector<std::string>>())
          << name << " on: " << text.substr(0, 80);
    }
  }
}

}  // namespace
}  // namespace colossus::data
