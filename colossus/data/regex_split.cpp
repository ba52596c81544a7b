#include "colossus/data/regex_split.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <oniguruma.h>

#include <mutex>

namespace colossus::data {

namespace {

void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

// Bytes of the UTF-8 character starting at `byte` (1 for a stray byte).
size_t char_length(unsigned char byte) {
  if (byte >= 0xF0) return 4;
  if (byte >= 0xE0) return 3;
  if (byte >= 0xC0) return 2;
  return 1;
}

}  // namespace

struct RegexSplitter::Compiled {
  OnigRegex regex = nullptr;
  ~Compiled() {
    if (regex != nullptr) onig_free(regex);
  }
};

RegexSplitter::RegexSplitter(const std::string& pattern) : pattern_(pattern), compiled_(std::make_unique<Compiled>()) {
  initialize_oniguruma();
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern_.data());
  const int status = onig_new(&compiled_->regex, begin, begin + pattern_.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                              ONIG_SYNTAX_DEFAULT, &info);
  if (status != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, status, &info);
    throw ConfigError(fmt::format("Split regex {} does not compile: {}", pattern_, reinterpret_cast<char*>(message)));
  }
}

RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  const auto* start = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = start + text.size();
  OnigRegion* region = onig_region_new();
  size_t gap = 0, from = 0;
  while (from <= text.size()) {
    const int found = onig_search(compiled_->regex, start, end, start + from, end, region, ONIG_OPTION_NONE);
    if (found < 0) break;  // ONIG_MISMATCH (or an error: the rest stays one piece)
    const auto match_begin = static_cast<size_t>(region->beg[0]), match_end = static_cast<size_t>(region->end[0]);
    if (match_end == match_begin) {
      // An empty match splits nothing; step over one character.
      if (match_begin >= text.size()) break;
      from = match_begin + char_length(static_cast<unsigned char>(text[match_begin]));
      continue;
    }
    if (match_begin > gap) pieces.push_back(text.substr(gap, match_begin - gap));
    pieces.push_back(text.substr(match_begin, match_end - match_begin));
    gap = from = match_end;
  }
  if (gap < text.size()) pieces.push_back(text.substr(gap));
  onig_region_free(region, 1);
}

}  // namespace colossus::data
