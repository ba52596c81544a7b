#include "colossus/inference/text_stream.h"

namespace colossus::inference {

size_t complete_utf8_prefix(const std::string& text) {
  size_t end = text.size();
  // A trailing replacement character (EF BF BD) may be an incomplete
  // character a lossy decoder rendered: it waits for more text. Only the last
  // one can still change (a lossy decoder renders an incomplete tail as one
  // U+FFFD); those before it are final, so a run of invalid bytes streams out
  // as it comes instead of waiting for the next valid character.
  if (end >= 3 && text.compare(end - 3, 3, "\xEF\xBF\xBD") == 0) end -= 3;
  // Find the start of the last character and check it is complete.
  size_t start = end;
  int continuation = 0;
  while (start > 0 && continuation < 3 && (static_cast<unsigned char>(text[start - 1]) & 0xC0) == 0x80) {
    --start;
    ++continuation;
  }
  if (start == 0) return continuation == 0 ? end : 0;
  const auto lead = static_cast<unsigned char>(text[start - 1]);
  size_t length = 1;
  if ((lead & 0xE0) == 0xC0)
    length = 2;
  else if ((lead & 0xF0) == 0xE0)
    length = 3;
  else if ((lead & 0xF8) == 0xF0)
    length = 4;
  else if ((lead & 0x80) == 0)
    return end - continuation;  // ASCII then stray continuation bytes: keep them waiting
  // A lead byte whose character is not complete yet waits; invalid bytes pass.
  if (length > 1 && static_cast<size_t>(continuation) + 1 < length) return start - 1;
  return end;
}

std::string TextStream::push(int64_t token) {
  // An id the tokenizer has no piece for (a model vocabulary padded past the
  // tokenizer's) decodes to nothing, as in transformers, rather than failing.
  if (token < 0 || token >= tokenizer_.vocab_size()) return {};
  ids_.push_back(static_cast<int32_t>(token));
  text_ = tokenizer_.decode(ids_, skip_special_tokens_);
  const size_t ready = complete_utf8_prefix(text_);
  if (ready <= emitted_) return {};
  std::string out = text_.substr(emitted_, ready - emitted_);
  emitted_ = ready;
  return out;
}

std::string TextStream::finish() {
  std::string out = emitted_ < text_.size() ? text_.substr(emitted_) : std::string();
  emitted_ = text_.size();
  return out;
}

}  // namespace colossus::inference
