#include "tests/metrics/test_support.h"

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

namespace {

struct ScratchDir {
  fs::path path;
  ScratchDir() : path(fs::temp_directory_path() / fmt::format("colossus_metrics_test_{}", ::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    // COLOSSUS_KEEP_TEST_FILES=1 leaves the files (plots, event files) to look at.
    if (std::getenv("COLOSSUS_KEEP_TEST_FILES") != nullptr) return;
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

const fs::path& scratch_dir() {
  static ScratchDir dir;
  return dir.path;
}

nlohmann::json run_oracle(const std::string& command, const fs::path& path) {
  // stderr stays separate so a Python traceback cannot corrupt the JSON on stdout.
  fs::path err = scratch_dir() / "oracle_stderr.txt";
  std::string line = fmt::format("'{}' '{}' {} '{}' 2>'{}'", COLOSSUS_PYTHON, COLOSSUS_METRICS_ORACLE, command,
                                 path.string(), err.string());
  FILE* pipe = ::popen(line.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << line;
    return nullptr;
  }
  std::string output;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  int status = ::pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
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
