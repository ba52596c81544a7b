#include "colossus/data/tokenizer.h"

#include "colossus/core/errors.h"
#include "colossus/data/bpe_tokenizer.h"
#include "colossus/data/hf_bpe_files.h"
#include "colossus/data/sentencepiece_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace colossus::data {

namespace {

namespace fs = std::filesystem;

std::optional<std::string> token_of_id(const BpeTokenizerConfig& config, int32_t id) {
  for (const auto& token : config.added_tokens) {
    if (token.id == id) return token.content;
  }
  for (const auto& [token, token_id] : config.vocab) {
    if (token_id == id) return token;
  }
  return std::nullopt;
}

// bos/eos/pad: tokenizer_config.json beside the files wins; without one, the
// post processor's first and last added ids, then GPT-2's <|endoftext|>.
void name_special_tokens(BpeTokenizerConfig& config, const fs::path& dir) {
  const bool has_endoftext = config.vocab.contains("<|endoftext|>") ||
                             std::any_of(config.added_tokens.begin(), config.added_tokens.end(),
                                         [](const AddedToken& t) { return t.content == "<|endoftext|>"; });
  if (!config.bos_token && !config.prefix_ids.empty())
    config.bos_token = token_of_id(config, config.prefix_ids.front());
  if (!config.eos_token && !config.suffix_ids.empty()) config.eos_token = token_of_id(config, config.suffix_ids.back());
  if (has_endoftext) {
    if (!config.bos_token) config.bos_token = "<|endoftext|>";
    if (!config.eos_token) config.eos_token = "<|endoftext|>";
  }
  const fs::path config_path = dir / "tokenizer_config.json";
  if (!fs::is_regular_file(config_path)) return;
  const SpecialTokenNames names = read_tokenizer_config(config_path.string());
  if (names.bos.given) config.bos_token = names.bos.name;
  if (names.eos.given) config.eos_token = names.eos.name;
  if (names.pad.given) config.pad_token = names.pad.name;
}

std::unique_ptr<Tokenizer> from_tokenizer_json(const fs::path& file) {
  const nlohmann::json json = read_json_file(file.string());
  BpeTokenizerConfig config = read_hf_tokenizer_json(json, file.string());
  name_special_tokens(config, file.parent_path());
  return std::make_unique<BpeTokenizer>(std::move(config));
}

std::unique_ptr<Tokenizer> from_vocab_merges(const fs::path& vocab, const fs::path& merges) {
  BpeTokenizerConfig config = read_gpt2_vocab_merges(vocab.string(), merges.string());
  name_special_tokens(config, vocab.parent_path());
  // transformers treats the named special tokens of a GPT-2 directory as
  // added tokens, so they are matched whole in text.
  for (const auto* name : {&config.bos_token, &config.eos_token, &config.pad_token}) {
    if (!*name) continue;
    auto it = config.vocab.find(**name);
    const bool added = std::any_of(config.added_tokens.begin(), config.added_tokens.end(),
                                   [&](const AddedToken& t) { return t.content == **name; });
    if (it != config.vocab.end() && !added)
      config.added_tokens.push_back({.content = it->first, .id = it->second, .special = true});
  }
  return std::make_unique<BpeTokenizer>(std::move(config));
}

std::unique_ptr<Tokenizer> from_directory(const fs::path& dir) {
  const fs::path json = dir / "tokenizer.json";
  const fs::path model = dir / "tokenizer.model";
  const fs::path vocab = dir / "vocab.json";
  const fs::path merges = dir / "merges.txt";
  if (fs::is_regular_file(json)) {
    // tokenizer.json is what transformers' fast tokenizers run; a model other
    // than BPE (Unigram) falls back to the SentencePiece model beside it.
    if (fs::is_regular_file(model) && !is_bpe_tokenizer_json(read_json_file(json.string()))) {
      return std::make_unique<SentencePieceTokenizer>(model.string());
    }
    return from_tokenizer_json(json);
  }
  if (fs::is_regular_file(vocab) && fs::is_regular_file(merges)) return from_vocab_merges(vocab, merges);
  if (fs::is_regular_file(model)) return std::make_unique<SentencePieceTokenizer>(model.string());
  throw ConfigError(
      fmt::format("tokenizer directory '{}' has none of tokenizer.json, vocab.json + merges.txt, "
                  "tokenizer.model",
                  dir.string()));
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const fs::path p(path);
  std::error_code error;
  if (!fs::exists(p, error)) {
    throw ConfigError(
        fmt::format("tokenizer path '{}' does not exist; expected a directory with tokenizer.json, "
                    "vocab.json + merges.txt or tokenizer.model, or one of those files",
                    path));
  }
  if (fs::is_directory(p)) return from_directory(p);
  const std::string name = p.filename().string();
  const std::string ext = p.extension().string();
  if (ext == ".model") return std::make_unique<SentencePieceTokenizer>(path);
  if (name == "vocab.json" || name == "merges.txt") {
    const fs::path vocab = p.parent_path() / "vocab.json";
    const fs::path merges = p.parent_path() / "merges.txt";
    if (!fs::is_regular_file(vocab) || !fs::is_regular_file(merges)) {
      throw ConfigError(fmt::format("'{}' needs both vocab.json and merges.txt in {}", path, p.parent_path().string()));
    }
    return from_vocab_merges(vocab, merges);
  }
  if (ext == ".json") return from_tokenizer_json(p);
  throw ConfigError(
      fmt::format("tokenizer file '{}' has an unknown kind; expected tokenizer.json (or another .json "
                  "in that format), vocab.json, merges.txt or a SentencePiece .model",
                  path));
}

bool holds_tokenizer(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "vocab.json", "tokenizer.model"}) {
    if (std::filesystem::is_regular_file(std::filesystem::path(dir) / name)) return true;
  }
  return false;
}

}  // namespace colossus::data
