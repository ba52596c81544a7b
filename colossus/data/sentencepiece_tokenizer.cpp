#include "colossus/data/sentencepiece_tokenizer.h"

#include "colossus/data/bpe_tokenizer.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include <filesystem>

namespace colossus::data {

namespace {

std::optional<int32_t> valid_id(int id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; }

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : path_(model_path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  if (!std::filesystem::is_regular_file(model_path)) {
    throw ConfigError(fmt::format("SentencePiece model '{}' does not exist", model_path));
  }
  const auto status = processor_->Load(model_path);
  if (!status.ok()) {
    throw ConfigError(fmt::format("'{}' is not a SentencePiece model: {}", model_path, status.ToString()));
  }
  bos_id_ = valid_id(processor_->bos_id());
  eos_id_ = valid_id(processor_->eos_id());
  pad_id_ = valid_id(processor_->pad_id());
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

int32_t SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }

std::optional<int32_t> SentencePieceTokenizer::token_to_id(std::string_view token) const {
  // PieceToId answers unk_id for unknown pieces; only a round trip proves it.
  const int id = processor_->PieceToId(token);
  if (id < 0 || processor_->IdToPiece(id) != token) return std::nullopt;
  return id;
}

std::optional<std::string> SentencePieceTokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return std::nullopt;
  return processor_->IdToPiece(id);
}

std::optional<std::string> SentencePieceTokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return std::nullopt;
  if (processor_->IsControl(id)) return std::string();  // BOS/EOS/PAD: added around text, not in it
  return plain_token_text(processor_->IdToPiece(id), /*byte_level=*/false);
}

std::vector<int32_t> SentencePieceTokenizer::do_encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok()) throw ConfigError(fmt::format("{}: cannot encode text: {}", path_, status.ToString()));
  std::vector<int32_t> out;
  out.reserve(ids.size() + 1);
  if (add_special_tokens && bos_id_) out.push_back(*bos_id_);
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

std::string SentencePieceTokenizer::do_decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::string text;
  std::vector<int> run;  // ordinary pieces, decoded together so spaces come out right
  auto flush = [&] {
    if (run.empty()) return;
    std::string piece_text;
    const auto status = processor_->Decode(run, &piece_text);
    if (!status.ok()) throw ConfigError(fmt::format("{}: cannot decode ids: {}", path_, status.ToString()));
    text += piece_text;
    run.clear();
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw ConfigError(fmt::format("{}: cannot decode id {}: outside [0, {})", path_, id, vocab_size()));
    }
    if (processor_->IsControl(id)) {
      flush();
      if (!skip_special_tokens) text += processor_->IdToPiece(id);
    } else {
      run.push_back(id);
    }
  }
  flush();
  return text;
}

}  // namespace colossus::data
