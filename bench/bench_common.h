// Helpers every benchmark needs to label and record its results: a shell
// command's output, the machine's name, today's date, and appending to
// bench/RESULTS.md and bench/results.jsonl. Header-only (each bench is one
// translation unit).
#pragma once
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace colossus::bench {

// stdout of `command` (run by /bin/sh), trailing newlines and spaces removed;
// empty when it cannot run.
inline std::string run_command(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// "1x NVIDIA H200, 580.x" with a GPU, else "CPU, N threads".
inline std::string machine_name(bool cuda) {
  if (cuda) {
    const std::string gpu = run_command("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1");
    return "1x " + (gpu.empty() ? std::string("CUDA GPU") : gpu);
  }
  return "CPU, " + std::to_string(std::thread::hardware_concurrency()) + " threads";
}

inline std::string today() {
  const std::time_t now = std::time(nullptr);
  char text[16];
  std::strftime(text, sizeof(text), "%Y-%m-%d", std::gmtime(&now));
  return text;
}

// The checkout's short commit, or `fallback` (e.g. --commit, for exported
// trees without .git).
inline std::string commit_or(const std::string& fallback) {
  if (!fallback.empty()) return fallback;
  const std::string head = run_command("git rev-parse --short HEAD 2>/dev/null");
  return head.empty() ? "unknown" : head;
}

inline void append_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::app);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace colossus::bench
