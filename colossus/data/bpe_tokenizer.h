// The BPE tokenizer of a tokenizer.json, byte-level (GPT-2, LLaMA-3, Qwen2) or
// SentencePiece-style with byte fallback (LLaMA-2, Mistral, Gemma, Phi-3):
// added tokens cut out first, then the normalizer, the normalized added
// tokens, the pre-tokenizer, the BPE merges, the post processor's ids; decode
// through the decoder. Built from a BpeTokenizerConfig, which hf_bpe_files.h reads.
#pragma once
#include "colossus/data/added_tokens.h"
#include "colossus/data/bpe_model.h"
#include "colossus/data/decoder.h"
#include "colossus/data/normalizer.h"
#include "colossus/data/pre_tokenizer.h"
#include "colossus/data/tokenizer.h"

#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace colossus::data {

struct BpeTokenizerConfig {
  Vocab vocab;                                              // token string -> id
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::vector<AddedToken> added_tokens;
  Normalizer normalizer;  // on the text between raw-matched added tokens
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  // What add_special_tokens puts before and after a sequence (post processor).
  std::vector<int32_t> prefix_ids;
  std::vector<int32_t> suffix_ids;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::string source;  // the file(s) it came from, for messages
};

// What a vocabulary token stands for in text: GPT-2's alphabet back to raw
// bytes (byte_level), else <0xNN> as its byte and U+2581 as a space.
std::string plain_token_text(std::string_view token, bool byte_level);

class BpeTokenizer final : public Tokenizer {
 public:
  // Throws ConfigError when the config is inconsistent (a named special token
  // that is not in the vocabulary, merges over missing tokens).
  explicit BpeTokenizer(BpeTokenizerConfig config);

  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::optional<int32_t> eos_id() const override { return eos_id_; }
  std::optional<int32_t> pad_id() const override { return pad_id_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int32_t id) const override;
  std::optional<std::string> token_text(int32_t id) const override;

 protected:
  std::vector<int32_t> do_encode(std::string_view text, bool add_special_tokens) const override;
  std::string do_decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;

 private:
  std::optional<int32_t> named_token_id(const std::optional<std::string>& name, const char* role) const;
  // `at_origin`: the text starts at offset 0 of the input.
  void encode_plain(std::string_view text, bool at_origin, std::vector<int32_t>& ids) const;

  std::string source_;
  BpeModel model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Decoder decoder_;
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;
  // Matched on the raw text, then (normalized tokens, their content
  // normalized too) on what is left.
  AddedTokenMatcher raw_matcher_;
  AddedTokenMatcher normalized_matcher_;
  std::unordered_map<int32_t, AddedToken> added_by_id_;
  Vocab added_by_content_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::optional<int32_t> pad_id_;
};

}  // namespace colossus::data
