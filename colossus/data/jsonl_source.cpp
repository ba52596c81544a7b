#include "colossus/data/jsonl_source.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <glob.h>

#include <algorithm>
#include <filesystem>

namespace colossus::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// One line's JSON value; ConfigError without the location (the caller adds it).
json parse_line(const std::string& line) {
  try {
    return json::parse(line);
  } catch (const json::parse_error& e) {
    // nlohmann's messages start with "[json.exception.parse_error.101] "; the rest says what and where.
    std::string what = e.what();
    if (auto bracket = what.find("] "); what.starts_with("[json.exception") && bracket != std::string::npos) {
      what.erase(0, bracket + 2);
    }
    throw ConfigError("invalid JSON: " + what);
  }
}

// Reads the next line of `in` into `line` without its "\n" (or "\r\n");
// returns the bytes consumed, or nullopt at the end of the file.
std::optional<int64_t> getline_counted(std::ifstream& in, std::string& line) {
  if (!std::getline(in, line)) return std::nullopt;
  const int64_t consumed = static_cast<int64_t>(line.size()) + (in.eof() ? 0 : 1);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return consumed;
}

}  // namespace

void JsonlSourceOptions::validate() const {
  parse_record_format(format);
  if (kept_reasons < 0) throw ConfigError(fmt::format("kept_reasons = {} must be >= 0, e.g. 5", kept_reasons));
}

json JsonlPosition::to_json() const {
  return {{"file_index", file_index},           {"byte_offset", byte_offset},
          {"line_number", line_number},         {"records_yielded", records_yielded},
          {"lines_skipped", lines_skipped},     {"file", file}};
}

JsonlPosition JsonlPosition::from_json(const json& j) {
  try {
    return {.file_index = j.at("file_index").get<int64_t>(),
            .byte_offset = j.at("byte_offset").get<int64_t>(),
            .line_number = j.at("line_number").get<int64_t>(),
            .records_yielded = j.at("records_yielded").get<int64_t>(),
            .lines_skipped = j.at("lines_skipped").get<int64_t>(),
            .file = j.at("file").get<std::string>()};
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("JSONL position {} is not one JsonlPosition::to_json wrote: {}", j.dump(), e.what()));
  }
}

std::vector<std::string> expand_jsonl_source(const std::string& source) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(source, ec)) {
    for (const auto& entry : fs::directory_iterator(source)) {
      if (entry.is_regular_file() && entry.path().extension() == ".jsonl") files.push_back(entry.path().string());
    }
    if (files.empty()) throw ConfigError(fmt::format("JSONL source '{}' is a folder with no *.jsonl files", source));
  } else if (fs::is_regular_file(source, ec)) {
    files.push_back(source);
  } else if (source.find_first_of("*?[") != std::string::npos) {
    glob_t matches{};
    const int rc = ::glob(source.c_str(), GLOB_NOSORT, nullptr, &matches);
    if (rc == 0) {
      for (size_t i = 0; i < matches.gl_pathc; ++i) {
        if (fs::is_regular_file(matches.gl_pathv[i], ec)) files.push_back(matches.gl_pathv[i]);
      }
    }
    ::globfree(&matches);
    if (rc != 0 && rc != GLOB_NOMATCH) {
      throw ConfigError(fmt::format("JSONL source '{}': glob failed ({})", source, rc));
    }
    if (files.empty()) throw ConfigError(fmt::format("JSONL source '{}' matches no files", source));
  } else {
    throw ConfigError(fmt::format("JSONL source '{}' does not exist; give a .jsonl file, a folder of *.jsonl files "
                                  "or a glob such as 'data/*.jsonl'",
                                  source));
  }
  // Byte order, not the locale's collation, so every machine reads the same sequence.
  std::sort(files.begin(), files.end());
  return files;
}

JsonlSource::JsonlSource(const std::string& source, JsonlSourceOptions options)
    : files_(expand_jsonl_source(source)), options_(std::move(options)) {
  options_.validate();
  if (auto format = parse_record_format(options_.format)) {
    format_ = *format;
    return;
  }
  // "auto": the first object of the source decides. Lines that next() would
  // skip are passed over here too; next() counts them when it reaches them.
  for (size_t f = 0; f < files_.size(); ++f) {
    std::ifstream in(files_[f], std::ios::binary);
    if (!in) throw ConfigError(fmt::format("{}: cannot be read", files_[f]));
    std::string line;
    for (int64_t number = 1; getline_counted(in, line); ++number) {
      if (is_blank(line)) continue;
      const auto where = fmt::format("{}:{}", files_[f], number);
      json value;
      try {
        value = parse_line(line);
      } catch (const ConfigError& e) {
        if (options_.skip_bad_lines) continue;
        throw ConfigError(fmt::format("{}: {}", where, e.what()));
      }
      if (!value.is_object() && options_.skip_bad_lines) continue;
      try {
        format_ = detect_format(value);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("{}: {}", where, e.what()));
      }
      return;
    }
  }
  throw ConfigError(fmt::format("JSONL source '{}' holds no records (every line is blank{})", source,
                                options_.skip_bad_lines ? " or bad" : ""));
}

