// Readers for the Hugging Face files that describe a BPE tokenizer:
// tokenizer.json (byte-level or SentencePiece-style), GPT-2's vocab.json +
// merges.txt, and the special token names in tokenizer_config.json. Anything
// outside what BpeTokenizer implements is refused with a ConfigError, never ignored.
#pragma once
#include "colossus/data/bpe_tokenizer.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace colossus::data {

// Parses a JSON file; ConfigError names the file when it is missing or malformed.
nlohmann::json read_json_file(const std::string& path);

// Whether a parsed tokenizer.json's model is BPE (not e.g. Unigram or WordPiece).
bool is_bpe_tokenizer_json(const nlohmann::json& json);

BpeTokenizerConfig read_hf_tokenizer_json(const nlohmann::json& json, const std::string& path);

// GPT-2 layout: <|endoftext|>, when in the vocabulary, is the special bos/eos
// token, as in transformers' GPT2Tokenizer.
BpeTokenizerConfig read_gpt2_vocab_merges(const std::string& vocab_path, const std::string& merges_path);

// One special-token entry of tokenizer_config.json: `given` when the key is
// there; `name` is nullopt when it is there as null (no such token).
struct ConfiguredToken {
  bool given = false;
  std::optional<std::string> name;
};

struct SpecialTokenNames {
  ConfiguredToken bos;
  ConfiguredToken eos;
  ConfiguredToken pad;
};

// bos_token/eos_token/pad_token of a tokenizer_config.json (a string,
// {"content": ...} or null).
SpecialTokenNames read_tokenizer_config(const std::string& path);

}  // namespace colossus::data
