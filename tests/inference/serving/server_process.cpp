// See server_process.h.
#include "tests/inference/serving/server_process.h"

#include <fmt/format.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace colossus::inference::testing {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

ServerProcess::ServerProcess(const std::string& model_dir, const std::vector<std::string>& args,
                             const std::filesystem::path& log, double timeout_s)
    : log_(log) {
  std::vector<std::string> argv_strings{COLOSSUS_BIN, "serve", model_dir, "--host", "127.0.0.1", "--port", "0"};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error(fmt::format("cannot start {}: error {}", COLOSSUS_BIN, rc));

  // Readiness: the log names the port, then /health answers.
  const auto start = Clock::now();
  const std::regex serving(R"(serving '.*' on http://127\.0\.0\.1:(\d+))");
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("colossus serve exited before it was ready:\n" + this->log());
    }
    if (port_ == 0) {
      std::smatch match;
      const std::string text = this->log();
      if (std::regex_search(text, match, serving)) port_ = std::stoi(match[1]);
    }
    if (port_ != 0) {
      httplib::Client client("127.0.0.1", port_);
      client.set_connection_timeout(1);
      if (auto res = client.Get("/health"); res && res->status == 200) return;
    }
    if (seconds_since(start) > timeout_s) {
      stop(SIGKILL, 5);
      throw std::runtime_error(fmt::format("colossus serve was not ready after {} s:\n{}", timeout_s, this->log()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) stop(SIGKILL, 5);
}

std::string ServerProcess::url() const { return fmt::format("http://127.0.0.1:{}", port_); }

std::string ServerProcess::log() const {
  std::ifstream in(log_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int ServerProcess::stop(int sig, double timeout_s) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  const auto start = Clock::now();
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (seconds_since(start) > timeout_s) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      pid_ = -1;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace colossus::inference::testing
