// Each normalizer, pre-tokenizer and decoder alone against the Python
// tokenizers package (normalize_str, pre_tokenize_str, decode) on the fixture
// texts: Split behaviours and invert, Metaspace schemes, Digits, Punctuation,
// Whitespace, Lowercase, Replace with strings and regexes, ByteFallback, ...
#include "colossus/data/decoder.h"
#include "colossus/data/normalizer.h"
#include "colossus/data/pre_tokenizer.h"
#include "tests/data/tokenizer_fixtures.h"

#include <gtest/gtest.h>

namespace colossus::data {
namespace {

using testing::fixtures;

TEST(TokenizerComponents, NormalizersMatchTokenizers) {
  const auto& texts = fixtures().expected["texts"];
  const auto& cases = fixtures().expected["normalizers"];
  ASSERT_GE(cases.size(), 10u);
  for (const auto& c : cases) {
    const Normalizer normalizer = Normalizer::from_json(c["json"], "test");
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const auto text = texts[i].get<std::string>();
      EXPECT_EQ(normalizer.apply(text), c["outputs"][i].get<std::string>())
          << c["json"].dump() << " on: " << text.substr(0, 80);
    }
  }
}

TEST(TokenizerComponents, PreTokenizersMatchTokenizers) {
  const auto& texts = fixtures().expected["texts"];
  const auto& cases = fixtures().expected["pre_tokenizers"];
  ASSERT_GE(cases.size(), 50u);
  for (const auto& c : cases) {
    const PreTokenizer pre_tokenizer = PreTokenizer::from_json(c["json"], "test");
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const auto text = texts[i].get<std::string>();
      std::deque<std::string> arena;
      std::vector<std::string_view> words;
      pre_tokenizer.split(text, /*at_origin=*/true, arena, words);
      EXPECT_EQ(std::vector<std::string>(words.begin(), words.end()), c["outputs"][i].get<std::vector<std::string>>())
          << c["json"].dump() << " on: " << text.substr(0, 80);
    }
  }
}

TEST(TokenizerComponents, DecodersMatchTokenizers) {
  const auto& cases = fixtures().expected["decoders"];
  ASSERT_GE(cases.size(), 5u);
  for (const auto& c : cases) {
    const Decoder decoder = Decoder::from_json(c["json"], "test");
    for (const auto& d : c["cases"]) {
      EXPECT_EQ(decoder.decode(d["tokens"].get<std::vector<std::string>>()), d["text"].get<std::string>())
          << c["json"].dump() << " on: " << d["tokens"].dump().substr(0, 200);
    }
  }
}

}  // namespace
}  // namespace colossus::data
