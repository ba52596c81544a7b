// The "pattern" of a tokenizer.json Replace or Split: {"String": ...} (matched
// literally) or {"Regex": ...} (Oniguruma, as Hugging Face tokenizers runs it).
#pragma once
#include "colossus/data/regex_split.h"
#include "colossus/data/text_split.h"

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace colossus::data {

class TextPattern {
 public:
  // `node` is the {"String"|"Regex": ...} object; `owner` names the component
  // for the ConfigError an empty string or a regex that does not compile gives.
  static TextPattern from_json(const nlohmann::json& node, const std::string& owner, const std::string& path);

  // Matches and gaps covering `text` (text_split.h).
  void find_matches(std::string_view text, std::vector<TextMatch>& out) const;
  // `text` with each match replaced by `content`.
  std::string replace_all(std::string_view text, std::string_view content) const;
  // Whether this is the regex `regex` (for the hand-written fast paths).
  const std::string* regex_source() const { return regex_ ? &regex_->pattern() : nullptr; }

 private:
  std::string literal_;
  std::shared_ptr<const RegexSplitter> regex_;  // shared: tokenizers are copied while built
};

}  // namespace colossus::data
