// Readers for the Hugging Face files that describe a byte-level BPE
// tokenizer: tokenizer.json, GPT-2's vocab.json + merges.txt, and the special
// token names in tokenizer_config.json. Anything outside what
// ByteLevelBpeTokenizer implements is refused with a ConfigError, never ignored.
#pragma once
#include "colossus/data/byte_level_bpe.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace colossus::data {

// Parses a JSON file; ConfigError names the file when it is missing or malformed.
nlohmann::json read_json_file(const std::string& path);

// Whether a parsed tokenizer.json uses byte-level BPE (a ByteLevel pre-tokenizer
// or decoder), as opposed to e.g. LLaMA-2's SentencePiece-style BPE.
bool is_byte_level_tokenizer_json(const nlohmann::json& json);

ByteLevelBpeConfig read_hf_tokenizer_json(const nlohmann::json& json, const std::string& path);

// GPT-2 layout: <|endoftext|>, when in the vocabulary, is the special bos/eos
// token, as in transformers' GPT2Tokenizer.
ByteLevelBpeConfig read_gpt2_vocab_merges(const std::string& vocab_path, const std::string& merges_path);

struct SpecialTokenNames {
  std::optional<std::string> bos;
  std::optional<std::string> eos;
  std::optional<std::string> pad;
};

// bos_token/eos_token/pad_token of a tokenizer_config.json (string or
// {"content": ...}); unset fields stay nullopt.
SpecialTokenNames read_tokenizer_config(const std::string& path);

}  // namespace colossus::data
