#include "colossus/data/pre_tokenizer.h"

#include "colossus/core/errors.h"
#include "colossus/data/tokenizer_json.h"
#include "colossus/data/unicode.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <utf8proc.h>

namespace colossus::data {

namespace {

using nlohmann::json;

bool flag(const json& node, const char* key, bool fallback) {
  const auto it = node.find(key);
  return it == node.end() || it->is_null() ? fallback : it->get<bool>();
}

SplitBehavior behavior_of(const json& node, const std::string& owner, const std::string& path) {
  const std::string name = node.value("behavior", "");
  if (auto behavior = split_behavior_from_name(name)) return *behavior;
  throw ConfigError(fmt::format("{}: {} behavior '{}' is not supported; expected Removed, Isolated, "
                                "MergedWithPrevious, MergedWithNext or Contiguous",
                                path, owner, name));
}

bool is_space(char32_t cp) { return char_class(cp) == CharClass::kSpace; }
bool is_number(char32_t cp) { return char_class(cp) == CharClass::kNumber; }

// tokenizers' is_punc: ASCII punctuation or a Unicode P* category.
bool is_punctuation(char32_t cp) {
  if (cp < 0x80) return (cp >= '!' && cp <= '/') || (cp >= ':' && cp <= '@') || (cp >= '[' && cp <= '`') ||
                        (cp >= '{' && cp <= '~');
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO: return true;
    default: return false;
  }
}

// Whitespace: the matches of \w+|[^\w\s]+ (runs of word chars, runs of other
// non-space chars); the whitespace between is dropped.
void split_whitespace(std::string_view text, std::vector<std::string_view>& out) {
  enum { kSpace, kWord, kOther };
  std::size_t run_start = 0;
  int run_kind = kSpace;
  for (std::size_t pos = 0; pos <= text.size();) {
    int kind = kSpace;
    uint32_t bytes = 1;
    if (pos < text.size()) {
      const Utf8Char ch = decode_utf8(text, pos);
      bytes = ch.bytes;
      kind = is_word_char(ch.cp) ? kWord : (ch.cp != kInvalidCodepoint && is_space(ch.cp)) ? kSpace : kOther;
    }
    if (kind != run_kind || pos == text.size()) {
      if (run_kind != kSpace && pos > run_start) out.push_back(text.substr(run_start, pos - run_start));
      run_start = pos;
      run_kind = kind;
    }
    pos += bytes;
  }
}

}  // namespace

void PreTokenizer::read(const json& node, const std::string& path, std::vector<Step>& steps) {
  const std::string type = component_type(node);
  if (type == "Sequence" && node.contains("pretokenizers") && node["pretokenizers"].is_array()) {
    for (const json& part : node["pretokenizers"]) read(part, path, steps);
  } else if (type == "Split") {
    const auto pattern = TextPattern::from_json(node.value("pattern", json()), "Split", path);
    Step step{.kind = Step::Kind::kSplit,
              .pattern = pattern,
              .behavior = behavior_of(node, "Split", path),
              .invert = flag(node, "invert", false)};
    // The GPT-2, LLaMA-3 and Qwen2 regexes run hand-written; any other through Oniguruma.
    const std::string* regex = pattern.regex_source();
    if (regex && step.behavior == SplitBehavior::kIsolated && !step.invert) {
      if (auto known = split_pattern_from_regex(*regex)) {
        step.kind = Step::Kind::kKnownSplit;
        step.known = *known;
      }
    }
    steps.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    steps.push_back({.kind = Step::Kind::kByteLevel,
                     .flag = flag(node, "add_prefix_space", false),
                     .use_regex = flag(node, "use_regex", true)});
  } else if (type == "Metaspace") {
    Step step{.kind = Step::Kind::kMetaspace, .flag = flag(node, "split", true)};
    step.replacement = node.value("replacement", "\u2581");
    const std::string scheme = node.value("prepend_scheme", "always");
    step.prepend = scheme == "first" ? PrependScheme::kFirst : scheme == "never" ? PrependScheme::kNever
                                                                                   : PrependScheme::kAlways;
    if (scheme != "always" && scheme != "first" && scheme != "never") {
      throw ConfigError(fmt::format("{}: Metaspace prepend_scheme '{}' is not supported; expected always, first "
                                    "or never",
                                    path, scheme));
    }
    // The legacy add_prefix_space must agree with the scheme, as tokenizers requires.
    if (node.contains("add_prefix_space") && node["add_prefix_space"].is_boolean() &&
        node["add_prefix_space"].get<bool>() != (step.prepend != PrependScheme::kNever)) {
      throw ConfigError(fmt::format("{}: Metaspace add_prefix_space {} contradicts prepend_scheme '{}'", path,
                                    node["add_prefix_space"].dump(), scheme));
    }
    if (decode_utf8(step.replacement, 0).bytes != step.replacement.size() || step.replacement.empty()) {
      throw ConfigError(fmt::format("{}: Metaspace replacement '{}' must be one character", path, step.replacement));
    }
    steps.push_back(std::move(step));
  } else if (type == "Digits") {
    steps.push_back({.kind = Step::Kind::kDigits, .flag = flag(node, "individual_digits", false)});
  } else if (type == "Punctuation") {
    steps.push_back({.kind = Step::Kind::kPunctuation,
                     .behavior = node.contains("behavior") ? behavior_of(node, "Punctuation", path)
                                                           : SplitBehavior::kIsolated});
  } else if (type == "Whitespace") {
    steps.push_back({.kind = Step::Kind::kWhitespace});
  } else if (type == "WhitespaceSplit") {
    steps.push_back({.kind = Step::Kind::kWhitespaceSplit});
  } else {
    throw ConfigError(fmt::format("{}: pre_tokenizer {} is not supported; supported: Split, ByteLevel, Metaspace, "
                                  "Digits, Punctuation, Whitespace, WhitespaceSplit and a Sequence of them",
                                  path, node.dump().substr(0, 200)));
  }
}

