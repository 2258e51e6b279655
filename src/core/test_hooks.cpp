#include "pdtrain/core/test_hooks.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>

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

}  // namespace pdtrain::test_hooks
