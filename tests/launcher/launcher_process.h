// Runs the launcher binary as a user would (fork/exec, output to files) for
// the process tests, with a timeout so a broken launcher fails a test instead
// of hanging it.
#pragma once
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace colossus::launcher::testing {

struct LauncherResult {
  int exit_code = -1;  // 128+signal when the launcher itself died by a signal
  std::string out;
  std::string err;
  double seconds = 0;
};

// The binary under test: $COLOSSUS_BIN when set (e.g. the real `colossus`),
// else the launcher-only test binary.
std::string launcher_binary();

class LauncherProcess {
 public:
  // Starts `<binary> args...` with `extra_env` added to ours.
  LauncherProcess(const std::vector<std::string>& args, const std::map<std::string, std::string>& extra_env = {});
  ~LauncherProcess();
  pid_t pid() const { return pid_; }
  // Waits up to timeout_s (then SIGKILLs it and reports exit_code -1).
  LauncherResult wait(double timeout_s = 60);

 private:
  pid_t pid_ = -1;
  std::string out_path_;
  std::string err_path_;
  double started_ = 0;
  bool waited_ = false;
};

LauncherResult run_launcher(const std::vector<std::string>& args,
                            const std::map<std::string, std::string>& extra_env = {}, double timeout_s = 60);

// A fresh directory for pid files and such, removed with its contents.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Waits until the file exists and holds a line; returns its first integer or -1 on timeout.
int wait_for_pid_file(const std::string& path, double timeout_s = 30);
// True when `pid` no longer runs (gone, or a zombie nobody reaped yet).
bool process_gone(pid_t pid);
// Polls process_gone for up to timeout_s.
bool wait_until_gone(pid_t pid, double timeout_s = 10);
// Processes whose parent is `pid`.
std::vector<pid_t> children_of(pid_t pid);
// Live processes (not zombies) whose command line contains `marker`.
int processes_naming(const std::string& marker);
// SIGKILLs them: what a failed test leaves behind.
void kill_processes_naming(const std::string& marker);
// Lines of `text`, without their newlines.
std::vector<std::string> lines_of(const std::string& text);

}  // namespace colossus::launcher::testing
