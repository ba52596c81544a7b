// Rank-aware logger: by default only rank 0 prints, so a 64-rank job logs one
// line per event. log.info("msg", {0, 3}) picks ranks; kAllRanks prints on all.
#pragma once
#include <fmt/format.h>

#include <functional>

#include <string>
#include <string_view>
#include <vector>

namespace colossus::cluster {

enum class LogLevel { Debug = 0, Info = 1, Warning = 2, Error = 3 };

inline const std::vector<int> kAllRanks{-1};

class Logger {
 public:
  explicit Logger(std::string name) : name_(std::move(name)) {}

  void debug(std::string_view msg, const std::vector<int>& ranks = {0}) const { log(LogLevel::Debug, msg, ranks); }
  void info(std::string_view msg, const std::vector<int>& ranks = {0}) const { log(LogLevel::Info, msg, ranks); }
  void warning(std::string_view msg, const std::vector<int>& ranks = {0}) const { log(LogLevel::Warning, msg, ranks); }
  // Errors print on every rank unless told otherwise: the failing rank is the one to hear from.
  void error(std::string_view msg, const std::vector<int>& ranks = kAllRanks) const { log(LogLevel::Error, msg, ranks); }
  void log(LogLevel level, std::string_view msg, const std::vector<int>& ranks) const;

  // Process-wide settings; the rank comes from launch_from_env (or the launch env).
  static void set_rank(int rank, int world_size);
  static void set_level(LogLevel level);
  static LogLevel level();
  // Where lines go (default stderr); tests capture them here.
  static void set_sink(std::function<void(const std::string&)> sink);

 private:
  std::string name_;
};

LogLevel parse_log_level(std::string_view text);

}  // namespace colossus::cluster
