#include "launcher_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace colossus::launcher::testing {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string read_file(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string temp_path(const std::string& stem) {
  std::string pattern = std::filesystem::temp_directory_path().string() + "/" + stem + "-XXXXXX";
  int fd = ::mkstemp(pattern.data());
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  ::close(fd);
  return pattern;
}

}  // namespace

std::string launcher_binary() {
  if (const char* bin = std::getenv("COLOSSUS_BIN"); bin != nullptr && *bin != '\0') return bin;
  return COLOSSUS_LAUNCHER_TEST_BIN;
}

LauncherProcess::LauncherProcess(const std::vector<std::string>& args,
                                 const std::map<std::string, std::string>& extra_env)
    : out_path_(temp_path("launcher-out")), err_path_(temp_path("launcher-err")) {
  std::string binary = launcher_binary();
  std::vector<std::string> argv{binary};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (auto& arg : argv) c_argv.push_back(arg.data());
  c_argv.push_back(nullptr);
  started_ = now_seconds();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    for (const auto& [name, value] : extra_env) ::setenv(name.c_str(), value.c_str(), 1);
    int out = ::open(out_path_.c_str(), O_WRONLY | O_TRUNC);
    int err = ::open(err_path_.c_str(), O_WRONLY | O_TRUNC);
    int null = ::open("/dev/null", O_RDONLY);
    ::dup2(null, STDIN_FILENO);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::execv(binary.c_str(), c_argv.data());
    ::_exit(127);
  }
}

LauncherProcess::~LauncherProcess() {
  if (!waited_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  ::unlink(out_path_.c_str());
  ::unlink(err_path_.c_str());
}

LauncherResult LauncherProcess::wait(double timeout_s) {
  LauncherResult result;
  int status = 0;
  double deadline = started_ + timeout_s;
  while (true) {
    pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) break;
    if (now_seconds() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      status = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  waited_ = true;
  result.seconds = now_seconds() - started_;
  if (status == -1) {
    result.exit_code = -1;
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  result.out = read_file(out_path_);
  result.err = read_file(err_path_);
  return result;
}

LauncherResult run_launcher(const std::vector<std::string>& args, const std::map<std::string, std::string>& extra_env,
                            double timeout_s) {
  LauncherProcess process(args, extra_env);
  return process.wait(timeout_s);
}

ScratchDir::ScratchDir() {
  std::string pattern = std::filesystem::temp_directory_path().string() + "/launcher-test-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

int wait_for_pid_file(const std::string& path, double timeout_s) {
  double deadline = now_seconds() + timeout_s;
  while (now_seconds() < deadline) {
    std::string text = read_file(path);
    if (text.find('\n') != std::string::npos) return std::atoi(text.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close_paren = stat.rfind(')');
  return close_paren == std::string::npos || stat.substr(close_paren + 2, 1) == "Z";
}

bool wait_until_gone(pid_t pid, double timeout_s) {
  double deadline = now_seconds() + timeout_s;
  while (now_seconds() < deadline) {
    if (process_gone(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return process_gone(pid);
}

namespace {

std::vector<pid_t> all_processes() {
  std::vector<pid_t> pids;
  std::error_code error;  // processes come and go while we list them
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (!name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      pids.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return pids;
}

}  // namespace

std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> children;
  for (pid_t candidate : all_processes()) {
    std::string stat = read_file("/proc/" + std::to_string(candidate) + "/stat");
    auto close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    // After ")": state, then the parent's pid.
    std::istringstream fields(stat.substr(close_paren + 2));
    std::string state;
    pid_t parent = 0;
    if (fields >> state >> parent && parent == pid) children.push_back(candidate);
  }
  return children;
}

int processes_naming(const std::string& marker) {
  int count = 0;
  for (pid_t pid : all_processes()) {
    std::string cmdline = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    if (cmdline.find(marker) != std::string::npos && !process_gone(pid)) ++count;
  }
  return count;
}

void kill_processes_naming(const std::string& marker) {
  for (pid_t pid : all_processes()) {
    if (pid == ::getpid()) continue;
    std::string cmdline = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    if (cmdline.find(marker) != std::string::npos) ::kill(pid, SIGKILL);
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

}  // namespace colossus::launcher::testing
