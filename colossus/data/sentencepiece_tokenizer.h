// SentencePiece tokenizers (LLaMA-2 style tokenizer.model, BPE or unigram)
// through libsentencepiece; its header stays in the .cpp.
#pragma once
#include "colossus/data/tokenizer.h"

#include <memory>
#include <string>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace colossus::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Throws ConfigError when `model_path` is missing or not a SentencePiece model.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  int32_t vocab_size() const override;
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::optional<int32_t> eos_id() const override { return eos_id_; }
  std::optional<int32_t> pad_id() const override { return pad_id_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int32_t id) const override;
  std::optional<std::string> token_text(int32_t id) const override;

 protected:
  // add_special_tokens prepends BOS (when the model has one), as LLaMA does.
  std::vector<int32_t> do_encode(std::string_view text, bool add_special_tokens) const override;
  // Control tokens (BOS/EOS/PAD) appear as their piece text unless skipped.
  std::string do_decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::optional<int32_t> pad_id_;
};

}  // namespace colossus::data
