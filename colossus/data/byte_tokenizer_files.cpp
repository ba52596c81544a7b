// save_byte_tokenizer: make_byte_tokenizer() as Hugging Face files, so a
// checkpoint trained with it loads in transformers (AutoTokenizer) and in
// load_tokenizer. It is a byte-level BPE without merges: id b is the GPT-2
// alphabet character of byte b, so every byte stays its own token whatever
// the pre-tokenizer splits; <|endoftext|> (256) is an added special token
// that add_special_tokens puts in front, as make_byte_tokenizer's encode does.
#include "colossus/core/errors.h"
#include "colossus/data/bpe_model.h"
#include "colossus/data/corpus.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace colossus::data {

namespace {

using nlohmann::json;
constexpr const char* kEndOfText = "<|endoftext|>";
constexpr int kEndOfTextId = 256;

json byte_level(bool add_prefix_space) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true}, {"use_regex", true}};
}

json special(const char* token) { return {{"SpecialToken", {{"id", token}, {"type_id", 0}}}}; }
json sequence(const char* name, int type_id) { return {{"Sequence", {{"id", name}, {"type_id", type_id}}}}; }

json tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(static_cast<uint8_t>(b))] = b;
  json added = {{"id", kEndOfTextId}, {"content", kEndOfText}, {"single_word", false}, {"lstrip", false},
                {"rstrip", false},    {"normalized", false},   {"special", true}};
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({added})},
      {"normalizer", nullptr},
      // GPT-2's regex split changes nothing without merges; ByteLevel maps bytes to the alphabet.
      {"pre_tokenizer", byte_level(false)},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({special(kEndOfText), sequence("A", 0)})},
        {"pair", json::array({special(kEndOfText), sequence("A", 0), special(kEndOfText), sequence("B", 1)})},
        {"special_tokens", {{kEndOfText, {{"id", kEndOfText}, {"ids", {kEndOfTextId}}, {"tokens", {kEndOfText}}}}}}}},
      {"decoder", byte_level(true)},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array()}}},
  };
}

json tokenizer_config_json() {
  return {
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"bos_token", kEndOfText},
      {"eos_token", kEndOfText},
      {"add_bos_token", true},
      // transformers would otherwise rewrite " ." to "." etc. when decoding.
      {"clean_up_tokenization_spaces", false},
      {"added_tokens_decoder",
       {{std::to_string(kEndOfTextId),
         {{"content", kEndOfText},
          {"lstrip", false},
          {"normalized", false},
          {"rstrip", false},
          {"single_word", false},
          {"special", true}}}}},
  };
}

// Writes through a temporary file and a rename, so a reader never sees half a file.
void write_json(const std::filesystem::path& path, const json& value) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << value.dump(2) << '\n';
    if (!out.flush()) throw CheckpointError(fmt::format("cannot write tokenizer file '{}'", tmp.string()));
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  if (error) {
    throw CheckpointError(fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), path.string(), error.message()));
  }
}

}  // namespace

void save_byte_tokenizer(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw CheckpointError(fmt::format("cannot create tokenizer directory '{}': {}", dir, error.message()));
  const std::filesystem::path base(dir);
  write_json(base / "tokenizer.json", tokenizer_json());
  write_json(base / "tokenizer_config.json", tokenizer_config_json());
  write_json(base / "special_tokens_map.json", {{"bos_token", kEndOfText}, {"eos_token", kEndOfText}});
}

}  // namespace colossus::data
