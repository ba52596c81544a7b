#include "colossus/data/normalizer.h"

#include "colossus/core/errors.h"
#include "colossus/data/tokenizer_json.h"
#include "colossus/data/unicode.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <cstdlib>

namespace colossus::data {

namespace {

using nlohmann::json;

std::string unicode_form(std::string_view text, UnicodeForm form) {
  int options = UTF8PROC_STABLE;
  options |= form == UnicodeForm::kNfc || form == UnicodeForm::kNfkc ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
  if (form == UnicodeForm::kNfkc || form == UnicodeForm::kNfkd) options |= UTF8PROC_COMPAT;
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &mapped, static_cast<utf8proc_option_t>(options));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
  if (length < 0) return std::string(text);  // not valid UTF-8
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
}

// Rust's char::to_lowercase: the simple mapping, but U+0130 (İ) becomes "i̇"
// (its one unconditional multi-char lowercase).
std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t pos = 0; pos < text.size();) {
    const Utf8Char ch = decode_utf8(text, pos);
    if (ch.cp == kInvalidCodepoint) {
      out.push_back(text[pos]);
    } else if (ch.cp == 0x130) {
      out += "i\u0307";
    } else {
      append_utf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(ch.cp))), out);
    }
    pos += ch.bytes;
  }
  return out;
}

bool is_whitespace(char32_t cp) { return cp != kInvalidCodepoint && char_class(cp) == CharClass::kSpace; }

// Strip: Rust's trim_start/trim_end (White_Space chars).
std::string strip(std::string text, bool left, bool right) {
  std::size_t begin = 0, end = text.size();
  if (left) {
    while (begin < end) {
      const Utf8Char ch = decode_utf8(text, begin);
      if (!is_whitespace(ch.cp)) break;
      begin += ch.bytes;
    }
  }
  if (right) {
    while (end > begin) {
      std::size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      const Utf8Char ch = decode_utf8(text, start);
      if (start + ch.bytes != end || !is_whitespace(ch.cp)) break;
      end = start;
    }
  }
  return text.substr(begin, end - begin);
}

}  // namespace

void Normalizer::read(const json& node, const std::string& path, std::vector<Step>& steps) {
  if (node.is_null()) return;
  const std::string type = component_type(node);
  if (type == "Sequence") {
    const auto it = node.find("normalizers");
    if (it == node.end() || !it->is_array()) {
      throw ConfigError(fmt::format("{}: normalizer Sequence needs a \"normalizers\" list; got {}", path,
                                    node.dump().substr(0, 200)));
    }
    for (const json& part : *it) read(part, path, steps);
    return;
  }
  const std::pair<const char*, UnicodeForm> forms[] = {
      {"NFC", UnicodeForm::kNfc},
      {"NFD", UnicodeForm::kNfd},
      {"NFKC", UnicodeForm::kNfkc},
      {"NFKD", UnicodeForm::kNfkd}};
  for (const auto& [name, form] : forms) {
    if (type == name) {
      steps.push_back({.kind = Step::Kind::kUnicode, .form = form});
      return;
    }
  }
  if (type == "Lowercase") {
    steps.push_back({.kind = Step::Kind::kLowercase});
  } else if (type == "Replace" && node.contains("content") && node["content"].is_string()) {
    steps.push_back({.kind = Step::Kind::kReplace,
                     .pattern = TextPattern::from_json(node.value("pattern", json()), "normalizer Replace", path),
                     .text = node["content"].get<std::string>()});
  } else if (type == "Prepend" && node.contains("prepend") && node["prepend"].is_string()) {
    steps.push_back({.kind = Step::Kind::kPrepend, .text = node["prepend"].get<std::string>()});
  } else if (type == "Strip") {
    steps.push_back({.kind = Step::Kind::kStrip,
                     .left = node.value("strip_left", false),
                     .right = node.value("strip_right", false)});
  } else {
    throw ConfigError(
        fmt::format("{}: normalizer {} is not supported; supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, "
                    "Prepend, Strip and a Sequence of them",
                    path, node.dump().substr(0, 200)));
  }
}

Normalizer Normalizer::from_json(const json& node, const std::string& path) {
  Normalizer normalizer;
  read(node, path, normalizer.steps_);
  return normalizer;
}

std::string Normalizer::apply_step(const Step& step, std::string text) {
  switch (step.kind) {
    case Step::Kind::kUnicode: return unicode_form(text, step.form);
    case Step::Kind::kLowercase: return lowercase(text);
    case Step::Kind::kPrepend: return text.empty() ? text : step.text + text;
    case Step::Kind::kStrip: return strip(std::move(text), step.left, step.right);
    case Step::Kind::kReplace: return step.pattern.replace_all(text, step.text);
  }
  return text;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string out(text);
  for (const Step& step : steps_) out = apply_step(step, std::move(out));
  return out;
}

}  // namespace colossus::data
