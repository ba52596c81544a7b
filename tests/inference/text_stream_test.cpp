// TextStream hands out whole UTF-8 characters as tokens arrive, with the raw
// byte tokenizer and with the lossy byte-level BPE one, and the pieces add up
// to the decoded text.
#include "colossus/inference/text_stream.h"
#include "colossus/data/corpus.h"
#include "colossus/data/tokenizer.h"
#include "tests/inference/support.h"

#include <gtest/gtest.h>

namespace colossus::inference {
namespace {

bool is_valid_utf8(const std::string& text) { return complete_utf8_prefix(text) == text.size(); }

void expect_streams(const data::Tokenizer& tokenizer, const std::string& text) {
  TextStream stream(tokenizer);
  std::string joined;
  for (int32_t id : tokenizer.encode(text)) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(is_valid_utf8(piece)) << "piece ends inside a character";
    joined += piece;
  }
  joined += stream.finish();
  EXPECT_EQ(joined, text);
}

const std::string kText = "héllo wörld € 東京 😀 done\n<|endoftext|>after";
const std::string kShown = "héllo wörld € 東京 😀 done\nafter";  // special tokens skipped

TEST(TextStream, ByteTokenizerPiecesAreWholeCharacters) {
  auto tokenizer = data::make_byte_tokenizer();
  TextStream stream(*tokenizer);
  std::string joined;
  for (int32_t id : tokenizer->encode(kText)) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(is_valid_utf8(piece));
    joined += piece;
  }
  EXPECT_EQ(joined + stream.finish(), kShown);
  expect_streams(*tokenizer, "plain ascii");
}

TEST(TextStream, LossyByteLevelBpePiecesAreWholeCharacters) {
  const std::string dir = (testing::scratch_dir() / "stream_tokenizer").string();
  data::save_byte_tokenizer(dir);
  auto tokenizer = data::load_tokenizer(dir);
  expect_streams(*tokenizer, "héllo wörld € 東京 😀 done\n");
}

TEST(TextStream, FinishHandsOutAnIncompleteTail) {
  auto tokenizer = data::make_byte_tokenizer();
  TextStream stream(*tokenizer);
  EXPECT_EQ(stream.push('a'), "a");
  EXPECT_EQ(stream.push(0xE2), "");
  EXPECT_EQ(stream.push(0x82), "");
  EXPECT_EQ(stream.finish(), "\xE2\x82");
}

TEST(TextStream, CompleteUtf8Prefix) {
  EXPECT_EQ(complete_utf8_prefix(""), 0u);
  EXPECT_EQ(complete_utf8_prefix("abc"), 3u);
  EXPECT_EQ(complete_utf8_prefix("a\xC3"), 1u);
  EXPECT_EQ(complete_utf8_prefix("a\xC3\xA9"), 3u);
  EXPECT_EQ(complete_utf8_prefix("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(complete_utf8_prefix("a\xF0\x9F\x98\x80"), 5u);
  EXPECT_EQ(complete_utf8_prefix("a\xEF\xBF\xBD"), 1u);  // U+FFFD waits for more
  // Only the last U+FFFD can still change: the ones before it stream out.
  EXPECT_EQ(complete_utf8_prefix("a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"), 7u);
  EXPECT_EQ(complete_utf8_prefix("\xFF"), 1u);           // invalid bytes never complete: pass
}

}  // namespace
}  // namespace colossus::inference
