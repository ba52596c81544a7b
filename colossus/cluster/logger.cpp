#include "colossus/cluster/logger.h"

#include "colossus/core/env.h"
#include "colossus/core/errors.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <mutex>

namespace colossus::cluster {

namespace {

int env_int(const EnvLookup& env, std::initializer_list<const char*> names, int fallback) {
  for (const char* name : names) {
    if (auto value = env(name)) {
      try {
        return std::stoi(*value);
      } catch (...) {
      }
    }
  }
  return fallback;
}

struct LoggerState {
  LoggerState() {
    auto env = process_env();
    rank = env_int(env, {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}, 0);
    world_size = env_int(env, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, 1);
    if (auto lvl = env("COLOSSUS_LOG_LEVEL")) level = parse_log_level(*lvl);
    // colossus run prefixes each line with the rank already.
    rank_prefix = !env("COLOSSUS_LAUNCHER").has_value();
  }
  std::mutex mutex;
  int rank = 0;
  int world_size = 1;
  bool rank_prefix = true;
  LogLevel level = LogLevel::Info;
  std::function<void(const std::string&)> sink;
};

LoggerState& state() {
  static LoggerState instance;
  return instance;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::Debug: return "DEBUG";
    case LogLevel::Info: return "INFO";
    case LogLevel::Warning: return "WARN";
    case LogLevel::Error: return "ERROR";
  }
  return "?";
}

}  // namespace

LogLevel parse_log_level(std::string_view text) {
  if (text == "debug") return LogLevel::Debug;
  if (text == "info") return LogLevel::Info;
  if (text == "warning" || text == "warn") return LogLevel::Warning;
  if (text == "error") return LogLevel::Error;
  throw ConfigError(fmt::format("log level '{}' is not one of debug, info, warning, error", text));
}

void Logger::log(LogLevel level, std::string_view msg, const std::vector<int>& ranks) const {
  auto& s = state();
  if (level < s.level) return;
  bool all = std::find(ranks.begin(), ranks.end(), -1) != ranks.end();
  if (!all && std::find(ranks.begin(), ranks.end(), s.rank) == ranks.end()) return;
  auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&now, &tm);
  char clock[16];
  std::strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
  std::string prefix = s.rank_prefix && s.world_size > 1 ? fmt::format("[r{}] ", s.rank) : std::string();
  std::string line = fmt::format("{}{} {:<5} {}: {}", prefix, clock, level_name(level), name_, msg);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.sink) {
    s.sink(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
  }
}

void Logger::set_rank(int rank, int world_size) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.rank = rank;
  s.world_size = world_size;
}

void Logger::set_level(LogLevel level) { state().level = level; }
LogLevel Logger::level() { return state().level; }

void Logger::set_sink(std::function<void(const std::string&)> sink) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.sink = std::move(sink);
}

}  // namespace colossus::cluster
