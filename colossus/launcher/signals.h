// Signals as events for a poll() loop: the handlers only write the signal
// number into a pipe, and the loop reads them back. SIGPIPE is ignored while
// it lives, so a vanished reader shows up as a write error instead of death.
#pragma once
#include <vector>

namespace colossus::launcher {

class SignalPipe {
 public:
  // At most one instance at a time (the handlers share one pipe).
  explicit SignalPipe(std::vector<int> signals);
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const;            // readable when a signal arrived
  std::vector<int> drain();  // the signals received since the last call, in order

 private:
  std::vector<int> signals_;
};

// Default dispositions and an empty mask, for a child between fork and exec
// (ignored signals would otherwise stay ignored in the new program).
void reset_signals_for_exec();

}  // namespace colossus::launcher
