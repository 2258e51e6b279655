#include "pdtrain/core/signals.hpp"

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

// Why a thread of its own: a stop signal delivered to whatever thread was running interrupted
// MPI in the middle of its work (Open MPI's progress engine, its event threads), and about one
// SIGUSR1 run in twenty then crashed a compute rank with a corrupted heap inside MPI (measured
// with tests/cli/check_signal.sh; none in 80 runs stopped the same way without a signal).
// Blocked in every thread we start and in those MPI_Init and the libraries start later (the mask
// is set first thing in main, and threads inherit it), the signals are taken by sigwait() here,
// and the work is not interrupted by them. Threads that a library started before main (OpenBLAS
// starts its pool when it is loaded) still have them unblocked: a handler that sets the same
// flag serves those.
namespace {
// Set by the first stop signal; later ones change nothing (a stop is under way, and a
// scheduler and a launcher may each send one).
std::atomic<bool> g_stop{false};  // lock-free: safe to set in a signal handler
static_assert(std::atomic<bool>::is_always_lock_free);
// Whether SIGTERM and SIGINT stop training (after install_stop_signals) or end the process as
// their default action would (a command, or setup, before training starts).
std::atomic<bool> g_term_stops{false};

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaddset(&set, sig);
  return set;
}

// Ends the process by `sig`'s default action, as if it had never been blocked.
[[noreturn]] void die_of(int sig) {
  std::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);  // to this thread, which now takes it: the default action ends the process
  std::_Exit(128 + sig);
}

extern "C" void on_stop_signal(int) { g_stop.store(true); }

void catch_stop_signal(int sig) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  PDT_CHECK(sigaction(sig, &sa, nullptr) == 0, "cannot install the handler of signal " +
                                                   std::to_string(sig) + ": " +
                                                   std::strerror(errno));
}

void take_stop_signals() {
  const sigset_t set = stop_signals();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig == SIGUSR1 || g_term_stops.load()) {
      g_stop.store(true);
    } else {
      die_of(sig);
    }
  }
}
}  // namespace

void catch_usr1_from_start() {
  const sigset_t set = stop_signals();
  const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr);
  PDT_CHECK(rc == 0, std::string("cannot block the stop signals: ") + std::strerror(rc));
  std::thread(take_stop_signals).detach();
  catch_stop_signal(SIGUSR1);
}

void install_stop_signals() {
  g_term_stops.store(true);
  catch_stop_signal(SIGTERM);
  catch_stop_signal(SIGINT);
}

bool stop_signal_received() { return g_stop.load(); }

void request_stop_for_testing() { g_stop.store(true); }

}  // namespace pdtrain
