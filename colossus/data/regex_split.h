// A tokenizer.json regex (a Split pattern none of the hand-written ones in
// pre_tokenize.h spells, a Replace pattern): compiled by Oniguruma (Debian's
// libonig), the engine Hugging Face tokenizers itself uses, default syntax, UTF-8.
#pragma once
#include "colossus/data/text_split.h"

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

  // The matches and the gaps between them, covering `text`, as tokenizers'
  // find_matches gives them: non-overlapping, leftmost first; an empty match
  // is kept unless it directly follows a match (Rust find_iter's rule).
  void find_matches(std::string_view text, std::vector<TextMatch>& out) const;

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
