#include "pdtrain/core/test_hooks.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace pdtrain::test_hooks {

namespace {
std::mutex g_write_hook_mutex;
std::function<void(std::string_view)> g_write_hook;
}  // namespace

// Read at each call (not cached): MPI tests change them between runs in one process.
std::optional<int> ranks_per_node() {
  const char* k = std::getenv("PDTRAIN_TEST_RANKS_PER_NODE");
  if (!k) return std::nullopt;
  return std::max(1, std::atoi(k));
}

std::optional<std::int64_t> flip_fetch_bit_at_version() {
  const char* v = std::getenv("PDTRAIN_TEST_FLIP_FETCH_BIT");
  if (!v) return std::nullopt;
  return std::atoll(v);
}

void set_checkpoint_write_hook(std::function<void(std::string_view point)> hook) {
  std::lock_guard<std::mutex> lock(g_write_hook_mutex);
  g_write_hook = std::move(hook);
}

void checkpoint_write_point(std::string_view point) {
  std::function<void(std::string_view)> hook;
  {
    std::lock_guard<std::mutex> lock(g_write_hook_mutex);
    hook = g_write_hook;
  }
  if (hook) hook(point);  // outside the lock: the hook may end the process
}

void stall_point(std::string_view point) {
  const char* v = std::getenv("PDTRAIN_TEST_STALL");
  if (!v) return;
  const std::string spec(v);
  const std::size_t colon = spec.find(':');
  if (colon == std::string::npos) return;
  const std::size_t count_colon = spec.find(':', colon + 1);
  if (spec.substr(colon + 1, count_colon - colon - 1) != point) return;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (std::atoi(spec.substr(0, colon).c_str()) != rank) return;
  static int reached = 0;  // the one point a run stalls at: its calls so far
  const int nth = count_colon == std::string::npos ? 1 : std::atoi(spec.c_str() + count_colon + 1);
  if (++reached < nth) return;
  std::fprintf(stderr, "pdtrain: test hook: rank %d stalls at %s\n", rank, v + colon + 1);
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace pdtrain::test_hooks
