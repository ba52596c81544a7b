// The pieces under the tokenizers (Unicode classes, UTF-8 repair, the byte
// alphabet, BPE merging) and the errors load_tokenizer gives for bad input.
#include "colossus/core/errors.h"
#include "colossus/data/bpe_model.h"
#include "colossus/data/tokenizer.h"
#include "colossus/data/unicode.h"
#include "tests/data/tokenizer_fixtures.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

namespace colossus::data {
namespace {

using testing::fixtures;

// Runs fn, which must throw ConfigError whose message contains every part.
void expect_config_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no ConfigError thrown";
  } catch (const ConfigError& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

void write_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

TEST(Unicode, ClassesOfRepresentativeCodepoints) {
  EXPECT_EQ(char_class('a'), CharClass::kLetter);
  EXPECT_EQ(char_class(U'é'), CharClass::kLetter);
  EXPECT_EQ(char_class(U'中'), CharClass::kLetter);
  EXPECT_EQ(char_class(U'ب'), CharClass::kLetter);
  EXPECT_EQ(char_class('7'), CharClass::kNumber);
  EXPECT_EQ(char_class(U'٣'), CharClass::kNumber);  // Arabic-Indic digit (Nd)
  EXPECT_EQ(char_class(U'½'), CharClass::kNumber);  // No
  EXPECT_EQ(char_class(U'Ⅻ'), CharClass::kNumber);  // Nl
  for (char32_t space : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\u0085', U'\u00a0', U'\u2028', U'\u3000'}) {
    EXPECT_EQ(char_class(space), CharClass::kSpace) << static_cast<uint32_t>(space);
  }
  EXPECT_EQ(char_class(U'\u001c'), CharClass::kOther);  // Python's isspace says yes; \s does not
  EXPECT_EQ(char_class('!'), CharClass::kOther);
  EXPECT_EQ(char_class(U'😀'), CharClass::kOther);
  EXPECT_EQ(char_class(U'\u200b'), CharClass::kOther);  // zero width space is Cf
  EXPECT_EQ(char_class(U'\u0301'), CharClass::kOther);  // combining mark (Mn)
  EXPECT_EQ(char_class(0x10FFFF), CharClass::kOther);
}

TEST(Unicode, WordCharactersFollowRustRegexBackslashW) {
  for (char32_t word : {U'a', U'Z', U'_', U'7', U'é', U'中', U'٣', U'Ⅻ', U'\u0301', U'Ⓐ', U'\u200d'}) {
    EXPECT_TRUE(is_word_char(word)) << static_cast<uint32_t>(word);
  }
  for (char32_t other : {U' ', U'!', U'\'', U'½', U'²', U'😀', U'\u3000', U'-'}) {
    EXPECT_FALSE(is_word_char(other)) << static_cast<uint32_t>(other);
  }
  EXPECT_FALSE(is_word_char(kInvalidCodepoint));
}

TEST(Unicode, DecodeAndLossyRepair) {
  const std::string text = "a\u00e9\u4e2d\U0001F600";
  std::vector<char32_t> cps;
  for (std::size_t pos = 0; pos < text.size();) {
    const Utf8Char ch = decode_utf8(text, pos);
    cps.push_back(ch.cp);
    pos += ch.bytes;
  }
  EXPECT_EQ(cps, (std::vector<char32_t>{U'a', U'é', U'中', U'😀'}));
  std::string encoded;
  for (char32_t cp : cps) append_utf8(cp, encoded);
  EXPECT_EQ(encoded, text);
  EXPECT_EQ(utf8_lossy(text), text);
  // One U+FFFD per maximal invalid subpart, as Python's errors="replace" does.
  EXPECT_EQ(utf8_lossy("a\xff"
                       "b"),
            "a\uFFFDb");
  EXPECT_EQ(utf8_lossy("\xe4\xb8"), "\uFFFD");  // truncated 3-byte sequence
  EXPECT_EQ(utf8_lossy("a\xed\xa0\x80"
                       "b"),
            "a\uFFFD\uFFFD\uFFFDb");                                      // surrogate
  EXPECT_EQ(utf8_lossy("\xc0\xaf"), "\uFFFD\uFFFD");                      // overlong
  EXPECT_EQ(utf8_lossy("\xf4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // above U+10FFFF
}

TEST(ByteAlphabet, IsABijectionOverAllBytes) {
  EXPECT_EQ(byte_to_unicode(' '), "\u0120");   // 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), "\u010a");  // 'Ċ'
  EXPECT_EQ(byte_to_unicode('A'), "A");
  for (int b = 0; b < 256; ++b) {
    const std::string& mapped = byte_to_unicode(static_cast<uint8_t>(b));
    const Utf8Char ch = decode_utf8(mapped, 0);
    EXPECT_EQ(ch.bytes, mapped.size());
    EXPECT_EQ(unicode_to_byte(ch.cp), b);
  }
  EXPECT_EQ(unicode_to_byte(U' '), std::nullopt);
  EXPECT_EQ(unicode_to_byte(U'€'), std::nullopt);
}

BpeModel tiny_model(bool ignore_merges) {
  Vocab vocab;
  int32_t next = 0;
  for (const char* token : {"a", "b", "c", "ab", "bc", "abc", "cab"}) vocab[token] = next++;
  // "b c" outranks nothing it competes with; "ab" comes first.
  return BpeModel(std::move(vocab), {{"a", "b"}, {"b", "c"}, {"ab", "c"}},
                  {.ignore_merges = ignore_merges, .unk_id = std::nullopt}, "tiny");
}

TEST(BpeModel, MergesByRankAndSkipsUnknownBytes) {
  const BpeModel model = tiny_model(false);
  std::vector<int32_t> ids;
  model.encode_word("abc", ids);  // a b c -> ab c -> abc
  EXPECT_EQ(ids, (std::vector<int32_t>{5}));
  ids.clear();
  model.encode_word("cab", ids);  // c a b -> c ab; no "c ab" merge although "cab" is a token
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3}));
  ids.clear();
  model.encode_word("bcxab", ids);  // 'x' has no token and no unk: dropped
  EXPECT_EQ(ids, (std::vector<int32_t>{4, 3}));
  ids.clear();
  model.encode_word("cab", ids);  // cached result is the same
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3}));
  const BpeModel whole = tiny_model(true);
  ids.clear();
  whole.encode_word("cab", ids);  // ignore_merges: a word in the vocabulary is taken whole
  EXPECT_EQ(ids, (std::vector<int32_t>{6}));
}

