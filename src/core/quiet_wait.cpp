#include "pdtrain/core/quiet_wait.hpp"

#include <thread>

#include <time.h>

#include <algorithm>

#include "pdtrain/core/mpi_check.hpp"

namespace pdtrain {

void Backoff::pause() {
  // A few immediate re-polls keep latency low when the answer is imminent; after that the
  // sleep grows to 200 us, which costs little latency against millisecond steps and frees the
  // core for the ranks that compute.
  ++idle_polls_;
  if (idle_polls_ < 16) return;
  const long ns = std::min(200000L, 1000L * (1L << std::min(idle_polls_ - 16, 8)));
  timespec ts{0, ns};
  nanosleep(&ts, nullptr);
}

void wait_quietly(MPI_Request* req, MPI_Status* status) {
  Backoff backoff;
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Test(req, &done, status));
    if (done) return;
    backoff.pause();
  }
}

void wait_all_quietly(int n, MPI_Request* reqs) {
  Backoff backoff;
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    backoff.pause();
  }
}

void wait_yielding(MPI_Request* req, MPI_Status* status) {
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Test(req, &done, status));
    if (done) return;
    std::this_thread::yield();
  }
}

void wait_all_yielding(int n, MPI_Request* reqs) {
  for (;;) {
    int done = 0;
    MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) return;
    std::this_thread::yield();
  }
}

}  // namespace pdtrain
