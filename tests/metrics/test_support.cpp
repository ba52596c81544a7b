#include "tests/metrics/test_support.h"

#include "tests/testing/command.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace colossus::metrics::testing {

namespace fs = std::filesystem;

const fs::path& scratch_dir() { return colossus::testing::scratch_dir("metrics"); }

nlohmann::json run_oracle(const std::string& command, const fs::path& path) {
  // stderr stays separate so a Python traceback cannot corrupt the JSON on stdout.
  fs::path err = scratch_dir() / "oracle_stderr.txt";
  std::string line = fmt::format("'{}' '{}' {} '{}' 2>'{}'", COLOSSUS_PYTHON, COLOSSUS_METRICS_ORACLE, command,
                                 path.string(), err.string());
  const auto result = colossus::testing::run_command(line);
  const std::string& output = result.output;
  if (result.exit_code != 0) {
    ADD_FAILURE() << "metrics_oracle.py " << command << " failed:\n" << read_file(err) << output;
    return nullptr;
  }
  auto parsed = nlohmann::json::parse(output, nullptr, false);
  if (parsed.is_discarded()) ADD_FAILURE() << "oracle printed no JSON:\n" << output;
  return parsed.is_discarded() ? nlohmann::json(nullptr) : parsed;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace colossus::metrics::testing
