// Added tokens (special tokens like <|endoftext|> and user-added ones) are cut
// out of the text before pre-tokenization, as Hugging Face's AddedVocabulary
// does: leftmost-longest matches, with its lstrip/rstrip/single_word options.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace colossus::data {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool single_word = false;  // only match when not inside a word
  bool lstrip = false;       // the match takes the whitespace before it
  bool rstrip = false;       // the match takes the whitespace after it
  bool normalized = false;   // matched after the normalizer (second pass)
};

// A piece of input text: plain text for the pre-tokenizer (id < 0), or the
// text an added token matched.
struct TextSegment {
  std::string_view text;
  int32_t id = -1;
};

// Matches one set of added tokens in text.
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  // Splits `text` into segments appended to `out`; empty plain pieces are left out.
  void split(std::string_view text, std::vector<TextSegment>& out) const;
  bool empty() const { return tokens_.empty(); }

 private:
  // The longest token matching text at pos, or nullptr.
  const AddedToken* longest_at(std::string_view text, std::size_t pos) const;

  std::vector<AddedToken> tokens_;
  // For each first byte, indices into tokens_, longest first.
  std::vector<std::vector<uint32_t>> by_first_byte_;
};

}  // namespace colossus::data
