#include "colossus/data/bpe_tokenizer.h"

#include "colossus/core/errors.h"
#include "colossus/data/unicode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <deque>

namespace colossus::data {

namespace {

BpeModel make_model(BpeTokenizerConfig& config) {
  BpeModelOptions options{.byte_level = config.pre_tokenizer.byte_level(),
                          .ignore_merges = config.ignore_merges,
                          .byte_fallback = config.byte_fallback,
                          .unk_id = std::nullopt,
                          .fuse_unk = config.fuse_unk};
  if (config.unk_token) {
    auto it = config.vocab.find(*config.unk_token);
    if (it == config.vocab.end()) {
      throw ConfigError(fmt::format("{}: unk_token '{}' is not in the vocabulary", config.source, *config.unk_token));
    }
    options.unk_id = it->second;
  }
  return BpeModel(std::move(config.vocab), config.merges, options, config.source);
}

// The added tokens matched on the raw text (normalized false), or those
// matched after the normalizer, whose content is normalized too, as
// tokenizers' AddedVocabulary does.
std::vector<AddedToken> select_added(const std::vector<AddedToken>& tokens, bool normalized,
                                     const Normalizer& normalizer) {
  std::vector<AddedToken> out;
  for (const AddedToken& token : tokens) {
    if (token.normalized != normalized) continue;
    out.push_back(token);
    if (normalized) out.back().content = normalizer.apply(token.content);
  }
  return out;
}

}  // namespace

std::string plain_token_text(std::string_view token, bool byte_level) {
  std::string text;
  if (byte_level) {  // each char of GPT-2's alphabet is one byte
    for (size_t pos = 0; pos < token.size();) {
      const Utf8Char c = decode_utf8(token, pos);
      const std::optional<uint8_t> byte = unicode_to_byte(c.cp);
      if (!byte) return std::string(token);  // not of the alphabet (a user-defined piece): as written
      text.push_back(static_cast<char>(*byte));
      pos += c.bytes;
    }
    return text;
  }
  // SentencePiece style: <0xNN> is a byte, U+2581 a space.
  if (token.size() == 6 && token.starts_with("<0x") && token.ends_with('>')) {
    unsigned value = 0;
    if (std::sscanf(std::string(token.substr(3, 2)).c_str(), "%2x", &value) == 1) return std::string(1, static_cast<char>(value));
  }
  static constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581
  for (size_t pos = 0; pos < token.size();) {
    if (token.compare(pos, kSpace.size(), kSpace) == 0) {
      text.push_back(' ');
      pos += kSpace.size();
    } else {
      text.push_back(token[pos++]);
    }
  }
  return text;
}

BpeTokenizer::BpeTokenizer(BpeTokenizerConfig config)
    : source_(config.source),
      model_(make_model(config)),
      normalizer_(config.normalizer),
      pre_tokenizer_(config.pre_tokenizer),
      decoder_(config.decoder),
      prefix_ids_(config.prefix_ids),
      suffix_ids_(config.suffix_ids),
      raw_matcher_(select_added(config.added_tokens, false, config.normalizer)),
      normalized_matcher_(select_added(config.added_tokens, true, config.normalizer)) {
  vocab_size_ = model_.id_end();
  for (const auto& token : config.added_tokens) {
    if (token.id < 0)
      throw ConfigError(fmt::format("{}: added token '{}' has id {}", source_, token.content, token.id));
    // Like tokenizers, a normalized token decodes (and id_to_token gives) its
    // normalized content, while token_to_id takes the content as written.
    AddedToken& by_id = added_by_id_[token.id] = token;
    if (token.normalized) by_id.content = normalizer_.apply(token.content);
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

std::optional<int32_t> BpeTokenizer::named_token_id(const std::optional<std::string>& name, const char* role) const {
  if (!name) return std::nullopt;
  auto id = token_to_id(*name);
  if (!id) throw ConfigError(fmt::format("{}: {} '{}' is not a token of this tokenizer", source_, role, *name));
  return id;
}

std::optional<int32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_by_content_.find(token); it != added_by_content_.end()) return it->second;
  if (auto it = model_.vocab().find(token); it != model_.vocab().end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> BpeTokenizer::id_to_token(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return it->second.content;
  if (const std::string* token = model_.token(id)) return *token;
  return std::nullopt;
}

std::optional<std::string> BpeTokenizer::token_text(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return it->second.content;
  const std::string* token = model_.token(id);
  if (!token) return std::nullopt;
  return plain_token_text(*token, pre_tokenizer_.byte_level());
}

void BpeTokenizer::encode_plain(std::string_view text, bool at_origin, std::vector<int32_t>& ids) const {
  thread_local std::vector<std::string_view> words;
  thread_local std::deque<std::string> arena;  // text the pre-tokenizer rewrote, viewed by words
  words.clear();
  arena.clear();
  pre_tokenizer_.split(text, at_origin, arena, words);
  for (std::string_view word : words) model_.encode_word(word, ids);
}

std::vector<int32_t> BpeTokenizer::do_encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());
  std::vector<TextSegment> raw_segments;
  raw_matcher_.split(text, raw_segments);
  std::vector<TextSegment> segments;
  for (const TextSegment& raw : raw_segments) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const bool at_origin = raw.text.data() == text.data();
    std::string normalized;
    std::string_view piece = raw.text;
    if (!normalizer_.empty()) piece = normalized = normalizer_.apply(piece);
    if (normalized_matcher_.empty()) {
      encode_plain(piece, at_origin, ids);
      continue;
    }
    segments.clear();
    normalized_matcher_.split(piece, segments);
    for (const TextSegment& segment : segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
      } else {
        encode_plain(segment.text, at_origin && segment.text.data() == piece.data(), ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string BpeTokenizer::do_decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      if (skip_special_tokens && it->second.special) continue;
      tokens.push_back(it->second.content);
    } else if (const std::string* token = model_.token(id)) {
      tokens.push_back(*token);
    } else {
      throw ConfigError(
          fmt::format("{}: cannot decode id {}: it is not a token (vocab_size {})", source_, id, vocab_size_));
    }
  }
  return decoder_.decode(std::move(tokens));
}

}  // namespace colossus::data