PreTokenizer PreTokenizer::from_json(const json& node, const std::string& path) {
  PreTokenizer pre;
  if (node.is_null()) return pre;
  read(node, path, pre.steps_);
  for (std::size_t i = 0; i < pre.steps_.size(); ++i) {
    if (pre.steps_[i].kind != Step::Kind::kByteLevel) continue;
    // Its byte-to-alphabet mapping happens in the BPE model, after every step.
    if (i + 1 != pre.steps_.size()) {
      throw ConfigError(fmt::format("{}: a ByteLevel pre_tokenizer before other pre-tokenizers is not supported; "
                                    "expected it last",
                                    path));
    }
    pre.byte_level_ = true;
  }
  return pre;
}

PreTokenizer PreTokenizer::byte_level(bool add_prefix_space) {
  PreTokenizer pre;
  pre.steps_.push_back({.kind = Step::Kind::kByteLevel, .flag = add_prefix_space, .use_regex = true});
  pre.byte_level_ = true;
  return pre;
}

void PreTokenizer::run(const Step& step, const Piece& piece, std::deque<std::string>& arena, std::vector<Piece>& out) {
  thread_local std::vector<TextMatch> matches;
  thread_local std::vector<std::string_view> parts;
  matches.clear();
  parts.clear();
  std::string_view text = piece.text;
  switch (step.kind) {
    case Step::Kind::kKnownSplit: pre_tokenize(text, step.known, parts); break;
    case Step::Kind::kSplit:
      step.pattern->find_matches(text, matches);
      split_by_matches(text, matches, step.behavior, step.invert, parts);
      break;
    case Step::Kind::kByteLevel:
      if (step.flag && !text.starts_with(' ')) text = arena.emplace_back(" " + std::string(text));
      if (step.use_regex) {
        pre_tokenize(text, SplitPattern::kGpt2, parts);
      } else {
        parts.push_back(text);
      }
      break;
    case Step::Kind::kMetaspace: {
      std::string& replaced = arena.emplace_back();
      replaced.reserve(text.size() + step.replacement.size());
      const bool prepend = step.prepend == PrependScheme::kAlways ||
                           (step.prepend == PrependScheme::kFirst && piece.at_origin);
      if (prepend && !text.starts_with(' ') && !text.starts_with(step.replacement)) replaced = step.replacement;
      for (char c : text) {
        if (c == ' ') {
          replaced += step.replacement;
        } else {
          replaced.push_back(c);
        }
      }
      text = replaced;
      if (step.flag) {
        find_literal_matches(text, step.replacement, matches);
        split_by_matches(text, matches, SplitBehavior::kMergedWithNext, false, parts);
      } else {
        parts.push_back(text);
      }
      break;
    }
    case Step::Kind::kDigits:
      find_char_matches(text, is_number, matches);
      split_by_matches(text, matches, step.flag ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false,
                       parts);
      break;
    case Step::Kind::kPunctuation:
      find_char_matches(text, is_punctuation, matches);
      split_by_matches(text, matches, step.behavior, false, parts);
      break;
    case Step::Kind::kWhitespace: split_whitespace(text, parts); break;
    case Step::Kind::kWhitespaceSplit:
      find_char_matches(text, is_space, matches);
      split_by_matches(text, matches, SplitBehavior::kRemoved, false, parts);
      break;
  }
  for (std::string_view part : parts) {
    if (!part.empty()) out.push_back({part, piece.at_origin && part.data() == text.data()});
  }
}

void PreTokenizer::split(std::string_view text, bool at_origin, std::deque<std::string>& arena,
                         std::vector<std::string_view>& words) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    words.push_back(text);
    return;
  }
  thread_local std::vector<Piece> current, next;
  current.assign(1, Piece{text, at_origin});
  for (const Step& step : steps_) {
    next.clear();
    for (const Piece& piece : current) run(step, piece, arena, next);
    std::swap(current, next);
  }
  for (const Piece& piece : current) words.push_back(piece.text);
}

}  // namespace colossus::data
