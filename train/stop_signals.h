// A clean stop on SIGINT, SIGTERM or SIGUSR1 (what mpirun forwards to every rank): the
// first one is only noted, and the training loop finishes its step, writes a checkpoint
// and exits with 128 + the signal's number; a second one ends the process at once.
#pragma once
#include <csignal>

namespace flashgpt {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // restores the previous ones
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first signal received, or 0.
  int requested() const;
  static const char* name(int sig);  // "SIGTERM", ...

 private:
  struct sigaction old_[3];
};

}  // namespace flashgpt
