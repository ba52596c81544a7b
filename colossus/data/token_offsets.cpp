#include "colossus/data/token_offsets.h"

#include "colossus/core/errors.h"
#include "colossus/data/unicode.h"

#include <fmt/format.h>

#include <string>

namespace colossus::data {

EncodedText encode_with_offsets(const Tokenizer& tokenizer, std::string_view text) {
  EncodedText encoded{.ids = tokenizer.encode(text, /*add_special_tokens=*/false), .offsets = {}};
  std::vector<std::string> pieces;
  pieces.reserve(encoded.ids.size());
  size_t spelled = 0;
  for (size_t i = 0; i < encoded.ids.size(); ++i) {
    std::optional<std::string> token = tokenizer.token_text(encoded.ids[i]);
    if (!token) throw ConfigError(fmt::format("token id {} (position {}) has no text", encoded.ids[i], i));
    spelled += token->size();
    pieces.push_back(std::move(*token));
  }
  // Tokens that spell more than the text: the tokenizer put spaces in front
  // of pieces (SentencePiece's prefix space, once per piece between added
  // tokens). Where a piece itself starts with a space, its first token's
  // space is still the added one, as tokenizers aligns it.
  size_t added_spaces = spelled > text.size() ? spelled - text.size() : 0;
  encoded.offsets.reserve(encoded.ids.size());
  size_t pos = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    std::string_view piece = pieces[i];
    const bool added_space =
        piece.starts_with(' ') && text.compare(pos, piece.size() - 1, piece.substr(1)) == 0 &&
        (text.compare(pos, piece.size(), piece) != 0 || added_spaces > 0);
    if (added_space) {
      piece.remove_prefix(1);
      if (added_spaces > 0) --added_spaces;
    }
    if (text.compare(pos, piece.size(), piece) != 0) {
      throw ConfigError(fmt::format(
          "cannot find token {} ({:?}, id {}) at byte {} of the text ({:?}): the tokenizer's normalizer rewrites "
          "text, so its tokens cannot be mapped back to the chat template's assistant turns",
          i, pieces[i], encoded.ids[i], pos, text.substr(pos, 16)));
    }
    if (piece.empty() && added_space && pos < text.size()) {
      // An added space standing alone: tokenizers gives it the character it
      // was put before (so it is marked with that character).
      encoded.offsets.emplace_back(pos, pos + decode_utf8(text, pos).bytes);
      continue;
    }
    encoded.offsets.emplace_back(pos, pos + piece.size());
    pos += piece.size();
  }
  if (pos != text.size())
    throw ConfigError(fmt::format("the tokens spell {} of the text's {} bytes: the tokenizer's normalizer rewrites or "
                                  "drops text ({:?}), so its tokens cannot be mapped back to the chat template's "
                                  "assistant turns",
                                  pos, text.size(), text.substr(pos, 16)));
  return encoded;
}

std::vector<uint8_t> tokens_overlapping(const std::vector<ByteSpan>& offsets, const std::vector<ByteSpan>& spans) {
  std::vector<uint8_t> mask(offsets.size(), 0);
  size_t span = 0;
  for (size_t i = 0; i < offsets.size(); ++i) {
    const auto [begin, end] = offsets[i];
    while (span < spans.size() && begin >= spans[span].second) ++span;
    if (span == spans.size()) break;
    if (end > spans[span].first) mask[i] = 1;
  }
  return mask;
}

}  // namespace colossus::data
