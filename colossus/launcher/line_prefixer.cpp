#include "colossus/launcher/line_prefixer.h"

#include "colossus/launcher/fd.h"

namespace colossus::launcher {

LineSink fd_sink(int fd) {
  return [fd](std::string_view line) { write_all(fd, line); };
}

LinePrefixer::LinePrefixer(std::string prefix, LineSink sink, size_t max_line_bytes)
    : prefix_(std::move(prefix)), sink_(std::move(sink)), max_line_bytes_(max_line_bytes) {}

void LinePrefixer::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      pending_.append(bytes);
      while (pending_.size() >= max_line_bytes_) {
        emit(std::string_view(pending_).substr(0, max_line_bytes_));
        pending_.erase(0, max_line_bytes_);
      }
      return;
    }
    if (pending_.empty()) {
      emit(bytes.substr(0, newline));
    } else {
      pending_.append(bytes.substr(0, newline));
      emit(pending_);
      pending_.clear();
    }
    bytes.remove_prefix(newline + 1);
  }
}

void LinePrefixer::finish() {
  if (pending_.empty()) return;
  emit(pending_);
  pending_.clear();
}

void LinePrefixer::emit(std::string_view line) {
  std::string whole;
  whole.reserve(prefix_.size() + line.size() + 1);
  whole.append(prefix_).append(line).push_back('\n');
  sink_(whole);
}

}  // namespace colossus::launcher
