#include "colossus/data/prepare.h"

#include "colossus/core/errors.h"
#include "colossus/data/token_shards.h"

#include <fmt/format.h>
#include <glob.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

namespace colossus::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "prepare_state.json";
constexpr int kStateVersion = 1;

bool is_jsonl(const std::string& path) { return fs::path(path).extension() == ".jsonl"; }

// Reads documents in input order, one at a time.
class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, const PrepareOptions& options)
      : files_(std::move(files)), options_(options) {}

  // The next document's text; nullopt at the end.
  std::optional<std::string> next() {
    while (file_ < files_.size()) {
      if (!in_.is_open()) {
        in_.open(files_[file_], std::ios::binary);
        if (!in_) throw ConfigError(fmt::format("data prepare: cannot read {}", files_[file_]));
        line_ = 0;
        if (!is_jsonl(files_[file_]) && !options_.per_line) {
          std::string text((std::istreambuf_iterator<char>(in_)), std::istreambuf_iterator<char>());
          bytes_ += static_cast<int64_t>(text.size());
          close_file();
          return text;  // the whole file, blank lines and all, is one document
        }
      }
      std::string line;
      while (std::getline(in_, line)) {
        ++line_;
        bytes_ += static_cast<int64_t>(line.size()) + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        if (!is_jsonl(files_[file_])) return line;
        return record_text(line);
      }
      close_file();
    }
    return std::nullopt;
  }

  int64_t bytes() const { return bytes_; }

 private:
  void close_file() {
    in_.close();
    in_.clear();
    ++file_;
  }

  std::string record_text(const std::string& line) const {
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw ConfigError(fmt::format("{}:{}: not a JSON object ({})", files_[file_], line_, e.what()));
    }
    if (!record.is_object() || !record.contains(options_.text_key) || !record[options_.text_key].is_string()) {
      throw ConfigError(fmt::format("{}:{}: no string field \"{}\" (the document's text); name the field with "
                                    "--text_key",
                                    files_[file_], line_, options_.text_key));
    }
    return record[options_.text_key].get<std::string>();
  }

  std::vector<std::string> files_;
  const PrepareOptions& options_;
  size_t file_ = 0;
  std::ifstream in_;
  int64_t line_ = 0;
  int64_t bytes_ = 0;
};

// What a state must match to be resumed: the inputs (names and sizes), the
// options that shape the stream, and the tokenizer (vocabulary size, end
// token, and the ids of a probe text).
nlohmann::json run_identity(const std::vector<std::string>& files, const Tokenizer& tokenizer,
                            const PrepareOptions& options) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const auto& f : files) inputs.push_back({{"path", fs::absolute(f).string()}, {"bytes", fs::file_size(f)}});
  return {{"inputs", inputs},
          {"text_key", options.text_key},
          {"per_line", options.per_line},
          {"shard_tokens", options.shard_tokens},
          {"tokenizer",
           {{"vocab_size", tokenizer.vocab_size()},
            {"eos", *tokenizer.eos_id()},
            {"probe", tokenizer.encode("Tokenizer probe: The quick brown fox, 1234 \xc3\xa9t\xc3\xa9 \xe4\xb8\x96\xe7\x95\x8c!",
                                       false)}}}};
}

void write_state(const fs::path& dir, const nlohmann::json& state) {
  const fs::path path = dir / kStateFile, tmp = dir / (std::string(kStateFile) + ".tmp");
  {
    std::ofstream out(tmp);
    out << state.dump(1) << '\n';
    if (!out) throw CheckpointError(fmt::format("data prepare: cannot write {}", tmp.string()));
  }
  fs::rename(tmp, path);
}

std::string shard_name(int64_t index) { return fmt::format("shard-{:06d}.tokens", index); }

// A run of one document's tokens held in the write buffer: ids
// [offset, offset + count) of document `document`.
struct Span {
  int64_t document, offset, count;
};

}  // namespace

