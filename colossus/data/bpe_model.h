// The byte-level BPE model: GPT-2's byte-to-unicode alphabet, a vocabulary and
// ranked merges over it, and the merge of one pre-token into ids (a heap of
// candidate pairs, O(n log n) in the pre-token's length) behind a word cache.
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
  // Emit a pre-token that is itself in the vocabulary without merging (LLaMA-3).
  bool ignore_merges = false;
  // Id for bytes missing from the vocabulary; without one they are dropped,
  // as Hugging Face does.
  std::optional<int32_t> unk_id;
};

class BpeModel {
 public:
  // vocab maps byte-level token strings to ids; merges are (left, right) token
  // pairs, rank = position. `source` names the file for error messages.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeModelOptions options,
           const std::string& source);

  // Appends the ids of one pre-token, given as raw bytes.
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

  Vocab vocab_;
  std::vector<std::string> id_to_token_;  // "" where an id is unused
  std::vector<bool> id_used_;
  int32_t byte_ids_[256];  // id of each single byte's token, -1 if absent
  std::unordered_map<uint64_t, Merge> merges_;
  BpeModelOptions options_;

  // Words seen before; filled until full, since natural text reuses few words.
  static constexpr std::size_t kCacheCapacity = 1 << 16;
  static constexpr std::size_t kCacheMaxWordBytes = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace colossus::data
