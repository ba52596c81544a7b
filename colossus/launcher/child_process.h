// Starting the processes the launcher supervises. Each child leads its own
// process group, so one signal reaches everything it started; it gets a
// parent-death signal, so it does not outlive a launcher that was killed; and
// its stdout/stderr come back on pipes for prefixing.
#pragma once
#include "colossus/launcher/exit_status.h"
#include "colossus/launcher/fd.h"

#include <sys/types.h>

#include <csignal>
#include <optional>
#include <string>
#include <vector>

namespace colossus::launcher {

struct SpawnSpec {
  std::string path{};               // absolute path of the executable
  std::vector<std::string> argv{};  // argv[0] is the name the program sees
  std::vector<std::string> env{};   // the whole environment, "NAME=value"
  bool stdin_pipe = false;          // false: stdin is /dev/null
  int death_signal = SIGKILL;       // what the child gets when the launcher dies
};

struct Child {
  pid_t pid = -1;  // also its process group id
  Fd stdin_fd;     // our end of its stdin (only with stdin_pipe)
  Fd stdout_fd;
  Fd stderr_fd;
};

// Throws LaunchError when fork fails. A failing exec shows up as the child
// printing why on its stderr and exiting 127, as a shell does.
Child spawn_child(const SpawnSpec& spec);

// kill(-group, sig), ignoring a group that is already gone.
void signal_group(pid_t group, int signal_number);
// The status if `pid` has ended (reaping it); nullopt while it runs.
std::optional<ExitStatus> try_reap(pid_t pid);

// Absolute path of `program`: as given when it contains '/', else the first
// executable match on $PATH. Throws ConfigError saying which check failed.
std::string resolve_program(const std::string& program);
// Path of the running executable (/proc/self/exe), used to start `colossus`
// again (node launchers, the MPI rank wrapper).
std::string self_executable();

// Runs a short command with output discarded and returns whether it exited 0
// (nvidia-smi -L, to see whether a GPU is there).
bool runs_successfully(const std::string& path, const std::vector<std::string>& argv);

}  // namespace colossus::launcher
