// Turning a stream of generated token ids into text as it arrives, for
// printing while generation runs: a byte-level token may end inside a UTF-8
// character, and SentencePiece decodes a token's leading space only in
// context, so each step decodes all ids so far and hands out the new,
// complete part.
#pragma once
#include "colossus/data/tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace colossus::inference {

class TextStream {
 public:
  // skip_special_tokens: leave <|endoftext|> and the like out of the text.
  explicit TextStream(const data::Tokenizer& tokenizer, bool skip_special_tokens = true)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Adds one token; returns the text that is now final (may be empty while a
  // UTF-8 character is incomplete).
  std::string push(int64_t token);
  // The rest, incomplete characters included (at the end of generation).
  std::string finish();

 private:
  const data::Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  std::string text_;    // the decoded text of ids_
  size_t emitted_ = 0;  // bytes of text_ handed out
};

// The length of the longest prefix of `text` that does not end inside a
// UTF-8 character or in U+FFFD (which a lossy decoder writes for an
// incomplete one that later tokens may complete).
size_t complete_utf8_prefix(const std::string& text);

}  // namespace colossus::inference
