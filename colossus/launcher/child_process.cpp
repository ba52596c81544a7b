#include "colossus/launcher/child_process.h"

#include "colossus/core/errors.h"
#include "colossus/launcher/signals.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace colossus::launcher {

namespace {

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const auto& text : strings) pointers.push_back(const_cast<char*>(text.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

// Between fork and exec only async-signal-safe calls are allowed, so the
// error message is assembled with plain writes.
[[noreturn]] void exec_failed(const char* path) {
  const char* reason = std::strerror(errno);
  const char* parts[] = {"colossus: cannot execute ", path, ": ", reason, "\n"};
  for (const char* part : parts) {
    if (::write(STDERR_FILENO, part, std::strlen(part)) < 0) break;
  }
  ::_exit(127);
}

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

Child spawn_child(const SpawnSpec& spec) {
  Pipe out = make_pipe();
  Pipe err = make_pipe();
  Pipe in;
  if (spec.stdin_pipe) in = make_pipe();
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) throw LaunchError(fmt::format("cannot start {}: fork failed: {}", spec.path, std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, spec.death_signal);
    // The launcher may have died before prctl took effect.
    if (::getppid() != parent) ::_exit(128 + spec.death_signal);
    reset_signals_for_exec();
    int stdin_source = spec.stdin_pipe ? in.read.get() : ::open("/dev/null", O_RDONLY);
    ::dup2(stdin_source, STDIN_FILENO);
    ::dup2(out.write.get(), STDOUT_FILENO);
    ::dup2(err.write.get(), STDERR_FILENO);
    ::execve(spec.path.c_str(), argv.data(), envp.data());
    exec_failed(spec.path.c_str());
  }
  // Also set here, so a signal to the group right after fork cannot miss it.
  ::setpgid(pid, pid);
  Child child;
  child.pid = pid;
  child.stdout_fd = std::move(out.read);
  child.stderr_fd = std::move(err.read);
  if (spec.stdin_pipe) child.stdin_fd = std::move(in.write);
  return child;
}

void signal_group(pid_t group, int signal_number) {
  if (group > 0) ::kill(-group, signal_number);
}

std::optional<ExitStatus> try_reap(pid_t pid) {
  int status = 0;
  while (true) {
    pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return ExitStatus::from_wait(status);
    if (done == 0) return std::nullopt;
    if (errno == EINTR) continue;
    return ExitStatus::lost();  // not our child any more (ECHILD)
  }
}

std::string resolve_program(const std::string& program) {
  if (program.empty()) throw ConfigError("the program to run is an empty string; give a program name or path");
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), F_OK) != 0) {
      throw ConfigError(fmt::format("program '{}' does not exist", program));
    }
    if (!is_executable_file(program)) {
      throw ConfigError(fmt::format("program '{}' is not an executable file (check its permissions)", program));
    }
    char* absolute = ::realpath(program.c_str(), nullptr);
    std::string resolved = absolute != nullptr ? absolute : program;
    std::free(absolute);
    return resolved;
  }
  const char* path_env = std::getenv("PATH");
  std::string search = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= search.size()) {
    size_t end = search.find(':', start);
    if (end == std::string::npos) end = search.size();
    std::string dir = search.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  throw ConfigError(fmt::format("program '{}' was not found on PATH ({}); give its path or fix PATH", program, search));
}

std::string self_executable() {
  char buffer[4096];
  ssize_t length = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (length <= 0) throw LaunchError(fmt::format("cannot read /proc/self/exe: {}", std::strerror(errno)));
  return std::string(buffer, static_cast<size_t>(length));
}

bool runs_successfully(const std::string& path, const std::vector<std::string>& argv) {
  auto args = c_strings(argv);
  pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, STDIN_FILENO);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    ::execv(path.c_str(), args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace colossus::launcher
