#include "pdtrain/core/signals.hpp"

#include <csignal>

namespace pdtrain {

namespace {
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int) { g_stop = 1; }
}  // namespace

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool stop_signal_received() { return g_stop != 0; }
void request_stop_for_testing() { g_stop = 1; }

}  // namespace pdtrain