TEST(BpeModel, RejectsMergesOverMissingTokens) {
  Vocab vocab{{"a", 0}, {"b", 1}};
  expect_config_error([&] { BpeModel(vocab, {{"a", "b"}}, {}, "file.json"); }, {"file.json", "'a b'"});
  Vocab duplicate{{"a", 0}, {"b", 0}};
  expect_config_error([&] { BpeModel(duplicate, {}, {}, "dup.json"); }, {"dup.json", "id 0"});
}

TEST(ByteLevelBpe, InvalidUtf8IsEncodedByteByByteAndRepairedOnDecode) {
  auto tokenizer = load_tokenizer(fixtures().path("gpt2_json"));
  const auto ids = tokenizer->encode(
      "ok\xff\xfe"
      "ok");
  EXPECT_EQ(tokenizer->decode(ids), "ok\uFFFD\uFFFDok");
}

TEST(ByteLevelBpe, DecodeRejectsIdsOutsideTheVocabulary) {
  auto tokenizer = load_tokenizer(fixtures().path("gpt2_json"));
  expect_config_error(
      [&] {
        tokenizer->decode({1, tokenizer->vocab_size()});
      },
      {"id " + std::to_string(tokenizer->vocab_size())});
  expect_config_error([&] { tokenizer->decode({-3}); }, {"id -3"});
  auto sp = load_tokenizer(fixtures().path("sp_bpe"));
  expect_config_error([&] { sp->decode({sp->vocab_size()}); }, {"id " + std::to_string(sp->vocab_size())});
}

TEST(LoadTokenizer, ErrorsNameThePathAndTheProblem) {
  const auto& f = fixtures();
  expect_config_error([&] { load_tokenizer(f.path("does/not/exist")); }, {"does/not/exist", "does not exist"});
  expect_config_error([&] { load_tokenizer(f.path("bad/malformed")); }, {"malformed/tokenizer.json", "not valid JSON"});
  expect_config_error([&] { load_tokenizer(f.path("bad/wordpiece/tokenizer.json")); }, {"WordPiece", "BPE"});
  expect_config_error([&] { load_tokenizer(f.path("bad/empty_dir")); }, {"empty_dir", "tokenizer.json"});
  expect_config_error([&] { load_tokenizer(f.path("corpus.txt")); }, {"corpus.txt", "unknown kind"});

  write_file(f.path("bad/garbage.model"), "this is not a protobuf");
  expect_config_error([&] { load_tokenizer(f.path("bad/garbage.model")); }, {"garbage.model", "SentencePiece"});
  write_file(f.path("bad/vocab_only/vocab.json"), R"({"a": 0})");
  expect_config_error([&] { load_tokenizer(f.path("bad/vocab_only/vocab.json")); }, {"merges.txt"});
  write_file(f.path("bad/bad_merges/vocab.json"), R"({"a": 0, "b": 1, "ab": 2})");
  write_file(f.path("bad/bad_merges/merges.txt"), "#version: 0.2\na b\nab\n");
  expect_config_error([&] { load_tokenizer(f.path("bad/bad_merges")); }, {"merges.txt:3", "'ab'"});
}

