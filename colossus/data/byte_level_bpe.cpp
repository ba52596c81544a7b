#include "colossus/data/byte_level_bpe.h"

#include "colossus/core/errors.h"
#include "colossus/data/unicode.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <iterator>

namespace colossus::data {

namespace {

BpeModel make_model(ByteLevelBpeConfig& config) {
  BpeModelOptions options{.ignore_merges = config.ignore_merges, .unk_id = std::nullopt};
  if (config.unk_token) {
    auto it = config.vocab.find(*config.unk_token);
    if (it == config.vocab.end()) {
      throw ConfigError(fmt::format("{}: unk_token '{}' is not in the vocabulary", config.source, *config.unk_token));
    }
    options.unk_id = it->second;
  }
  return BpeModel(std::move(config.vocab), config.merges, options, config.source);
}

std::vector<AddedToken> select_added(const std::vector<AddedToken>& tokens, bool normalized) {
  std::vector<AddedToken> out;
  std::copy_if(tokens.begin(), tokens.end(), std::back_inserter(out),
               [&](const AddedToken& t) { return t.normalized == normalized; });
  return out;
}

// ByteLevel decoding of one token: each char back to its byte. A token with a
// char outside the byte alphabet (an added token like "<a b>") is taken as
// written, as Hugging Face's ByteLevel decoder does.
void append_token_bytes(const std::string& token, std::string& out) {
  const std::size_t start = out.size();
  std::size_t pos = 0;
  while (pos < token.size()) {
    const Utf8Char ch = decode_utf8(token, pos);
    const auto byte = unicode_to_byte(ch.cp);
    if (!byte) {
      out.resize(start);
      out += token;
      return;
    }
    out.push_back(static_cast<char>(*byte));
    pos += ch.bytes;
  }
}

}  // namespace

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(ByteLevelBpeConfig config)
    : source_(config.source),
      model_(make_model(config)),
      normalizer_(config.normalizer),
      pattern_(config.pattern),
      splitter_(config.split_regex ? std::make_shared<const RegexSplitter>(*config.split_regex) : nullptr),
      add_prefix_space_(config.add_prefix_space),
      prefix_ids_(config.prefix_ids),
      suffix_ids_(config.suffix_ids),
      raw_matcher_(select_added(config.added_tokens, false)),
      normalized_matcher_(select_added(config.added_tokens, true)) {
  vocab_size_ = model_.id_end();
  for (const auto& token : config.added_tokens) {
    if (token.id < 0)
      throw ConfigError(fmt::format("{}: added token '{}' has id {}", source_, token.content, token.id));
    added_by_id_[token.id] = token;
    added_by_content_[token.content] = token.id;
    vocab_size_ = std::max(vocab_size_, token.id + 1);
  }
  for (const auto* ids : {&prefix_ids_, &suffix_ids_}) {
    for (int32_t id : *ids) {
      if (!id_to_token(id))
        throw ConfigError(fmt::format("{}: post processor adds id {}, which has no token", source_, id));
    }
  }
  bos_id_ = named_token_id(config.bos_token, "bos_token");
  eos_id_ = named_token_id(config.eos_token, "eos_token");
  pad_id_ = named_token_id(config.pad_token, "pad_token");
}

std::optional<int32_t> ByteLevelBpeTokenizer::named_token_id(const std::optional<std::string>& name,
                                                             const char* role) const {
  if (!name) return std::nullopt;
  auto id = token_to_id(*name);
  if (!id) throw ConfigError(fmt::format("{}: {} '{}' is not a token of this tokenizer", source_, role, *name));
  return id;
}

std::optional<int32_t> ByteLevelBpeTokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_by_content_.find(token); it != added_by_content_.end()) return it->second;
  if (auto it = model_.vocab().find(token); it != model_.vocab().end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> ByteLevelBpeTokenizer::id_to_token(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return it->second.content;
  if (const std::string* token = model_.token(id)) return *token;
  return std::nullopt;
}

void ByteLevelBpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
  thread_local std::vector<std::string_view> words;
  words.clear();
  std::string prefixed;
  if (add_prefix_space_ && !text.empty() && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  if (splitter_) {
    splitter_->split(text, words);
  } else {
    pre_tokenize(text, pattern_, words);
  }
  for (std::string_view word : words) model_.encode_word(word, ids);
}

std::vector<int32_t> ByteLevelBpeTokenizer::do_encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  std::vector<TextSegment> raw_segments;
  raw_matcher_.split(text, raw_segments);
  std::vector<TextSegment> segments;
  std::deque<std::string> normalized;  // owns the text normalized segments view
  for (const TextSegment& raw : raw_segments) {
    if (raw.id >= 0) {
      segments.push_back(raw);
      continue;
    }
    std::string_view text = raw.text;
    if (!normalizer_.empty()) text = normalized.emplace_back(normalizer_.apply(text));
    if (normalized_matcher_.empty()) {
      segments.push_back(TextSegment{.text = text, .id = -1});
    } else {
      normalized_matcher_.split(text, segments);
    }
  }
  for (const TextSegment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
    } else {
      encode_plain(segment.text, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string ByteLevelBpeTokenizer::do_decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      if (skip_special_tokens && it->second.special) continue;
      append_token_bytes(it->second.content, bytes);
    } else if (const std::string* token = model_.token(id)) {
      append_token_bytes(*token, bytes);
    } else {
      throw ConfigError(
          fmt::format("{}: cannot decode id {}: it is not a token (vocab_size {})", source_, id, vocab_size_));
    }
  }
  return utf8_lossy(bytes);
}

}  // namespace colossus::data
