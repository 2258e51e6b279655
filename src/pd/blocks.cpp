#include "pdtrain/pd/blocks.hpp"

#include <exception>
#include <mutex>

#include "pdtrain/pd/holder_update.hpp"

namespace pdtrain {

std::vector<std::vector<int>> group_by_owner(const std::vector<int>& blocks,
                                             const std::vector<int>& owner, int holders) {
  std::vector<std::vector<int>> out(static_cast<std::size_t>(holders));
  for (int b : blocks) out[owner[b]].push_back(b);
  return out;
}

void fill_initial_values(const BlockTable& table, const std::vector<std::pair<int, float*>>& blocks) {
  const auto n = static_cast<std::int64_t>(blocks.size());
  auto fill = [&](std::int64_t i) { table.init(blocks[i].first, blocks[i].second); };
  // The first block on this thread alone: an init that reads a file reads it here, and its
  // errors are thrown from here.
  if (n > 0) fill(0);
  if (table.init_threads <= 1 || n <= 2) {
    for (std::int64_t i = 1; i < n; ++i) fill(i);
    return;
  }
  // The calling thread takes blocks too: init_threads - 1 workers beside it. A worker's error
  // is rethrown here (a pool's task must not throw).
  std::mutex mutex;
  std::exception_ptr error;
  WorkerPool pool(table.init_threads - 1);
  pool.run(n - 1, [&](std::int64_t i) {
    try {
      fill(i + 1);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace pdtrain
