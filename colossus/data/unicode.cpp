#include "colossus/data/unicode.h"

#include <algorithm>
#include <array>

namespace colossus::data {

namespace {

std::array<CharClass, 128> make_ascii_classes() {
  std::array<CharClass, 128> classes{};
  for (char32_t cp = 0; cp < 128; ++cp) {
    const auto* end = unicode_detail::kClassRanges + unicode_detail::kClassRangeCount;
    const auto* it = std::upper_bound(unicode_detail::kClassRanges, end, cp,
                                      [](char32_t c, const unicode_detail::CodepointRange& r) { return c < r.first; });
    classes[cp] = (it != unicode_detail::kClassRanges && cp <= (it - 1)->last) ? (it - 1)->cls : CharClass::kOther;
  }
  return classes;
}

// The byte range a continuation byte may take right after a given lead byte;
// later continuation bytes are always 0x80..0xBF.
struct LeadInfo {
  uint32_t length;  // 0: not a lead byte
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes UTF-16 surrogates
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0, 0, 0};
}

}  // namespace

CharClass char_class(char32_t cp) {
  static const std::array<CharClass, 128> ascii = make_ascii_classes();
  if (cp < 128) return ascii[cp];
  const auto* begin = unicode_detail::kClassRanges;
  const auto* end = begin + unicode_detail::kClassRangeCount;
  const auto* it =
      std::upper_bound(begin, end, cp, [](char32_t c, const unicode_detail::CodepointRange& r) { return c < r.first; });
  if (it == begin) return CharClass::kOther;
  --it;
  return cp <= it->last ? it->cls : CharClass::kOther;
}

bool is_word_char(char32_t cp) {
  const auto* begin = unicode_detail::kWordRanges;
  const auto* end = begin + unicode_detail::kWordRangeCount;
  const auto* it =
      std::upper_bound(begin, end, cp, [](char32_t c, const unicode_detail::WordRange& r) { return c < r.first; });
  return it != begin && cp <= (it - 1)->last;
}

Utf8Char decode_utf8(std::string_view text, std::size_t pos) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) return {b0, 1};
  const LeadInfo lead = lead_info(b0);
  if (lead.length == 0) return {kInvalidCodepoint, 1};
  char32_t cp = b0 & (0xFF >> (lead.length + 1));
  for (uint32_t i = 1; i < lead.length; ++i) {
    if (pos + i >= text.size()) return {kInvalidCodepoint, i};
    const auto b = static_cast<uint8_t>(text[pos + i]);
    const uint8_t lo = i == 1 ? lead.second_lo : 0x80;
    const uint8_t hi = i == 1 ? lead.second_hi : 0xBF;
    // The valid prefix so far is one maximal invalid subpart (Unicode ch. 3).
    if (b < lo || b > hi) return {kInvalidCodepoint, i};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, lead.length};
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    const Utf8Char ch = decode_utf8(bytes, pos);
    if (ch.cp == kInvalidCodepoint) {
      append_utf8(0xFFFD, out);
    } else {
      out.append(bytes.substr(pos, ch.bytes));
    }
    pos += ch.bytes;
  }
  return out;
}

}  // namespace colossus::data
