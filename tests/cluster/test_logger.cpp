// The rank-aware logger prints on the chosen ranks only, at the chosen level.
#include "colossus/cluster/logger.h"

#include "colossus/core/errors.h"

#include <gtest/gtest.h>

using colossus::cluster::Logger;
using colossus::cluster::LogLevel;

namespace {

struct CapturedLines {
  CapturedLines() {
    Logger::set_sink([this](const std::string& line) { lines.push_back(line); });
  }
  ~CapturedLines() {
    Logger::set_sink(nullptr);
    Logger::set_rank(0, 1);
    Logger::set_level(LogLevel::Info);
  }
  std::vector<std::string> lines;
};

}  // namespace

TEST(Logger, RankZeroOnlyByDefault) {
  CapturedLines captured;
  Logger log("test");
  Logger::set_rank(1, 4);
  log.info("from rank one");
  EXPECT_TRUE(captured.lines.empty());
  log.info("picked", {1, 2});
  log.info("everyone", colossus::cluster::kAllRanks);
  ASSERT_EQ(captured.lines.size(), 2u);
  EXPECT_NE(captured.lines[0].find("picked"), std::string::npos);
  EXPECT_NE(captured.lines[0].find("INFO"), std::string::npos);
  EXPECT_NE(captured.lines[0].find("test:"), std::string::npos);
  Logger::set_rank(0, 4);
  log.info("from rank zero");
  ASSERT_EQ(captured.lines.size(), 3u);
  EXPECT_NE(captured.lines[2].find("[r0]"), std::string::npos);
}

TEST(Logger, LevelFilters) {
  CapturedLines captured;
  Logger log("test");
  Logger::set_level(LogLevel::Warning);
  log.info("hidden");
  log.debug("hidden");
  log.warning("shown");
  log.error("shown too");
  EXPECT_EQ(captured.lines.size(), 2u);
  EXPECT_EQ(colossus::cluster::parse_log_level("debug"), LogLevel::Debug);
  EXPECT_THROW(colossus::cluster::parse_log_level("loud"), colossus::ConfigError);
}