// Parts of tokenizer.json that the byte-level tokenizer does not implement are
// refused, not silently ignored.
TEST(LoadTokenizer, RefusesUnsupportedTokenizerJsonParts) {
  const auto& f = fixtures();
  std::ifstream in(f.path("gpt2_json/tokenizer.json"));
  const nlohmann::json good = nlohmann::json::parse(in);
  auto check = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit,
                   std::initializer_list<std::string> parts) {
    nlohmann::json bad = good;
    edit(bad);
    const std::string path = f.path("bad/" + name + ".json");
    write_file(path, bad.dump());
    SCOPED_TRACE(name);
    expect_config_error([&] { load_tokenizer(path); }, parts);
  };
  check("bert_normalizer", [](auto& j) { j["normalizer"] = {{"type", "BertNormalizer"}}; },
        {"normalizer", "BertNormalizer", "Lowercase"});
  check("precompiled", [](auto& j) { j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AA"}}; },
        {"normalizer", "Precompiled"});
  check("empty_replace",
        [](auto& j) {
          j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", ""}}}, {"content", "x"}};
        },
        {"normalizer Replace pattern", "String"});
  check("bad_replace_regex",
        [](auto& j) {
          j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "(a"}}}, {"content", "x"}};
        },
        {"normalizer Replace", "(a", "does not compile"});
  check("bert_pre_tokenizer", [](auto& j) { j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}}; },
        {"pre_tokenizer", "BertPreTokenizer", "Metaspace"});
  check("split_behavior",
        [](auto& j) {
          j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
        },
        {"Split behavior 'Sideways'", "MergedWithNext"});
  check("byte_level_first",
        [](auto& j) {
          j["pre_tokenizer"] = {{"type", "Sequence"},
                                {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}};
        },
        {"ByteLevel", "last"});
  check("metaspace_scheme",
        [](auto& j) {
          j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "sometimes"}};
        },
        {"Metaspace prepend_scheme 'sometimes'"});
  check("metaspace_prefix",
        [](auto& j) {
          j["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "always"}, {"add_prefix_space", false}};
        },
        {"add_prefix_space", "contradicts"});
  check("metaspace_replacement", [](auto& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}}; },
        {"Metaspace replacement 'ab'", "one character"});
  check("metaspace_decoder",
        [](auto& j) {
          j["decoder"] = {{"type", "Metaspace"}, {"prepend_scheme", "never"}, {"add_prefix_space", true}};
        },
        {"decoder Metaspace add_prefix_space", "contradicts"});
  check("split_pattern",
        [](auto& j) {
          j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Glob", "*"}}}, {"behavior", "Isolated"}};
        },
        {"Split pattern", "Glob"});
  check("strip_decoder", [](auto& j) { j["decoder"] = {{"type", "Strip"}, {"content", "ab"}}; },
        {"decoder Strip content 'ab'"});
  check("dropout", [](auto& j) { j["model"]["dropout"] = 0.1; }, {"dropout", "null"});
  check("suffix", [](auto& j) { j["model"]["end_of_word_suffix"] = "</w>"; }, {"end_of_word_suffix", "</w>"});
  check("unigram", [](auto& j) { j["model"]["type"] = "Unigram"; }, {"model.type 'Unigram'", "BPE"});
  check("regex",
        [](auto& j) {
          j["pre_tokenizer"] = {{"type", "Sequence"},
                                {"pretokenizers",
                                 {{{"type", "Split"}, {"pattern", {{"Regex", "(\\w+"}}}, {"behavior", "Isolated"}},
                                  {{"type", "ByteLevel"}, {"use_regex", false}}}}};
        },
        {"(\\w+", "does not compile"});
  check("wordpiece_decoder", [](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }, {"decoder", "WordPiece", "Fuse"});
  check("merge_type", [](auto& j) { j["model"]["merges"][0] = 7; }, {"merge 7"});
  check("missing_merge",
        [](auto& j) {
          j["model"]["merges"][0] = {"Ġ", "\u4e2d\u4e2d"};
        },
        {"missing from the vocabulary"});
  check("id_type", [](auto& j) { j["added_tokens"][0]["id"] = "zero"; }, {"unexpected tokenizer.json structure"});
  write_file(f.path("bad/config_names_missing/tokenizer.json"), good.dump());
  write_file(f.path("bad/config_names_missing/tokenizer_config.json"), R"({"pad_token": "<nope>"})");
  expect_config_error([&] { load_tokenizer(f.path("bad/config_names_missing")); }, {"pad_token", "<nope>"});
}

}  // namespace
}  // namespace colossus::data
