// How a rank (or node, or mpirun) ended, and the words and exit code the
// launcher uses for it: "exited with code 3" -> 3, "was killed by signal 11
// (SIGSEGV)" -> 139 (the shell's 128+signal convention).
#pragma once
#include <string>

namespace colossus::launcher {

struct ExitStatus {
  enum class Kind { Code, Signal, Lost };
  Kind kind = Kind::Code;
  int value = 0;  // exit code or signal number; unused for Lost

  static ExitStatus code(int exit_code) { return {Kind::Code, exit_code}; }
  static ExitStatus signal(int signal_number) { return {Kind::Signal, signal_number}; }
  // The process ended but nobody could observe how (an MPI rank's wrapper
  // vanished without reporting).
  static ExitStatus lost() { return {Kind::Lost, 0}; }
  // From a waitpid() status.
  static ExitStatus from_wait(int wait_status);

  bool success() const { return kind == Kind::Code && value == 0; }
  // What the launcher exits with when this status decides the job.
  int shell_code() const;
  // "exited with code 3" | "was killed by signal 11 (SIGSEGV)" | "ended without reporting its exit status"
  std::string describe() const;

  // Wire form for the rank channel: "code 3", "signal 11", "lost".
  std::string encode() const;
  // Throws LaunchError on anything encode() does not produce.
  static ExitStatus decode(const std::string& text);
};

// "SIGSEGV" for 11; "signal 77" for numbers without a name.
std::string signal_name(int signal_number);

}  // namespace colossus::launcher
