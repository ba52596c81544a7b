// How Hugging Face tokenizers cuts a text by a pattern: the pattern's matches
// and the gaps between them (Pattern::find_matches), then one of the Split
// behaviours (Removed, Isolated, MergedWithPrevious, MergedWithNext,
// Contiguous), optionally inverted. Regex matches come from regex_split.h.
#pragma once
#include "colossus/data/unicode.h"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace colossus::data {

// A byte range [begin, end) of a text and whether the pattern matched it.
struct TextMatch {
  std::size_t begin;
  std::size_t end;
  bool is_match;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The behaviour a tokenizer.json spells ("Isolated", ...), or nullopt.
std::optional<SplitBehavior> split_behavior_from_name(std::string_view name);

// Every occurrence of `literal` (not empty), leftmost first, not overlapping,
// and the gaps between: a cover of `text` (an empty text gives one empty gap).
void find_literal_matches(std::string_view text, std::string_view literal, std::vector<TextMatch>& out);

// Each char for which `is_delimiter(code point)` holds is a match of its own.
// Bytes that are not valid UTF-8 are chars that never match.
template <typename Predicate>
void find_char_matches(std::string_view text, Predicate is_delimiter, std::vector<TextMatch>& out);

// Appends the pieces `behavior` makes of `text` from its `matches` (a cover of
// the text); `invert` swaps matches and gaps first. Empty pieces are left out.
void split_by_matches(std::string_view text, const std::vector<TextMatch>& matches, SplitBehavior behavior,
                      bool invert, std::vector<std::string_view>& pieces);

// Bytes of the UTF-8 char that starts with `lead` (1 for a stray byte).
inline std::size_t utf8_char_length(unsigned char lead) {
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

template <typename Predicate>
void find_char_matches(std::string_view text, Predicate is_delimiter, std::vector<TextMatch>& out) {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  std::size_t gap = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const Utf8Char ch = decode_utf8(text, pos);
    const std::size_t next = pos + ch.bytes;
    if (ch.cp != kInvalidCodepoint && is_delimiter(ch.cp)) {
      if (gap < pos) out.push_back({gap, pos, false});
      out.push_back({pos, next, true});
      gap = next;
    }
    pos = next;
  }
  if (gap < text.size()) out.push_back({gap, text.size(), false});
}

}  // namespace colossus::data
