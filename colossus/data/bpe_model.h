// The BPE model of a tokenizer.json: a vocabulary and ranked merges, over
// GPT-2's byte-to-unicode alphabet (byte-level BPE) or over the text's own
// chars with unknown ones as <0xNN> byte tokens (SentencePiece-style BPE), and
// the merge of one pre-token into ids (a heap of candidate pairs, O(n log n)
// in the pre-token's length) behind a word cache.
#pragma once
#include <cstdint>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace colossus::data {

// GPT-2's reversible byte -> printable code point map (as UTF-8): printable
// Latin-1 bytes map to themselves, the rest to U+0100 onwards.
const std::string& byte_to_unicode(uint8_t byte);

// The byte a code point of that alphabet stands for, or nullopt.
std::optional<uint8_t> unicode_to_byte(char32_t cp);

// A hash that also accepts string_view, so lookups need no std::string.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeModelOptions {
  // Words are raw bytes, each mapped to GPT-2's alphabet (a ByteLevel
  // pre-tokenizer ran); otherwise the symbols are the word's UTF-8 chars.
  bool byte_level = true;
  // Emit a pre-token that is itself in the vocabulary without merging (LLaMA-3).
  bool ignore_merges = false;
  // A char missing from the vocabulary becomes the <0xNN> tokens of its UTF-8
  // bytes when all of them are in the vocabulary (LLaMA-2, Gemma).
  bool byte_fallback = false;
  // Id for chars missing from the vocabulary (after byte fallback); without
  // one they are dropped, as Hugging Face does.
  std::optional<int32_t> unk_id;
  // Consecutive unknown chars give one unk_id.
  bool fuse_unk = false;
};

class BpeModel {
 public:
  // vocab maps token strings (byte-level or plain) to ids; merges are (left, right) token
  // pairs, rank = position. `source` names the file for error messages.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeModelOptions options,
           const std::string& source);

  // Appends the ids of one pre-token (raw bytes when byte_level).
  void encode_word(std::string_view word, std::vector<int32_t>& ids) const;

  const Vocab& vocab() const { return vocab_; }
  // The token string of an id of the model's vocabulary, or nullptr.
  const std::string* token(int32_t id) const;
  // One past the largest id of the model's vocabulary.
  int32_t id_end() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;
  // The symbol ids a word starts as, before merging.
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbol_ids) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;  // "" where an id is unused
  std::vector<bool> id_used_;
  int32_t byte_ids_[256];      // byte_level: id of each byte's alphabet char, -1 if absent
  int32_t fallback_ids_[256];  // byte_fallback: id of each byte's <0xNN> token, -1 if absent
  std::unordered_map<uint64_t, Merge> merges_;
  BpeModelOptions options_;

  // Words seen before; filled until full, since natural text reuses few words.
  static constexpr std::size_t kCacheCapacity = 1 << 16;
  static constexpr std::size_t kCacheMaxWordBytes = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace colossus::data
