#include "world/stop_signals.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace tandem {

namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};
std::atomic<int> first_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");

void on_stop_signal(int signal) {
  int expected = 0;
  if (first_signal.compare_exchange_strong(expected, signal)) return;
  // The second signal: only async-signal-safe calls from here on.
  constexpr char message[] = "tandem: a second stop signal: ending now, without a checkpoint\n";
  [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, message, sizeof message - 1);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

}  // namespace

void install_stop_signals() {
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // Restart interrupted system calls: the job goes on to the step boundary.
  action.sa_flags = SA_RESTART;
  for (int signal : kStopSignals) sigaction(signal, &action, nullptr);
}

int stop_signal_received() { return first_signal.load(); }

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
  }
  return "signal " + std::to_string(signal);
}

}  // namespace tandem
