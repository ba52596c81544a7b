// A tokenizer.json Split pre-tokenizer whose regex is none of the hand-written
// ones (pre_tokenize.h): compiled by Oniguruma (Debian's libonig), the engine
// Hugging Face tokenizers itself uses, with its default syntax and UTF-8.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace colossus::data {

class RegexSplitter {
 public:
  // Throws ConfigError naming `pattern` and Oniguruma's message when it does
  // not compile.
  explicit RegexSplitter(const std::string& pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Split's "Isolated" behaviour: every match and every gap between matches,
  // in order, covering `text` (empty pieces left out). Safe from several
  // threads at once.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace colossus::data
