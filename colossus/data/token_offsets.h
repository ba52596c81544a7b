// Where each token of an encoded text lies in that text, as the offsets
// Hugging Face tokenizers return, for marking the tokens of a chat's assistant
// turns (transformers' return_assistant_tokens_mask).
#pragma once
#include "colossus/data/tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace colossus::data {

// [begin, end) byte offsets into a text.
using ByteSpan = std::pair<size_t, size_t>;

struct EncodedText {
  std::vector<int32_t> ids;
  std::vector<ByteSpan> offsets;  // one per id
};

// encode(text) without special tokens, and each token's bytes in `text`,
// found by laying the tokens' token_text() along it. A space a tokenizer puts
// in front of a word (SentencePiece's prefix space) covers no byte of the
// text; standing alone as a token, it gets the character it precedes, as in
// the tokenizers package. Offsets are exact bytes, where tokenizers widens a
// token holding part of a character to the whole character. Throws ConfigError when the tokens do not spell the text (a
// normalizer that rewrites it: lowercasing, stripping), naming the token and
// the byte where they part.
EncodedText encode_with_offsets(const Tokenizer& tokenizer, std::string_view text);

// mask[i] = 1 where token i overlaps one of `spans` (sorted, disjoint), as
// transformers marks assistant tokens: a token cut by a span's edge counts.
std::vector<uint8_t> tokens_overlapping(const std::vector<ByteSpan>& offsets, const std::vector<ByteSpan>& spans);

}  // namespace colossus::data
