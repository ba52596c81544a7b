// The real `colossus serve` binary as a child process for the server tests:
// started on a free loopback port (--port 0; the port is read from its log),
// ready once GET /health answers, stopped with a signal.
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace colossus::inference::testing {

class ServerProcess {
 public:
  // Runs `colossus serve MODEL_DIR --host 127.0.0.1 --port 0 <args>` with its
  // stderr in `log`, and waits (up to timeout_s) until /health answers 200.
  // Throws std::runtime_error with the log when it exits or times out first.
  ServerProcess(const std::string& model_dir, const std::vector<std::string>& args, const std::filesystem::path& log,
                double timeout_s = 60);
  ~ServerProcess();  // SIGKILLs it if still running
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  std::string url() const;  // http://127.0.0.1:PORT
  std::string log() const;
  // Sends `sig` and waits up to timeout_s; returns the exit status
  // (128 + signal when killed by one), or -1 after a timeout (then SIGKILLs it).
  int stop(int sig, double timeout_s = 20);

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::filesystem::path log_;
};

}  // namespace colossus::inference::testing
