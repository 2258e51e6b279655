#include "pdtrain/core/signals.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

namespace {
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};
// Set by the first stop signal; later ones change nothing (a stop is under way, and a
// scheduler and a launcher may each send one).
volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_stop_signal(int) { g_stop = 1; }

void catch_stop_signal(int sig) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  PDT_CHECK(sigaction(sig, &sa, nullptr) == 0, "cannot install the handler of signal " +
                                                   std::to_string(sig) + ": " +
                                                   std::strerror(errno));
}
}  // namespace

void catch_usr1_from_start() { catch_stop_signal(SIGUSR1); }

void install_stop_signals() {
  for (int sig : kStopSignals) catch_stop_signal(sig);
}

bool stop_signal_received() { return g_stop != 0; }

void request_stop_for_testing() { g_stop = 1; }

}  // namespace pdtrain
