#include "colossus/metrics/tensorboard_writer.h"

#include "colossus/core/errors.h"
#include "colossus/metrics/tfrecord.h"

#include <fmt/format.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace colossus::metrics {

namespace fs = std::filesystem;

namespace {

// Protobuf wire format, just the parts Event and Summary need.
// Field numbers are from tensorboard/compat/proto/{event,summary}.proto.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7fu) | 0x80u));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (field << 3) | type); }

void put_fixed(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xffu));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event{wall_time = 1 (double), step = 2 (int64)}; the caller appends the payload field.
std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_fixed(event, std::bit_cast<uint64_t>(wall_time), 8);
  if (step != 0) {  // proto3 omits default values
    put_key(event, 2, kVarint);
    put_varint(event, static_cast<uint64_t>(step));  // negative int64: ten-byte two's complement, as protobuf does
  }
  return event;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0 || buffer[0] == '\0') return "localhost";
  return buffer;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(fs::path log_dir, TensorBoardOptions options) {
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  if (ec) throw ConfigError(fmt::format("cannot create TensorBoard folder '{}': {}", log_dir.string(), ec.message()));
  double start = now_seconds();
  std::string base = fmt::format("events.out.tfevents.{:010d}.{}{}", static_cast<int64_t>(start), host_name(),
                                 options.filename_suffix);
  // Two writers started in the same second on one host get distinct files ("x": fail if it exists).
  for (int attempt = 0; file_ == nullptr; ++attempt) {
    file_path_ = log_dir / (attempt == 0 ? base : fmt::format("{}.{}", base, attempt));
    file_ = std::fopen(file_path_.c_str(), "wbx");
    if (file_ == nullptr && (errno != EEXIST || attempt >= 100)) {
      throw ConfigError(
          fmt::format("cannot create TensorBoard event file '{}': {}", file_path_.string(), std::strerror(errno)));
    }
  }
  std::string version = event_header(start, 0);
  put_bytes(version, 3, "brain.Event:2");
  write_event(version);
  if (options.resume_step) {
    // Event.session_log = 7: SessionLog{status = 1: START (1)}.
    std::string session_log;
    put_key(session_log, 1, kVarint);
    put_varint(session_log, 1);
    std::string event = event_header(start, *options.resume_step + 1);
    put_bytes(event, 7, session_log);
    write_event(event);
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(std::string_view tag, double value, int64_t step, std::optional<double> wall_time) {
  add_scalars(step, {{std::string(tag), value}}, wall_time);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                                    std::optional<double> wall_time) {
  // Summary{repeated Value value = 1}; Value{string tag = 1, float simple_value = 2}.
  std::string summary;
  for (const auto& [tag, value] : values) {
    if (tag.empty()) throw ConfigError(fmt::format("TensorBoard scalar at step {} has an empty tag", step));
    std::string entry;
    put_bytes(entry, 1, tag);
    put_key(entry, 2, kFixed32);
    put_fixed(entry, std::bit_cast<uint32_t>(static_cast<float>(value)), 4);
    put_bytes(summary, 1, entry);
  }
  std::string event = event_header(wall_time.value_or(now_seconds()), step);
  put_bytes(event, 5, summary);
  write_event(event);
}

void TensorBoardWriter::write_event(const std::string& event_bytes) {
  std::string record = frame_tfrecord(event_bytes);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0) {
    throw ConfigError(
        fmt::format("cannot write TensorBoard event file '{}': {}", file_path_.string(), std::strerror(errno)));
  }
}

}  // namespace colossus::metrics
