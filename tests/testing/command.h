// Running a shell command from a test (the Python oracles, the colossus CLI)
// and a scratch directory per test process: shared so each test area does not
// carry its own popen loop and temp-dir class.
#pragma once
#include <filesystem>
#include <string>

namespace colossus::testing {

struct CommandResult {
  int exit_code = 0;   // 128 + signal when the command was killed; 127 if it could not start
  std::string output;  // stdout (add 2>&1 to the command for stderr too)
};

CommandResult run_command(const std::string& command);

// `<tmp>/colossus_<area>_test_XXXXXX` (mkdtemp), created on first use and removed at
// exit, unless COLOSSUS_KEEP_TEST_FILES is set (to look at plots, event files).
const std::filesystem::path& scratch_dir(const std::string& area);

}  // namespace colossus::testing
