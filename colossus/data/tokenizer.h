// The tokenizer interface every model input goes through, and load_tokenizer,
// which reads a Hugging Face tokenizer directory or file: BPE (tokenizer.json,
// byte-level or SentencePiece-style, or vocab.json + merges.txt) or
// SentencePiece (tokenizer.model).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace colossus::data {

// Text <-> token ids. Implementations are immutable after loading, so one
// tokenizer may be shared by threads (encode/decode are thread-safe).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text`. Special tokens written in the text (<|endoftext|>) are
  // always recognised; add_special_tokens also adds what the tokenizer's post
  // processor puts around a sequence (e.g. a leading BOS).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const {
    return do_encode(text, add_special_tokens);
  }
  // The text of `ids`; skip_special_tokens leaves special tokens out. Throws
  // ConfigError for an id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const {
    return do_decode(ids, skip_special_tokens);
  }

  // Number of ids: one past the largest id, added tokens included.
  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual std::optional<int32_t> pad_id() const = 0;
  // A token's id by its vocabulary string (byte-level form for BPE, the piece
  // with U+2581 for spaces for SentencePiece), or nullopt if it has none.
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<std::string> id_to_token(int32_t id) const = 0;
  // The bytes of text a token stands for (byte-level tokens as raw bytes,
  // U+2581 as a space, <0xNN> as its byte, an added token as its content),
  // or nullopt for an id with no token. token_offsets.h aligns these with
  // the encoded text. By default the token string itself.
  virtual std::optional<std::string> token_text(int32_t id) const { return id_to_token(id); }

 protected:
  virtual std::vector<int32_t> do_encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string do_decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
};

// Loads a tokenizer from `path`:
//   a directory with tokenizer.json, or vocab.json + merges.txt, or
//   tokenizer.model (SentencePiece; also chosen over a tokenizer.json whose
//   model is not BPE, e.g. Unigram);
//   or one of those files. A tokenizer_config.json beside a BPE tokenizer
//   names its bos/eos/pad tokens.
// Throws ConfigError naming the path when nothing loadable is there.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// Whether directory `dir` holds tokenizer files load_tokenizer reads
// (tokenizer.json, vocab.json + merges.txt, tokenizer.model).
bool holds_tokenizer(const std::string& dir);

}  // namespace colossus::data
