#include "train/stop_signals.h"
#include <cstring>
#include <unistd.h>

namespace flashgpt {
namespace {

constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGUSR1};
volatile std::sig_atomic_t g_requested = 0;

// Async-signal-safe: a flag, or write(2) and _exit(2).
void on_signal(int sig) {
  if (g_requested == 0) {
    g_requested = sig;
    return;
  }
  const char msg[] = "\nsecond signal: stopping now, without a checkpoint\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
  ::_exit(128 + sig);
}

}  // namespace

StopSignals::StopSignals() {
  g_requested = 0;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a write or read in progress goes on
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old_[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
}

int StopSignals::requested() const { return int(g_requested); }

const char* StopSignals::name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
  }
  return "a signal";
}

}  // namespace flashgpt
