#include "tests/testing/command.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace colossus::testing {

namespace fs = std::filesystem;

CommandResult run_command(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {127, "popen failed for: " + command};
  std::string output;
  std::array<char, 4096> buffer{};
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  if (WIFEXITED(status)) return {WEXITSTATUS(status), output};
  return {WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 127, output};
}

namespace {

struct ScratchDir {
  fs::path path;
  // mkdtemp: a name nobody can predict and take first, made with mode 0700.
  explicit ScratchDir(const std::string& area) {
    std::string pattern = (fs::temp_directory_path() / fmt::format("colossus_{}_test_XXXXXX", area)).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path = pattern;
  }
  ~ScratchDir() {
    if (std::getenv("COLOSSUS_KEEP_TEST_FILES") != nullptr) return;
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

const fs::path& scratch_dir(const std::string& area) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<ScratchDir>> dirs;
  std::lock_guard<std::mutex> lock(mutex);
  auto& dir = dirs[area];
  if (!dir) dir = std::make_unique<ScratchDir>(area);
  return dir->path;
}

}  // namespace colossus::testing