void JsonlSource::open_current() {
  in_ = std::ifstream(files_[static_cast<size_t>(file_index_)], std::ios::binary);
  if (!in_) throw ConfigError(fmt::format("{}: cannot be read", files_[static_cast<size_t>(file_index_)]));
  in_.seekg(byte_offset_);
  if (!in_) {
    throw ConfigError(fmt::format("{}: cannot seek to byte {}", files_[static_cast<size_t>(file_index_)], byte_offset_));
  }
  open_ = true;
}

bool JsonlSource::read_line(std::string& line) {
  while (file_index_ < static_cast<int64_t>(files_.size())) {
    if (!open_) open_current();
    if (auto consumed = getline_counted(in_, line)) {
      byte_offset_ += *consumed;
      ++line_number_;
      return true;
    }
    if (in_.bad()) throw ConfigError(fmt::format("{}: read error", files_[static_cast<size_t>(file_index_)]));
    in_.close();
    open_ = false;
    ++file_index_;
    byte_offset_ = 0;
    line_number_ = 0;
  }
  return false;
}

std::optional<JsonlRecord> JsonlSource::next() {
  while (read_line(line_)) {
    if (is_blank(line_)) continue;
    try {
      Record record = parse_record(parse_line(line_), format_);
      ++yielded_;
      return JsonlRecord{std::move(record), file_index_, line_number_};
    } catch (const ConfigError& e) {
      std::string reason = fmt::format("{}:{}: {}", files_[static_cast<size_t>(file_index_)], line_number_, e.what());
      if (!options_.skip_bad_lines) throw ConfigError(reason);
      ++skipped_;
      if (static_cast<int>(skip_reasons_.size()) < options_.kept_reasons) skip_reasons_.push_back(std::move(reason));
    }
  }
  return std::nullopt;
}

JsonlPosition JsonlSource::position() const {
  const bool past_end = file_index_ >= static_cast<int64_t>(files_.size());
  return {.file_index = file_index_,
          .byte_offset = byte_offset_,
          .line_number = line_number_,
          .records_yielded = yielded_,
          .lines_skipped = skipped_,
          .file = past_end ? "" : files_[static_cast<size_t>(file_index_)]};
}

void JsonlSource::seek(const JsonlPosition& position) {
  const auto n_files = static_cast<int64_t>(files_.size());
  if (position.file_index < 0 || position.file_index > n_files) {
    throw ConfigError(
        fmt::format("JSONL position names file {} but the source has {} files", position.file_index, n_files));
  }
  if (position.file_index < n_files) {
    const auto& file = files_[static_cast<size_t>(position.file_index)];
    if (position.file != file) {
      throw ConfigError(fmt::format("JSONL position was taken in '{}' but file {} of the source is now '{}'; the "
                                    "dataset's files changed since",
                                    position.file, position.file_index, file));
    }
    std::error_code ec;
    const auto size = static_cast<int64_t>(fs::file_size(file, ec));
    if (ec || position.byte_offset < 0 || position.byte_offset > size) {
      throw ConfigError(fmt::format("JSONL position byte {} is outside '{}' ({} bytes); the file changed since",
                                    position.byte_offset, file, ec ? -1 : size));
    }
  }
  in_.close();
  open_ = false;
  file_index_ = position.file_index;
  byte_offset_ = position.byte_offset;
  line_number_ = position.line_number;
  yielded_ = position.records_yielded;
  skipped_ = position.lines_skipped;
  skip_reasons_.clear();
}

std::string JsonlSource::skip_summary() const {
  if (skipped_ == 0) return "";
  std::string summary = fmt::format("skipped {} bad line{}", skipped_, skipped_ == 1 ? "" : "s");
  for (size_t i = 0; i < skip_reasons_.size(); ++i) summary += (i == 0 ? "; first: " : "; ") + skip_reasons_[i];
  return summary;
}

}  // namespace colossus::data
