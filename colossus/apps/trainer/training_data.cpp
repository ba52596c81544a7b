#include "colossus/apps/trainer/training_data.h"

#include "colossus/checkpoint/file_io.h"
#include "colossus/core/errors.h"
#include "colossus/data/corpus.h"
#include "colossus/data/unicode.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace colossus::apps {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("data.source: cannot read {}", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text of data.source: the generated corpus, one file, or every *.txt of a
// directory (sorted, separated by blank lines so documents never merge).
// A text source is plain UTF-8 text: a dataset file (records, tensors) or a
// binary read as text would train on its markup or bytes without a word.
std::string read_text_source(const fs::path& path) {
  static const std::set<std::string> datasets = {".jsonl", ".json", ".parquet", ".arrow", ".csv", ".safetensors",
                                                 ".bin", ".pt", ".gz", ".zip", ".tar"};
  if (datasets.contains(path.extension().string())) {
    throw ConfigError(fmt::format("data.source = '{}' is a {} file, not plain text; give a .txt file, a folder of "
                                  ".txt files or token shards (pretraining reads raw text)",
                                  path.string(), path.extension().string()));
  }
  std::string text = read_file(path);
  for (size_t pos = 0; pos < text.size();) {
    const data::Utf8Char ch = data::decode_utf8(text, pos);
    if (ch.cp == data::kInvalidCodepoint || ch.cp == 0) {
      throw ConfigError(fmt::format("data.source file '{}' is not UTF-8 text: byte {:#04x} at offset {} {}; give plain "
                                    "text (a binary file cannot be trained on as text)",
                                    path.string(), static_cast<unsigned char>(text[pos]), pos,
                                    ch.cp == 0 ? "is a NUL" : "starts no valid character"));
    }
    pos += ch.bytes;
  }
  return text;
}

std::string corpus_text(const DataSection& data) {
  if (data.source == "builtin") return data::builtin_corpus(/*seed=*/0, data.builtin_bytes);
  const fs::path source(data.source);
  if (fs::is_regular_file(source)) return read_text_source(source);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(source)) {
    if (entry.is_regular_file() && entry.path().extension() == ".txt") files.push_back(entry.path());
  }
  if (files.empty()) {
    throw ConfigError(fmt::format("data.source = '{}' holds no *.txt files and no *.tokens shards; point it at a "
                                  "text file, a directory of .txt files, token shards, or use 'builtin'",
                                  data.source));
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) text += read_text_source(f) + "\n\n";
  return text;
}

bool holds_files_ending(const fs::path& dir, const std::string& extension) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == extension) return true;
  }
  return false;
}

// Not data::list_token_shards, which throws for a folder without shards (a folder of .txt files).
bool has_token_shards(const fs::path& dir) { return fs::is_directory(dir) && holds_files_ending(dir, ".tokens"); }

// JSONL records (a .jsonl file or glob, or a folder of them and no text) are
// post-training data; pretraining reads raw text, and reading records as text
// would train on their JSON markup. Checked on every rank before any reading.
void refuse_jsonl_source(const DataSection& data) {
  const fs::path source(data.source);
  std::error_code ec;
  const bool jsonl = source.extension() == ".jsonl" ||
                     (fs::is_directory(source, ec) && holds_files_ending(source, ".jsonl") &&
                      !holds_files_ending(source, ".txt") && !has_token_shards(source) &&
                      !has_token_shards(source / "train"));
  if (!jsonl) return;
  throw ConfigError(fmt::format("data.source = '{}' is JSONL records, which pretraining does not read (it reads raw "
                                "text and would train on the JSON markup); to pretrain on their text, tokenize it with "
                                "`colossus data prepare {} --tokenizer TOKENIZER --output SHARDS` and set data.source = "
                                "SHARDS; to fine-tune on them, set train.task = \"sft\"",
                                data.source, data.source));
}

