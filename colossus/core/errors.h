// Exception types for user-facing errors. Each message names the bad value and
// what would be valid; the CLI turns them into one line and an exit code.
#pragma once
#include <stdexcept>
#include <string>

namespace colossus {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ConfigError : Error {
  using Error::Error;
};
struct DistError : Error {
  using Error::Error;
};
struct CheckpointError : Error {
  using Error::Error;
};
struct LaunchError : Error {
  using Error::Error;
};

}  // namespace colossus
