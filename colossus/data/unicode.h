// The Unicode pieces the tokenizers need without ICU: UTF-8 decoding that
// tolerates invalid bytes, the character classes of the pre-tokenizer regexes
// (\p{L}, \p{N}, \s) and \w from generated range tables, lossy UTF-8 repair.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace colossus::data {

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// The class of one code point: kLetter for \p{L}, kNumber for \p{N}, kSpace
// for \s (U+0009..U+000D, U+0085, Zs/Zl/Zp), kOther for everything else.
CharClass char_class(char32_t cp);

// Whether cp is in \w as Rust's regex crate has it (Alphabetic, marks,
// decimal digits, connector punctuation, joiners): the word test that
// Hugging Face applies to single_word added tokens. U+00BD is not; U+0301 is.
bool is_word_char(char32_t cp);

// One decoded code point and how many bytes of the input it took.
struct Utf8Char {
  char32_t cp;
  uint32_t bytes;
};

// Sentinel code point for a byte that does not start a valid UTF-8 sequence;
// it is classed kOther and consumes exactly one byte.
inline constexpr char32_t kInvalidCodepoint = 0xFFFFFFFF;

// Decodes the code point starting at text[pos] (pos < text.size()).
Utf8Char decode_utf8(std::string_view text, std::size_t pos);

// Appends the UTF-8 encoding of cp to out.
void append_utf8(char32_t cp, std::string& out);

// Replaces each maximal invalid subsequence by U+FFFD, as Rust's
// String::from_utf8_lossy does (so decode output matches Hugging Face's).
std::string utf8_lossy(std::string_view bytes);

namespace unicode_detail {
struct CodepointRange {
  char32_t first;
  char32_t last;
  CharClass cls;
};
struct WordRange {
  char32_t first;
  char32_t last;
};
extern const CodepointRange kClassRanges[];
extern const std::size_t kClassRangeCount;
extern const WordRange kWordRanges[];
extern const std::size_t kWordRangeCount;
}  // namespace unicode_detail

}  // namespace colossus::data
