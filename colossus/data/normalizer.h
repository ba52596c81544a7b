// The normalizer of a tokenizer.json: NFC, NFD, NFKC, NFKD (utf8proc, Debian's
// libutf8proc), Lowercase, Replace (a string, or a regex run by Oniguruma),
// Prepend, Strip, and Sequences of them, applied as Hugging Face tokenizers
// does: to each text piece between the added tokens matched on the raw text,
// before the normalized added tokens and the pre-tokenizer.
#pragma once
#include "colossus/data/text_pattern.h"

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace colossus::data {

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };

class Normalizer {
 public:
  Normalizer() = default;
  // A tokenizer.json "normalizer" node (null: none). Throws ConfigError naming
  // a normalizer that is not supported (BertNormalizer, Precompiled, ...) and `path`.
  static Normalizer from_json(const nlohmann::json& node, const std::string& path);

  bool empty() const { return steps_.empty(); }
  // Bytes that are not valid UTF-8 pass the Unicode forms unchanged.
  std::string apply(std::string_view text) const;

 private:
  struct Step {
    enum class Kind { kUnicode, kLowercase, kReplace, kPrepend, kStrip } kind;
    UnicodeForm form = UnicodeForm::kNfc;
    TextPattern pattern;               // Replace
    std::string text;                  // Replace: what each match becomes; Prepend: the prefix
    bool left = false, right = false;  // Strip
  };
  static void read(const nlohmann::json& node, const std::string& path, std::vector<Step>& steps);
  static std::string apply_step(const Step& step, std::string text);

  std::vector<Step> steps_;  // applied in order
};

}  // namespace colossus::data
