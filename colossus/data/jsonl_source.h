// JsonlSource: the records of a post-training dataset (one .jsonl file, every
// *.jsonl of a folder, or a glob), streamed line by line with each bad line
// reported as FILE:LINE, and a position that resumes at exactly the next record.
#pragma once
#include "colossus/data/jsonl_records.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace colossus::data {

struct JsonlSourceOptions {
  std::string format = "auto";  // "auto" (from the first record's keys) or a parse_record_format name
  bool skip_bad_lines = false;  // count and skip a bad line instead of throwing
  int kept_reasons = 5;         // the first skipped lines' reasons kept for skip_summary()
  void validate() const;
};

// Where reading stands: the next line starts at `byte_offset` of
// files[file_index], after `line_number` lines of that file. `file` is that
// file's path, checked on seek so that a changed file list is not resumed.
struct JsonlPosition {
  int64_t file_index = 0;
  int64_t byte_offset = 0;
  int64_t line_number = 0;
  int64_t records_yielded = 0;
  int64_t lines_skipped = 0;
  std::string file;
  nlohmann::json to_json() const;
  static JsonlPosition from_json(const nlohmann::json& j);
  bool operator==(const JsonlPosition&) const = default;
};

struct JsonlRecord {
  Record record;
  int64_t file_index = 0;
  int64_t line_number = 0;  // 1-based, counting blank lines
};

// The files `source` names: a file itself, a folder's *.jsonl (not
// recursive), or a glob(3) pattern's regular files, sorted by name. No match:
// ConfigError naming the pattern.
std::vector<std::string> expand_jsonl_source(const std::string& source);

class JsonlSource {
 public:
  // Expands the files and, for "auto", reads the first good record to fix the
  // format (ConfigError with FILE:LINE if its keys fit no format).
  JsonlSource(const std::string& source, JsonlSourceOptions options = {});

  // The next record, or nullopt after the last file. A bad line (invalid JSON,
  // not an object, missing keys, wrong types) throws ConfigError
  // "FILE:LINE: what is wrong" unless skip_bad_lines.
  std::optional<JsonlRecord> next();

  JsonlPosition position() const;
  // Continues so that next() returns the record after the one `position` was
  // taken after. ConfigError if the position does not fit these files.
  void seek(const JsonlPosition& position);

  RecordFormat format() const { return format_; }
  const std::vector<std::string>& files() const { return files_; }
  int64_t skipped() const { return skipped_; }
  const std::vector<std::string>& skip_reasons() const { return skip_reasons_; }
  // "skipped N bad lines; first: FILE:LINE: ...; ..." or "" when none were.
  std::string skip_summary() const;

 private:
  bool read_line(std::string& line);
  void open_current();

  std::vector<std::string> files_;
  JsonlSourceOptions options_;
  RecordFormat format_ = RecordFormat::Text;
  std::ifstream in_;
  bool open_ = false;
  int64_t file_index_ = 0;
  int64_t byte_offset_ = 0;
  int64_t line_number_ = 0;
  int64_t yielded_ = 0;
  int64_t skipped_ = 0;
  std::vector<std::string> skip_reasons_;
  std::string line_;
};

}  // namespace colossus::data
