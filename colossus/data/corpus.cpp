#include "colossus/data/corpus.h"

#include "colossus/core/errors.h"
#include "colossus/data/token_shards.h"

#include <fmt/format.h>

#include <array>
#include <filesystem>
#include <random>

namespace colossus::data {

namespace {

class ByteTokenizer : public Tokenizer {
 public:
  int32_t vocab_size() const override { return 257; }
  std::optional<int32_t> bos_id() const override { return kEos; }
  std::optional<int32_t> eos_id() const override { return kEos; }
  std::optional<int32_t> pad_id() const override { return std::nullopt; }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    if (token == "<|endoftext|>") return kEos;
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }
  std::optional<std::string> id_to_token(int32_t id) const override {
    if (id == kEos) return "<|endoftext|>";
    if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
    return std::nullopt;
  }

 protected:
  std::vector<int32_t> do_encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() + 1);
    if (add_special_tokens) ids.push_back(kEos);
    constexpr std::string_view special = "<|endoftext|>";
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.compare(i, special.size(), special) == 0) {
        ids.push_back(kEos);
        i += special.size() - 1;
      } else {
        ids.push_back(static_cast<unsigned char>(text[i]));
      }
    }
    return ids;
  }
  std::string do_decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id < 0 || id > kEos) throw ConfigError(fmt::format("token id {} is outside the byte vocabulary 0..256", id));
      if (id == kEos) {
        if (!skip_special_tokens) text += "<|endoftext|>";
      } else {
        text += static_cast<char>(id);
      }
    }
    return text;
  }

 private:
  static constexpr int32_t kEos = 256;
};

const std::array<const char*, 20> kNumbers = {"zero", "one", "two", "three", "four", "five", "six",
                                              "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen",
                                              "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
const std::vector<std::string> kNames = {"Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "June"};
const std::vector<std::string> kAnimals = {"cat", "dog", "fox", "owl", "horse", "rabbit", "bird", "mouse"};
const std::vector<std::string> kColors = {"red", "blue", "green", "yellow", "small", "old", "quiet", "happy"};
const std::vector<std::string> kPlaces = {"the garden", "the river", "the market", "the forest", "the hill",
                                          "the school", "the kitchen", "the station"};
const std::vector<std::string> kThings = {"an apple", "a book", "a red ball", "a map", "some bread", "a lamp",
                                          "a letter", "a blue cup"};
const std::vector<std::string> kVerbs = {"found", "saw", "carried", "painted", "lost", "shared", "wanted", "opened"};

class Writer {
 public:
  explicit Writer(uint64_t seed) : rng_(seed) {}
  const std::string& pick(const std::vector<std::string>& options) { return options[rng_() % options.size()]; }
  int number(int below) { return static_cast<int>(rng_() % static_cast<uint64_t>(below)); }

  std::string story() {
    const auto& name = pick(kNames);
    const auto& friend_name = pick(kNames);
    const auto& animal = pick(kAnimals);
    const auto& place = pick(kPlaces);
    const auto& thing = pick(kThings);
    std::string s = fmt::format("Once upon a time, {} lived near {} with a {} {}. ", name, place, pick(kColors), animal);
    s += fmt::format("One day {} {} {} in {}. ", name, pick(kVerbs), thing, place);
    s += fmt::format("{} asked, \"Can I see it?\" and {} said, \"Yes, you can.\" ", friend_name, name);
    s += fmt::format("Then the {} ran to {} and they all laughed. The end.", animal, pick(kPlaces));
    return s;
  }
  std::string arithmetic() {
    std::string s;
    for (int i = 0; i < 4; ++i) {
      int a = number(10), b = number(10);
      s += fmt::format("{} plus {} is {}. ", kNumbers[a], kNumbers[b], kNumbers[a + b]);
    }
    int a = number(50), b = number(50);
    s += fmt::format("{} + {} = {}.", a, b, a + b);
    return s;
  }
  std::string counting() {
    int start = number(8);
    int length = 4 + number(6);
    std::string s = "Let us count: ";
    for (int i = 0; i < length; ++i) s += fmt::format("{}{}", i ? ", " : "", kNumbers[start + i]);
    return s + ".";
  }
  std::string dialogue() {
    const auto& a = pick(kNames);
    const auto& b = pick(kNames);
    const auto& thing = pick(kThings);
    return fmt::format("{}: Where is {}?\n{}: It is in {}.\n{}: Thank you, {}.", a, thing, b, pick(kPlaces), a, b);
  }
  std::string document() {
    switch (number(4)) {
      case 0: return story();
      case 1: return arithmetic();
      case 2: return counting();
      default: return dialogue();
    }
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

std::string builtin_corpus(uint64_t seed, int64_t bytes) {
  Writer writer(seed);
  std::string text;
  text.reserve(static_cast<size_t>(bytes) + 512);
  while (static_cast<int64_t>(text.size()) < bytes) {
    text += writer.document();
    text += "\n\n";
  }
  return text;
}

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

TokenizeResult tokenize_to_shards(const std::string& text, const Tokenizer& tokenizer, const std::string& out_dir,
                                  const TokenizeOptions& options) {
  if (options.shard_tokens < 1) throw ConfigError(fmt::format("shard_tokens = {} must be positive", options.shard_tokens));
  if (options.eval_fraction < 0 || options.eval_fraction >= 1) {
    throw ConfigError(fmt::format("eval_fraction = {} must be in [0, 1)", options.eval_fraction));
  }
  auto eos = tokenizer.eos_id();
  std::vector<std::string> documents;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find("\n\n", start);
    if (end == std::string::npos) end = text.size();
    if (end > start) documents.push_back(text.substr(start, end - start));
    start = end + 2;
  }
  size_t eval_docs = static_cast<size_t>(static_cast<double>(documents.size()) * options.eval_fraction);
  TokenizeResult result;
  auto write_split = [&](size_t begin, size_t end, const std::string& split, int64_t& count,
                         std::vector<std::string>& paths) {
    auto dir = std::filesystem::path(out_dir) / split;
    std::filesystem::create_directories(dir);
    std::vector<int32_t> buffer;
    auto flush = [&] {
      if (buffer.empty()) return;
      auto path = (dir / fmt::format("{:05d}.tokens", paths.size())).string();
      write_token_shard(path, buffer, tokenizer.vocab_size());
      paths.push_back(path);
      count += static_cast<int64_t>(buffer.size());
      buffer.clear();
    };
    for (size_t d = begin; d < end; ++d) {
      auto ids = tokenizer.encode(documents[d]);
      buffer.insert(buffer.end(), ids.begin(), ids.end());
      if (eos) buffer.push_back(*eos);
      if (static_cast<int64_t>(buffer.size()) >= options.shard_tokens) flush();
    }
    flush();
  };
  write_split(0, documents.size() - eval_docs, "train", result.train_tokens, result.train_shards);
  if (eval_docs > 0) write_split(documents.size() - eval_docs, documents.size(), "eval", result.eval_tokens, result.eval_shards);
  return result;
}

}  // namespace colossus::data
