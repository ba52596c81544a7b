// The decoder of a tokenizer.json: ByteLevel, Metaspace, ByteFallback, Fuse,
// Strip, Replace and Sequences of them, turning token strings back into text
// as Hugging Face tokenizers' decode_chain does (no decoder: tokens joined by
// spaces).
#pragma once
#include "colossus/data/text_pattern.h"

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

namespace colossus::data {

class Decoder {
 public:
  Decoder() = default;
  // A tokenizer.json "decoder" node (null: none). Throws ConfigError naming a
  // decoder that is not supported (WordPiece, CTC, BPEDecoder, ...).
  static Decoder from_json(const nlohmann::json& node, const std::string& path);
  // The ByteLevel decoder alone.
  static Decoder byte_level();

  // The text of `tokens`, the token strings of the ids in order.
  std::string decode(std::vector<std::string> tokens) const;

 private:
  struct Step {
    enum class Kind { kByteLevel, kMetaspace, kByteFallback, kFuse, kStrip, kReplace } kind;
    std::optional<TextPattern> pattern;  // Replace
    std::string text;                    // Replace: the content; Metaspace: the replacement
    char32_t strip_char = U' ';          // Strip
    std::size_t start = 0, stop = 0;     // Strip: chars to remove at each end
    bool prepend = true;                 // Metaspace: prepend_scheme is not "never"
  };
  static void read(const nlohmann::json& node, const std::string& path, std::vector<Step>& steps);
  static void run(const Step& step, std::vector<std::string>& tokens);

  bool present_ = false;
  std::vector<Step> steps_;
};

}  // namespace colossus::data
