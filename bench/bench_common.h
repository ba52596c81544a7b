// Helpers every benchmark needs to label and record its results: a shell
// command's output, the repository, the machine's name, today's date, the
// commit, and appending to bench/RESULTS.md and bench/results.jsonl.
// Header-only (each bench is one translation unit).
#pragma once
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace colossus::bench {

// stdout of `command` (run by /bin/sh), trailing newlines and spaces removed
// unless `trim` is false; empty when it cannot run.
inline std::string run_command(const std::string& command, bool trim = true) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  ::pclose(pipe);
  while (trim && !out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// The repository: two levels above the binary (<repo>/<build>/bin/bench_x).
inline std::filesystem::path repo_root() {
  return std::filesystem::canonical("/proc/self/exe").parent_path().parent_path().parent_path();
}

// "1x NVIDIA H200, 580.x" with a GPU, else "CPU, N threads".
inline std::string machine_name(bool cuda) {
  if (cuda) {
    const std::string gpu = run_command("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1");
    return "1x " + (gpu.empty() ? std::string("CUDA GPU") : gpu);
  }
  return "CPU, " + std::to_string(std::thread::hardware_concurrency()) + " threads";
}

// The date and time the RESULTS.md sections of the older benches carry:
// "2026-01-31 14:05 UTC".
inline constexpr const char* kDateTimeUtc = "%Y-%m-%d %H:%M UTC";

// The current UTC time in strftime's `format`: "2026-01-31" by default.
inline std::string today(const char* format = "%Y-%m-%d") {
  const std::time_t now = std::time(nullptr);
  char text[64];
  if (std::strftime(text, sizeof(text), format, std::gmtime(&now)) == 0) return {};
  return text;
}

// The short commit of the checkout at `repo` (the current directory when
// empty), or `fallback` (e.g. --commit, for exported trees without .git);
// `unknown` when git cannot say.
inline std::string commit_or(const std::string& fallback, const std::filesystem::path& repo = {},
                             const std::string& unknown = "unknown") {
  if (!fallback.empty()) return fallback;
  const std::string git = repo.empty() ? std::string("git") : "git -C '" + repo.string() + "'";
  const std::string head = run_command(git + " rev-parse --short HEAD 2>/dev/null");
  return head.empty() ? unknown : head;
}

inline void append_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::app);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace colossus::bench
