#include "colossus/data/text_pattern.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace colossus::data {

TextPattern TextPattern::from_json(const nlohmann::json& node, const std::string& owner, const std::string& path) {
  TextPattern pattern;
  if (node.is_object() && node.size() == 1) {
    if (const auto s = node.find("String"); s != node.end() && s->is_string() && !s->get<std::string>().empty()) {
      pattern.literal_ = s->get<std::string>();
      return pattern;
    }
    if (const auto r = node.find("Regex"); r != node.end() && r->is_string()) {
      try {
        pattern.regex_ = std::make_shared<const RegexSplitter>(r->get<std::string>());
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("{}: {} {}", path, owner, e.what()));
      }
      return pattern;
    }
  }
  throw ConfigError(fmt::format("{}: {} pattern {} is not supported; expected {{\"String\": \"...\"}} (not empty) or "
                                "{{\"Regex\": \"...\"}}",
                                path, owner, node.dump().substr(0, 200)));
}

void TextPattern::find_matches(std::string_view text, std::vector<TextMatch>& out) const {
  if (regex_) {
    regex_->find_matches(text, out);
  } else {
    find_literal_matches(text, literal_, out);
  }
}

std::string TextPattern::replace_all(std::string_view text, std::string_view content) const {
  thread_local std::vector<TextMatch> matches;
  matches.clear();
  find_matches(text, matches);
  std::string out;
  out.reserve(text.size());
  for (const TextMatch& m : matches) {
    if (m.is_match) {
      out += content;
    } else {
      out += text.substr(m.begin, m.end - m.begin);
    }
  }
  return out;
}

}  // namespace colossus::data
