#include "tests/apps/oracle_runs.h"

#include "tests/testing/command.h"
#include "tests/testing/testing.h"

#include <fmt/format.h>

#include <stdexcept>

namespace colossus::testing {

namespace fs = std::filesystem;

fs::path run_oracle_once(const std::string& area, const std::string& name, const std::string& python,
                         const std::string& script, const std::string& done_file, const std::string& env) {
  auto group = world();
  const fs::path out = job_scratch_dir(area) / name;
  std::string failure;
  if (group->rank() == 0 && !fs::exists(out / done_file)) {
    const auto result =
        run_command(fmt::format("{}{}'{}' '{}' '{}' 2>&1", env, env.empty() ? "" : " ", python, script, out.string()));
    if (result.exit_code != 0) failure = result.output;
  }
  group->barrier().wait();
  if (!failure.empty()) throw std::runtime_error(fs::path(script).filename().string() + " failed:\n" + failure);
  return out;
}

fs::path fresh_job_dir(const std::string& area, const std::string& name) {
  auto group = world();
  const fs::path dir = job_scratch_dir(area) / name;
  if (group->rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  group->barrier().wait();
  return dir;
}

}  // namespace colossus::testing
