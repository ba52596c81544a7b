#include "colossus/launcher/exit_status.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <cstring>
#include <stdexcept>

namespace colossus::launcher {

ExitStatus ExitStatus::from_wait(int wait_status) {
  if (WIFEXITED(wait_status)) return code(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return signal(WTERMSIG(wait_status));
  return lost();
}

int ExitStatus::shell_code() const {
  switch (kind) {
    case Kind::Code:
      return value;
    case Kind::Signal:
      return 128 + value;
    case Kind::Lost:
      return 1;
  }
  return 1;
}

std::string ExitStatus::describe() const {
  switch (kind) {
    case Kind::Code:
      return fmt::format("exited with code {}", value);
    case Kind::Signal:
      return fmt::format("was killed by signal {} ({})", value, signal_name(value));
    case Kind::Lost:
      return "ended without reporting its exit status";
  }
  return "ended";
}

std::string ExitStatus::encode() const {
  switch (kind) {
    case Kind::Code:
      return fmt::format("code {}", value);
    case Kind::Signal:
      return fmt::format("signal {}", value);
    case Kind::Lost:
      return "lost";
  }
  return "lost";
}

ExitStatus ExitStatus::decode(const std::string& text) {
  if (text == "lost") return lost();
  auto space = text.find(' ');
  if (space != std::string::npos) {
    std::string word = text.substr(0, space);
    std::string number = text.substr(space + 1);
    try {
      size_t used = 0;
      int value = std::stoi(number, &used);
      if (used == number.size() && word == "code") return code(value);
      if (used == number.size() && word == "signal") return signal(value);
    } catch (const std::exception&) {
    }
  }
  throw LaunchError(fmt::format("rank channel sent exit status '{}'; expected 'code N', 'signal N' or 'lost'", text));
}

std::string signal_name(int signal_number) {
  const char* abbrev = sigabbrev_np(signal_number);
  if (abbrev == nullptr) return fmt::format("signal {}", signal_number);
  return std::string("SIG") + abbrev;
}

}  // namespace colossus::launcher