std::vector<std::string> expand_prepare_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& input : inputs) {
    std::vector<std::string> found;
    if (fs::is_directory(input)) {
      for (const auto& entry : fs::directory_iterator(input)) {
        if (entry.is_regular_file()) found.push_back(entry.path().string());
      }
    } else if (fs::is_regular_file(input)) {
      found.push_back(input);
    } else {
      glob_t matches{};
      if (::glob(input.c_str(), 0, nullptr, &matches) == 0) {
        for (size_t i = 0; i < matches.gl_pathc; ++i) {
          if (fs::is_regular_file(matches.gl_pathv[i])) found.emplace_back(matches.gl_pathv[i]);
        }
      }
      ::globfree(&matches);
    }
    if (found.empty()) {
      throw ConfigError(fmt::format("data prepare: '{}' names no file (a file, a folder of files, or a glob)", input));
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

PrepareResult prepare_token_shards(const Tokenizer& tokenizer, const PrepareOptions& options) {
  if (options.shard_tokens < 1)
    throw ConfigError(fmt::format("data prepare: shard_tokens = {} must be at least 1", options.shard_tokens));
  if (options.threads < 0)
    throw ConfigError(fmt::format("data prepare: threads = {} is negative; use 0 (every core) or a count", options.threads));
  if (options.batch_documents < 1)
    throw ConfigError(fmt::format("data prepare: batch_documents = {} must be at least 1", options.batch_documents));
  if (options.text_key.empty()) throw ConfigError("data prepare: text_key is empty; name the JSONL text field");
  if (options.output_dir.empty()) throw ConfigError("data prepare: no output directory given");
  const auto eos = tokenizer.eos_id();
  if (!eos) {
    throw ConfigError("data prepare: the tokenizer has no end-of-text token to put between documents; use a "
                      "tokenizer whose config names its eos token");
  }
  const std::vector<std::string> files = expand_prepare_inputs(options.inputs);
  const fs::path dir(options.output_dir);
  fs::create_directories(dir);
  const nlohmann::json identity = run_identity(files, tokenizer, options);

  PrepareResult result;
  int64_t shards = 0, next_document = 0, skip_tokens = 0;
  if (fs::exists(dir / kStateFile)) {
    nlohmann::json state;
    try {
      std::ifstream in(dir / kStateFile);
      state = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("data prepare: {} is unreadable ({}); delete {} to start over",
                                    (dir / kStateFile).string(), e.what(), options.output_dir));
    }
    for (const auto& [key, value] : identity.items()) {
      if (state.value("identity", nlohmann::json::object()).value(key, nlohmann::json()) != value) {
        throw ConfigError(fmt::format("data prepare: {} holds shards prepared with another {} (was {}, now {}); give a "
                                      "new output directory, or delete it to start over",
                                      options.output_dir, key, state["identity"].value(key, nlohmann::json()).dump(),
                                      value.dump()));
      }
    }
    shards = state.at("shards").get<int64_t>();
    for (int64_t k = 0; k < shards; ++k) result.shards.push_back((dir / shard_name(k)).string());
    if (state.value("complete", false)) {
      result.documents = state.at("documents").get<int64_t>();
      result.tokens = state.at("tokens").get<int64_t>();
      result.already_done = true;
      return result;
    }
    next_document = state.at("next_document").get<int64_t>();
    skip_tokens = state.at("skip_tokens").get<int64_t>();
    result.resumed = true;
  } else if (std::any_of(fs::directory_iterator(dir), fs::directory_iterator(),
                         [](const fs::directory_entry& e) { return e.path().extension() == ".tokens"; })) {
    throw ConfigError(fmt::format("data prepare: {} already holds token shards that no {} describes; give a new "
                                  "output directory",
                                  options.output_dir, kStateFile));
  }

  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  DocumentReader reader(files, options);
  std::vector<int32_t> buffer;
  std::deque<Span> spans;  // what `buffer` holds, document by document
  int64_t document = 0;    // index of the next document read
  int64_t appended = next_document;  // index of the next document to enter the buffer
  int64_t written = shards * options.shard_tokens;

  auto save_state = [&](bool complete) {
    nlohmann::json state{{"version", kStateVersion}, {"identity", identity}, {"shards", shards},
                         {"tokens", written}, {"complete", complete}};
    // Where the next shard starts: the buffer's first token, or the next document.
    state["next_document"] = spans.empty() ? appended : spans.front().document;
    state["skip_tokens"] = spans.empty() ? 0 : spans.front().offset;
    if (complete) state["documents"] = document;
    write_state(dir, state);
  };
  auto flush = [&](int64_t count) {
    data::write_token_shard((dir / shard_name(shards)).string(), std::span(buffer.data(), static_cast<size_t>(count)),
                            tokenizer.vocab_size());
    result.shards.push_back((dir / shard_name(shards)).string());
    ++shards;
    written += count;
    buffer.erase(buffer.begin(), buffer.begin() + count);
    for (int64_t left = count; left > 0;) {
      Span& front = spans.front();
      const int64_t take = std::min(left, front.count);
      front.offset += take;
      front.count -= take;
      left -= take;
      if (front.count == 0) spans.pop_front();
    }
  };

  std::vector<std::string> batch;
  std::vector<std::vector<int32_t>> ids;
  for (bool more = true; more;) {
    batch.clear();
    int64_t first = document;  // index of batch[0]
    while (static_cast<int64_t>(batch.size()) < options.batch_documents) {
      auto text = reader.next();
      if (!text) {
        more = false;
        break;
      }
      if (document++ < next_document) {  // written before the interruption
        ++first;
        continue;
      }
      batch.push_back(std::move(*text));
    }
    ids.assign(batch.size(), {});
    std::vector<std::thread> pool;
    const int used = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), batch.size()));
    for (int t = 0; t < used; ++t) {
      pool.emplace_back([&, t] {
        for (size_t i = static_cast<size_t>(t); i < batch.size(); i += static_cast<size_t>(used)) {
          ids[i] = tokenizer.encode(batch[i], /*add_special_tokens=*/false);
          ids[i].push_back(*eos);
        }
      });
    }
    for (auto& worker : pool) worker.join();
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t index = first + static_cast<int64_t>(i);
      const int64_t skip = index == next_document ? std::min<int64_t>(skip_tokens, static_cast<int64_t>(ids[i].size())) : 0;
      buffer.insert(buffer.end(), ids[i].begin() + skip, ids[i].end());
      spans.push_back({index, skip, static_cast<int64_t>(ids[i].size()) - skip});
      appended = index + 1;
      while (static_cast<int64_t>(buffer.size()) >= options.shard_tokens) {
        flush(options.shard_tokens);
        save_state(false);
      }
    }
    if (options.progress) options.progress(document, written + static_cast<int64_t>(buffer.size()), reader.bytes());
  }
  if (!buffer.empty()) flush(static_cast<int64_t>(buffer.size()));
  save_state(true);
  result.documents = document;
  result.tokens = written;
  result.bytes = reader.bytes();
  return result;
}

}  // namespace colossus::data
