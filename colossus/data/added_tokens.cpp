#include "colossus/data/added_tokens.h"

#include "colossus/data/unicode.h"

#include <algorithm>

namespace colossus::data {

namespace {

// The code point that ends text[0, end), scanning back over continuation bytes.
Utf8Char last_char(std::string_view text, std::size_t end) {
  std::size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  Utf8Char ch = decode_utf8(text, start);
  if (start + ch.bytes != end) return {kInvalidCodepoint, 1};
  return ch;
}

bool is_space_char(Utf8Char ch) { return ch.cp != kInvalidCodepoint && char_class(ch.cp) == CharClass::kSpace; }

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : by_first_byte_(256) {
  for (auto& token : tokens) {
    if (!token.content.empty()) tokens_.push_back(std::move(token));
  }
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(),
                     [&](uint32_t a, uint32_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
  }
}

const AddedToken* AddedTokenMatcher::longest_at(std::string_view text, std::size_t pos) const {
  for (uint32_t index : by_first_byte_[static_cast<uint8_t>(text[pos])]) {
    const std::string& content = tokens_[index].content;
    if (text.compare(pos, content.size(), content) == 0) return &tokens_[index];
  }
  return nullptr;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out) const {
  std::size_t plain_start = 0;  // start of the text not yet emitted
  std::size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* token = longest_at(text, pos);
    if (token == nullptr) {
      ++pos;
      continue;
    }
    std::size_t start = pos;
    std::size_t stop = pos + token->content.size();
    if (token->single_word) {
      const bool word_before = start > 0 && is_word_char(last_char(text, start).cp);
      const bool word_after = stop < text.size() && is_word_char(decode_utf8(text, stop).cp);
      // Like Hugging Face's non-overlapping search, a rejected match is not
      // searched again from inside.
      if (word_before || word_after) {
        pos = stop;
        continue;
      }
    }
    if (token->lstrip) {
      while (start > plain_start) {
        const Utf8Char ch = last_char(text, start);
        if (!is_space_char(ch)) break;
        start -= ch.bytes;
      }
    }
    if (token->rstrip) {
      while (stop < text.size()) {
        const Utf8Char ch = decode_utf8(text, stop);
        if (!is_space_char(ch)) break;
        stop += ch.bytes;
      }
    }
    if (start > plain_start) out.push_back({text.substr(plain_start, start - plain_start), -1});
    out.push_back({text.substr(start, stop - start), token->id});
    plain_start = pos = stop;
  }
  if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1});
}

}  // namespace colossus::data
