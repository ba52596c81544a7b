// Turns one rank's byte stream into whole lines, each handed on in a single
// piece with the rank's prefix ("[r3] "), so lines of different ranks never mix
// mid-line. A partial last line is held until its newline or the stream's end.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace colossus::launcher {

// Receives one complete prefixed line, newline included.
using LineSink = std::function<void(std::string_view)>;
// A sink that writes each line with one write() to `fd` (stdout or stderr).
LineSink fd_sink(int fd);

class LinePrefixer {
 public:
  // A line longer than max_line_bytes is cut there, so a rank that never
  // prints a newline cannot make the launcher buffer without bound.
  LinePrefixer(std::string prefix, LineSink sink, size_t max_line_bytes = 64 * 1024);

  void feed(std::string_view bytes);
  // End of stream: a held partial line goes out, terminated with '\n'.
  void finish();

 private:
  void emit(std::string_view line);

  std::string prefix_;
  LineSink sink_;
  size_t max_line_bytes_;
  std::string pending_;
};

}  // namespace colossus::launcher
