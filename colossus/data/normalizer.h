// The Unicode normalizers of a tokenizer.json ("normalizer": NFC, NFD, NFKC,
// NFKD, or a Sequence of them), applied as Hugging Face tokenizers does:
// to the text between the added tokens matched on the raw text, before the
// normalized added tokens and the pre-tokenizer. Normalisation is utf8proc's
// (Debian's libutf8proc), not ours.
#pragma once
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
  // a normalizer type that is not supported (Lowercase, Replace, ...) and `path`.
  static Normalizer from_json(const nlohmann::json& node, const std::string& path);

  bool empty() const { return forms_.empty(); }
  // Text that is not valid UTF-8 cannot be normalised and is returned as is.
  std::string apply(std::string_view text) const;
  // The tokenizer.json spelling, e.g. {"type":"NFC"}, for messages and tests.
  std::string describe() const;

 private:
  std::vector<UnicodeForm> forms_;  // applied in order
};

}  // namespace colossus::data
