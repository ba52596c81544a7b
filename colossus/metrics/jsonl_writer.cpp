#include "colossus/metrics/jsonl_writer.h"

#include "colossus/core/errors.h"
#include "colossus/metrics/atomic_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace colossus::metrics {

namespace fs = std::filesystem;

namespace {

// The lines of a file; the last one may lack its newline (a torn write).
std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(fmt::format("cannot read metrics file '{}': {}", path.string(), std::strerror(errno)));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(std::move(line));
  return lines;
}

std::optional<nlohmann::json> parse_record(const std::string& line) {
  auto record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded() || !record.is_object()) return std::nullopt;
  return record;
}

bool ends_with_newline(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || in.tellg() <= 0) return true;
  in.seekg(-1, std::ios::end);
  return in.get() == '\n';
}

}  // namespace

MetricsWriter::MetricsWriter(fs::path path) : path_(std::move(path)) { open_for_append(); }

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::open_for_append() {
  if (path_.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(path_.parent_path(), ec);
    if (ec) throw ConfigError(fmt::format("cannot create folder '{}': {}", path_.parent_path().string(), ec.message()));
  }
  bool torn = fs::exists(path_) && !ends_with_newline(path_);
  file_ = std::fopen(path_.c_str(), "a");
  if (file_ == nullptr) {
    throw ConfigError(
        fmt::format("cannot open metrics file '{}' for appending: {}", path_.string(), std::strerror(errno)));
  }
  if (torn) {
    std::fputc('\n', file_);
    std::fflush(file_);
  }
}

void MetricsWriter::write(int64_t step, const MetricFields& fields) {
  nlohmann::ordered_json record;
  record["step"] = step;
  for (const auto& [name, value] : fields) {
    if (std::isfinite(value)) {
      record[name] = value;
    } else {
      record[name] = nullptr;
    }
  }
  write(record);
}

void MetricsWriter::write(const nlohmann::ordered_json& record) {
  if (!record.is_object()) {
    throw ConfigError(fmt::format("a metrics record must be a JSON object, got {}", record.dump()));
  }
  // One write per line, then a flush: a reader (or a crash) sees whole records.
  std::string line = record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw ConfigError(fmt::format("cannot append to metrics file '{}': {}", path_.string(), std::strerror(errno)));
  }
}

int64_t MetricsWriter::truncate_after(int64_t resume_step) {
  std::fflush(file_);
  std::string kept;
  int64_t dropped = 0;
  for (const std::string& line : read_lines(path_)) {
    auto record = parse_record(line);
    bool keep = record.has_value();
    if (keep && record->contains("step") && (*record)["step"].is_number()) {
      keep = (*record)["step"].get<double>() <= static_cast<double>(resume_step);
    }
    if (keep) {
      kept += line;
      kept += '\n';
    } else if (!line.empty()) {
      ++dropped;
    }
  }
  // Rename replaces the file our handle points at, so reopen to append to the new one.
  std::fclose(file_);
  file_ = nullptr;
  write_file_atomically(path_, kept);
  open_for_append();
  return dropped;
}

std::vector<nlohmann::json> read_metrics_jsonl(const fs::path& path) {
  if (!fs::exists(path)) throw ConfigError(fmt::format("metrics file '{}' does not exist", path.string()));
  std::vector<nlohmann::json> records;
  for (const std::string& line : read_lines(path)) {
    if (auto record = parse_record(line)) records.push_back(std::move(*record));
  }
  return records;
}

}  // namespace colossus::metrics
