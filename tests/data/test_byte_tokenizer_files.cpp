// save_byte_tokenizer writes make_byte_tokenizer() as Hugging Face files: our
// load_tokenizer, Python's tokenizers and transformers' AutoTokenizer must all
// encode and decode varied text exactly as the byte tokenizer does.
#include "colossus/data/corpus.h"
#include "colossus/data/tokenizer.h"
#include "tests/testing/command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace colossus::data {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> texts() {
  return {"",
          "Hello, world!",
          "  leading and trailing spaces   ",
          "line one\nline two\r\nline three\n\n\ttabbed\n",
          "héllo wörld, Ångström, naïve café",
          "東京は日本の首都です。 한국어 русский ελληνικά مرحبا",
          "emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flag 🇩🇪",
          "e\u0301 combining, \u00a0nbsp, \u3000ideographic",
          "<|endoftext|>",
          "before<|endoftext|>after <|endoftext|><|endoftext|> twice",
          "<|endoftext| almost <|endoftext",
          "don't I'LL we've 3.14159 $1,234 x=f(y)+1;",
          " . , ! ? ' \" ",
          builtin_corpus(/*seed=*/3, /*bytes=*/3000)};
}

class ByteTokenizerFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(colossus::testing::scratch_dir("byte_tokenizer") / "tokenizer");
    save_byte_tokenizer(dir_->string());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static fs::path* dir_;
};

fs::path* ByteTokenizerFiles::dir_ = nullptr;

TEST_F(ByteTokenizerFiles, LoadTokenizerGivesTheByteTokenizer) {
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    EXPECT_TRUE(fs::is_regular_file(*dir_ / file)) << file;
  }
  auto bytes = make_byte_tokenizer();
  auto loaded = load_tokenizer(dir_->string());
  EXPECT_EQ(loaded->vocab_size(), 257);
  EXPECT_EQ(loaded->bos_id(), 256);
  EXPECT_EQ(loaded->eos_id(), 256);
  EXPECT_EQ(loaded->pad_id(), std::nullopt);
  EXPECT_EQ(loaded->token_to_id("<|endoftext|>"), 256);
  for (const auto& text : texts()) {
    SCOPED_TRACE("text: " + text.substr(0, 60));
    const auto ids = bytes->encode(text);
    const auto ids_special = bytes->encode(text, /*add_special_tokens=*/true);
    EXPECT_EQ(loaded->encode(text), ids);
    EXPECT_EQ(loaded->encode(text, true), ids_special);
    EXPECT_EQ(loaded->decode(ids), bytes->decode(ids));
    EXPECT_EQ(loaded->decode(ids_special, /*skip_special_tokens=*/true), bytes->decode(ids_special, true));
  }
  // Saving again over the same directory works (a checkpoint re-save).
  EXPECT_NO_THROW(save_byte_tokenizer(dir_->string()));
}

TEST_F(ByteTokenizerFiles, PythonTokenizersAndTransformersAgree) {
  const fs::path texts_file = *dir_ / "texts.json";
  std::ofstream(texts_file) << nlohmann::json(texts()).dump();
  const std::string command = fmt::format("'{}' '{}' '{}' '{}' 2>&1", COLOSSUS_PYTHON, COLOSSUS_BYTE_TOKENIZER_ORACLE,
                                          dir_->string(), texts_file.string());
  const auto result = colossus::testing::run_command(command);
  const std::string& output = result.output;
  ASSERT_EQ(result.exit_code, 0) << output;
  const auto json = nlohmann::json::parse(output.substr(output.find('{')));
  EXPECT_EQ(json["vocab_size"], 257);
  EXPECT_EQ(json["bos"], 256);
  EXPECT_EQ(json["eos"], 256);
  EXPECT_TRUE(json["pad"].is_null());
  auto bytes = make_byte_tokenizer();
  const auto all = texts();
  ASSERT_EQ(json["cases"].size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& text = all[i];
    const auto ids = bytes->encode(text);
    const auto ids_special = bytes->encode(text, true);
    for (const char* library : {"tokenizers", "transformers"}) {
      SCOPED_TRACE(fmt::format("{}: {}", library, text.substr(0, 60)));
      const auto& c = json["cases"][i][library];
      EXPECT_EQ(c["ids"].get<std::vector<int32_t>>(), ids);
      EXPECT_EQ(c["ids_special"].get<std::vector<int32_t>>(), ids_special);
      EXPECT_EQ(c["decoded"].get<std::string>(), bytes->decode(ids));
      EXPECT_EQ(c["decoded_skip"].get<std::string>(), bytes->decode(ids_special, true));
    }
  }
}

}  // namespace
}  // namespace colossus::data
