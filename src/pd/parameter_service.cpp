#include "pdtrain/pd/parameter_service.hpp"

#include <algorithm>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

UpdateInfo ParameterService::finish_fetch(Ticket ticket) {
  PDT_CHECK(!queued_.empty() && queued_.front().ticket == ticket,
            "fetches must finish in the order they were started");
  const Queued q = std::move(queued_.front());
  queued_.pop_front();
  return fetch(q.version, q.blocks, q.sink);
}

ParameterService::PushTicket ParameterService::start_push_tiles(
    std::int64_t step, const std::vector<int>& blocks, const std::vector<GradTile>& tiles) {
  std::vector<float> packed;
  for (const GradTile& t : tiles)
    for (std::int64_t r = 0; r < t.rows; ++r)
      packed.insert(packed.end(), t.data + r * t.ld, t.data + r * t.ld + t.cols);
  push(step, blocks, packed.data());
  return next_push_++;
}

}  // namespace pdtrain
