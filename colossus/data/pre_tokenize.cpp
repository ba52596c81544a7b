#include "colossus/data/pre_tokenize.h"

#include "colossus/data/unicode.h"

#include <cstdint>

namespace colossus::data {

namespace {

constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The text decoded once: code point, class and starting byte of each char;
// offset[n] is the text size.
struct Chars {
  std::vector<char32_t> cp;
  std::vector<CharClass> cls;
  std::vector<uint32_t> offset;

  void decode(std::string_view text) {
    cp.clear();
    cls.clear();
    offset.clear();
    std::size_t pos = 0;
    while (pos < text.size()) {
      const Utf8Char ch = decode_utf8(text, pos);
      cp.push_back(ch.cp);
      cls.push_back(ch.cp == kInvalidCodepoint ? CharClass::kOther : char_class(ch.cp));
      offset.push_back(static_cast<uint32_t>(pos));
      pos += ch.bytes;
    }
    offset.push_back(static_cast<uint32_t>(pos));
  }
  std::size_t size() const { return cp.size(); }
  bool is(std::size_t i, CharClass c) const { return i < cp.size() && cls[i] == c; }
  std::size_t run_end(std::size_t i, CharClass c) const {
    while (i < cp.size() && cls[i] == c) ++i;
    return i;
  }
};

char32_t ascii_lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }
bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }

// 's 't 're 've 'm 'll 'd at i: the end of the match, or 0.
std::size_t match_contraction(const Chars& c, std::size_t i, bool ignore_case) {
  if (c.cp[i] != '\'' || i + 1 >= c.size()) return 0;
  auto at = [&](std::size_t k) { return ignore_case ? ascii_lower(c.cp[k]) : c.cp[k]; };
  const char32_t c1 = at(i + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
  if (i + 2 >= c.size()) return 0;
  const char32_t c2 = at(i + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
  return 0;
}

// \s+(?!\S)|\s+ at a whitespace char: the greedy run, less its last char when
// a non-space follows and the run is longer than one (the lookahead backtracks).
std::size_t match_space_run(const Chars& c, std::size_t i) {
  const std::size_t j = c.run_end(i, CharClass::kSpace);
  if (j == c.size() || j - i == 1) return j;
  return j - 1;
}

// ` ?X+` for a class X: the end of the match, or 0.
std::size_t match_space_prefixed_run(const Chars& c, std::size_t i, CharClass x) {
  std::size_t start = i;
  if (c.cp[i] == ' ' && c.is(i + 1, x)) start = i + 1;
  if (!c.is(start, x)) return 0;
  return c.run_end(start, x);
}

std::size_t match_gpt2(const Chars& c, std::size_t i) {
  if (std::size_t end = match_contraction(c, i, false)) return end;
  if (std::size_t end = match_space_prefixed_run(c, i, CharClass::kLetter)) return end;
  if (std::size_t end = match_space_prefixed_run(c, i, CharClass::kNumber)) return end;
  if (std::size_t end = match_space_prefixed_run(c, i, CharClass::kOther)) return end;
  return match_space_run(c, i);
}

std::size_t match_llama3(const Chars& c, std::size_t i, std::size_t max_digits) {
  if (std::size_t end = match_contraction(c, i, true)) return end;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  const bool may_prefix = !is_newline(c.cp[i]) && c.cls[i] != CharClass::kLetter && c.cls[i] != CharClass::kNumber;
  if (may_prefix && c.is(i + 1, CharClass::kLetter)) return c.run_end(i + 1, CharClass::kLetter);
  if (c.cls[i] == CharClass::kLetter) return c.run_end(i, CharClass::kLetter);
  // \p{N}{1,max}
  if (c.cls[i] == CharClass::kNumber) {
    std::size_t j = i;
    while (j < c.size() && j - i < max_digits && c.cls[j] == CharClass::kNumber) ++j;
    return j;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  if (std::size_t end = match_space_prefixed_run(c, i, CharClass::kOther)) {
    while (end < c.size() && is_newline(c.cp[end])) ++end;
    return end;
  }
  // \s*[\r\n]+ : \s* backtracks to the last newline of the whitespace run.
  const std::size_t run = c.run_end(i, CharClass::kSpace);
  for (std::size_t k = run; k > i; --k) {
    if (is_newline(c.cp[k - 1])) return k;
  }
  return match_space_run(c, i);
}

}  // namespace

std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  return std::nullopt;
}

std::string_view split_pattern_regex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2: return kGpt2Regex;
    case SplitPattern::kLlama3: return kLlama3Regex;
    case SplitPattern::kQwen2: return kQwen2Regex;
  }
  return kGpt2Regex;
}

void pre_tokenize(std::string_view text, SplitPattern pattern, std::vector<std::string_view>& pieces) {
  // Reused across calls on one thread: encode runs this once per text segment.
  thread_local Chars chars;
  chars.decode(text);
  std::size_t i = 0;
  while (i < chars.size()) {
    std::size_t end = 0;
    switch (pattern) {
      case SplitPattern::kGpt2: end = match_gpt2(chars, i); break;
      case SplitPattern::kLlama3: end = match_llama3(chars, i, 3); break;
      case SplitPattern::kQwen2: end = match_llama3(chars, i, 1); break;
    }
    pieces.push_back(text.substr(chars.offset[i], chars.offset[end] - chars.offset[i]));
    i = end;
  }
}

}  // namespace colossus::data
