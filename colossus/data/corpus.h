// Corpora: the built-in one (generated, so the demo needs no download), a
// byte-level tokenizer that needs no vocabulary file, and tokenizing text files
// into token shards.
#pragma once
#include "colossus/data/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace colossus::data {

// Deterministic English-like text: short stories built from a small grammar,
// counting, arithmetic facts and dialogue, so a small model's loss falls
// visibly within minutes and its samples show the structure. About `bytes`
// long; documents are separated by blank lines.
std::string builtin_corpus(uint64_t seed, int64_t bytes);

// Ids 0..255 are the bytes of UTF-8 text; 256 is <|endoftext|> (eos and bos).
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Writes make_byte_tokenizer() as Hugging Face files into `dir` (created if
// missing): tokenizer.json (byte-level BPE without merges, <|endoftext|> = 256
// as an added special token), tokenizer_config.json and special_tokens_map.json,
// which load_tokenizer and transformers' AutoTokenizer read back as the same
// tokenizer. Throws CheckpointError when the files cannot be written.
void save_byte_tokenizer(const std::string& dir);

struct TokenizeOptions {
  int64_t shard_tokens = int64_t{1} << 26;  // tokens per shard file
  double eval_fraction = 0.0;               // last fraction of documents to a separate "eval" directory
};

struct TokenizeResult {
  int64_t train_tokens = 0;
  int64_t eval_tokens = 0;
  std::vector<std::string> train_shards;
  std::vector<std::string> eval_shards;
};

// Splits `text` into documents at blank lines, encodes each with an eos after
// it, and writes out_dir/train/*.tokens (and out_dir/eval/*.tokens).
TokenizeResult tokenize_to_shards(const std::string& text, const Tokenizer& tokenizer, const std::string& out_dir,
                                  const TokenizeOptions& options = {});

}  // namespace colossus::data
