#include "colossus/data/regex_split.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <oniguruma.h>

#include <mutex>
#include <optional>

namespace colossus::data {

namespace {

void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
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
    throw ConfigError(fmt::format("regex {} does not compile: {}", pattern_, reinterpret_cast<char*>(message)));
  }
}

RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::find_matches(std::string_view text, std::vector<TextMatch>& out) const {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  const auto* start = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = start + text.size();
  const std::unique_ptr<OnigRegion, void (*)(OnigRegion*)> region(onig_region_new(),
                                                                  [](OnigRegion* r) { onig_region_free(r, 1); });
  std::size_t gap = 0, from = 0;
  std::optional<std::size_t> last_match_end;
  while (from <= text.size()) {
    const int found = onig_search(compiled_->regex, start, end, start + from, end, region.get(), ONIG_OPTION_NONE);
    if (found < 0) break;  // ONIG_MISMATCH (or an error: the rest stays a gap)
    const auto match_begin = static_cast<std::size_t>(region->beg[0]);
    const auto match_end = static_cast<std::size_t>(region->end[0]);
    if (match_end == match_begin) {
      // Search on from the next char; an empty match right after a match is no match.
      from = match_end + (match_end < text.size() ? utf8_char_length(static_cast<unsigned char>(text[match_end])) : 1);
      if (last_match_end == match_end) continue;
    } else {
      from = match_end;
    }
    last_match_end = match_end;
    if (match_begin > gap) out.push_back({gap, match_begin, false});
    out.push_back({match_begin, match_end, true});
    gap = match_end;
  }
  if (gap < text.size()) out.push_back({gap, text.size(), false});
}

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  thread_local std::vector<TextMatch> matches;
  matches.clear();
  find_matches(text, matches);
  split_by_matches(text, matches, SplitBehavior::kIsolated, false, pieces);
}

}  // namespace colossus::data