std::string stamp_of(const DataSection& data, int64_t vocab_size) {
  nlohmann::json j{{"source", data.source},
                   {"tokenizer", data.tokenizer},
                   {"vocab_size", vocab_size},
                   {"eval_fraction", data.eval_fraction}};
  if (data.source == "builtin") j["builtin_bytes"] = data.builtin_bytes;
  if (data.source != "builtin" && fs::exists(data.source)) {
    // A changed file re-tokenizes: size and modification time stand in for its content.
    std::error_code ec;
    j["source_bytes"] = fs::is_regular_file(data.source) ? static_cast<int64_t>(fs::file_size(data.source, ec)) : -1;
    j["source_mtime"] =
        static_cast<int64_t>(fs::last_write_time(data.source, ec).time_since_epoch().count());
  }
  return j.dump();
}

}  // namespace

std::unique_ptr<data::Tokenizer> make_tokenizer(const DataSection& data) {
  if (data.tokenizer == "byte") return data::make_byte_tokenizer();
  return data::load_tokenizer(data.tokenizer);
}

namespace {
fs::path tokenizer_dir(const DataSection& data) {
  const fs::path source(data.tokenizer);
  return fs::is_directory(source) ? source : source.parent_path();
}
}  // namespace

std::optional<data::chat::ChatTemplate> find_chat_template(const DataSection& data) {
  if (data.tokenizer == "byte") return std::nullopt;
  return data::chat::ChatTemplate::find_in_model_dir(tokenizer_dir(data).string());
}

TokenizedData prepare_training_data(const TrainConfig& config, const data::Tokenizer& tokenizer,
                                    cluster::ProcessGroup& world) {
  const auto& data = config.data;
  TokenizedData out;
  out.vocab_size = tokenizer.vocab_size();
  if (data.source != "builtin") refuse_jsonl_source(data);
  if (data.source != "builtin" && !fs::exists(data.source)) {
    throw ConfigError(fmt::format("data.source = '{}' does not exist; use a text file, a directory of .txt files "
                                  "or token shards, or 'builtin'",
                                  data.source));
  }
  // Shards made earlier (a previous run's data/ or tokenize_to_shards) are used as they are.
  const fs::path source(data.source);
  if (data.source != "builtin" && (has_token_shards(source) || has_token_shards(source / "train"))) {
    out.train_dir = has_token_shards(source / "train") ? (source / "train").string() : source.string();
    if (has_token_shards(source / "eval")) out.eval_dir = (source / "eval").string();
    return out;
  }
  const fs::path cache = data.cache_dir.empty() ? fs::path(config.train.output_dir) / "data" : fs::path(data.cache_dir);
  const auto stamp_path = cache / "source.json";
  const auto stamp = stamp_of(data, out.vocab_size);
  if (world.rank() == 0) {
    bool fresh = fs::exists(stamp_path) && read_file(stamp_path) == stamp;
    if (!fresh) {
      checkpoint::io::remove_tree((cache / "train").string());
      checkpoint::io::remove_tree((cache / "eval").string());
      checkpoint::io::remove_file(stamp_path.string());
      fs::create_directories(cache);
      data::tokenize_to_shards(corpus_text(data), tokenizer, cache.string(), {.eval_fraction = data.eval_fraction});
      // The stamp goes last: a crash mid-way leaves no stamp, so the next run redoes it.
      std::ofstream(stamp_path) << stamp;
    }
  }
  world.barrier().wait();
  out.train_dir = (cache / "train").string();
  if (has_token_shards(cache / "eval")) out.eval_dir = (cache / "eval").string();
  return out;
}

void save_tokenizer_files(const DataSection& data, const std::string& model_dir) {
  if (data.tokenizer == "byte") {
    data::save_byte_tokenizer(model_dir);
    return;
  }
  const fs::path dir = tokenizer_dir(data);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "tokenizer.model", "chat_template.jinja"}) {
    if (fs::exists(dir / name)) fs::copy_file(dir / name, fs::path(model_dir) / name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace colossus::apps
