// Helpers for the metrics tests: a scratch folder per test process and the
// Python oracle (metrics_oracle.py in the project's venv) returning JSON.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace colossus::metrics::testing {

// A fresh folder for this test process, removed at exit (kept with COLOSSUS_KEEP_TEST_FILES=1).
const std::filesystem::path& scratch_dir();

// Runs `metrics_oracle.py <command> <path>`; fails the test (and returns null)
// when it exits non-zero or prints no JSON.
nlohmann::json run_oracle(const std::string& command, const std::filesystem::path& path);

// Whole file as a string.
std::string read_file(const std::filesystem::path& path);

}  // namespace colossus::metrics::testing
