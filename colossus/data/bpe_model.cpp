#include "colossus/data/bpe_model.h"

#include "colossus/core/errors.h"
#include "colossus/data/unicode.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <utility>

namespace colossus::data {

namespace {

struct ByteAlphabet {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 324> cp_to_byte;  // every mapped code point is below U+0144

  ByteAlphabet() {
    cp_to_byte.fill(-1);
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next_extra++);
      append_utf8(cp, byte_to_utf8[b]);
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet table;
  return table;
}

// One symbol of a word being merged: a doubly linked list over an array, so a
// merge unlinks the right symbol in O(1).
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
};

// Heap order: lowest rank first, then leftmost, as Hugging Face's BPE pops.
bool later(const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; }

}  // namespace

const std::string& byte_to_unicode(uint8_t byte) { return alphabet().byte_to_utf8[byte]; }

std::optional<uint8_t> unicode_to_byte(char32_t cp) {
  if (cp >= alphabet().cp_to_byte.size() || alphabet().cp_to_byte[cp] < 0) return std::nullopt;
  return static_cast<uint8_t>(alphabet().cp_to_byte[cp]);
}

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeModelOptions options,
                   const std::string& source)
    : vocab_(std::move(vocab)), options_(options) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    if (id < 0) throw ConfigError(fmt::format("{}: token '{}' has id {}; ids must be >= 0", source, token, id));
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<std::size_t>(max_id + 1));
  id_used_.assign(id_to_token_.size(), false);
  for (const auto& [token, id] : vocab_) {
    if (id_used_[id]) {
      throw ConfigError(fmt::format("{}: id {} is given to both '{}' and '{}'; each id needs one token", source, id,
                                    id_to_token_[id], token));
    }
    id_to_token_[id] = token;
    id_used_[id] = true;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_to_unicode(static_cast<uint8_t>(b)));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    auto fallback = vocab_.find(fmt::format("<0x{:02X}>", b));
    fallback_ids_[b] = fallback == vocab_.end() ? -1 : fallback->second;
  }
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = vocab_.find(left);
    auto r = vocab_.find(right);
    auto merged = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || merged == vocab_.end()) {
      throw ConfigError(
          fmt::format("{}: merge {} '{} {}' uses a token missing from the vocabulary", source, rank, left, right));
    }
    // A repeated pair keeps its first (lowest) rank.
    merges_.try_emplace(pair_key(l->second, r->second), Merge{static_cast<int32_t>(rank), merged->second});
  }
}

const std::string* BpeModel::token(int32_t id) const {
  if (id < 0 || id >= id_end() || !id_used_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = ids.size();
  merge_word(word, ids);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) {
      cache_.try_emplace(std::string(word), ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end());
    }
  }
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& symbol_ids) const {
  // As tokenizers' BPE::merge_word: an unknown char waits as a pending unk
  // (fused with the next unknown one under fuse_unk) that the next known
  // char flushes; byte-fallback tokens do not flush it.
  std::optional<int32_t> pending_unk;
  std::size_t pos = 0;
  while (pos < word.size()) {
    std::size_t length = 1;
    int32_t id = -1;
    if (options_.byte_level) {
      id = byte_ids_[static_cast<uint8_t>(word[pos])];
    } else {
      length = decode_utf8(word, pos).bytes;
      if (auto it = vocab_.find(word.substr(pos, length)); it != vocab_.end()) id = it->second;
    }
    const std::string_view unit = word.substr(pos, length);
    pos += length;
    if (id >= 0) {
      if (pending_unk) symbol_ids.push_back(*std::exchange(pending_unk, std::nullopt));
      symbol_ids.push_back(id);
      continue;
    }
    if (options_.byte_fallback) {
      // The <0xNN> tokens of the unit as the vocabulary spells it.
      const std::string spelled =
          options_.byte_level ? byte_to_unicode(static_cast<uint8_t>(unit[0])) : std::string(unit);
      const bool all_known = std::all_of(spelled.begin(), spelled.end(),
                                         [&](char c) { return fallback_ids_[static_cast<uint8_t>(c)] >= 0; });
      if (all_known) {
        for (char c : spelled) symbol_ids.push_back(fallback_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (!options_.unk_id) continue;
    if (pending_unk && !options_.fuse_unk) symbol_ids.push_back(*pending_unk);
    pending_unk = options_.unk_id;
  }
  if (pending_unk) symbol_ids.push_back(*pending_unk);
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  if (options_.ignore_merges) {
    std::string mapped;
    if (options_.byte_level) {
      for (char c : word) mapped += byte_to_unicode(static_cast<uint8_t>(c));
    }
    if (auto it = vocab_.find(options_.byte_level ? std::string_view(mapped) : word); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  thread_local std::vector<int32_t> symbol_ids;
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbol_ids.clear();
  symbols.clear();
  heap.clear();
  initial_symbols(word, symbol_ids);
  for (int32_t id : symbol_ids) {
    const auto pos = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, pos - 1, pos + 1, true});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  auto push_pair = [&](int32_t pos) {
    const Symbol& s = symbols[pos];
    if (s.next < 0) return;
    auto it = merges_.find(pair_key(s.id, symbols[s.next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, it->second.new_id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push_pair(pos);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& s = symbols[top.pos];
    if (!s.alive || s.next < 0) continue;
    // Entries go stale when a neighbour merged first; the pair there now must
    // still produce this entry's token.
    auto it = merges_.find(pair_key(s.id, symbols[s.next].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    Symbol& right = symbols[s.next];
    s.id = top.new_id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) symbols[s.next].prev = top.pos;
    if (s.prev >= 0) push_pair(s.prev);
    push_pair(top.pos);
  }
  for (int32_t pos = 0; pos >= 0; pos = symbols[pos].next) ids.push_back(symbols[pos].id);
}

}  // namespace colossus::data
