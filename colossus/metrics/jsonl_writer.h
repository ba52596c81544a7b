// Training metrics as JSON Lines: one object per record ({"step":..,"loss":..}),
// appended and flushed per record, so a resumed run continues the same file.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace colossus::metrics {

// Named numbers of one record, in the order they should appear.
using MetricFields = std::vector<std::pair<std::string, double>>;

class MetricsWriter {
 public:
  // Opens `path` for appending (creating it and its folders). A torn last line
  // left by a crash is closed off with a newline so new records start clean.
  explicit MetricsWriter(std::filesystem::path path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends {"step": step, name: value, ...}. Non-finite values are written as
  // null (JSON has no NaN), which readers and the plot skip.
  void write(int64_t step, const MetricFields& fields);
  // Appends any JSON object as one line (keys in the object's order).
  void write(const nlohmann::ordered_json& record);

  // For resuming from a checkpoint taken at `resume_step`: drops every record
  // whose "step" is greater (and torn lines), rewriting the file atomically, so
  // the resumed run does not leave duplicate steps behind. Returns how many were dropped.
  int64_t truncate_after(int64_t resume_step);

  const std::filesystem::path& path() const { return path_; }

 private:
  void open_for_append();

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

// Every record of a JSONL file, in order; lines that are not a JSON object
// (a torn last line) are skipped. A missing file is a ConfigError.
std::vector<nlohmann::json> read_metrics_jsonl(const std::filesystem::path& path);

}  // namespace colossus::metrics
