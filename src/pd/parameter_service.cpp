#include "pdtrain/pd/parameter_service.hpp"

#include "pdtrain/core/error.hpp"

namespace pdtrain {

UpdateInfo ParameterService::finish_fetch(Ticket ticket) {
  PDT_CHECK(!queued_.empty() && queued_.front().ticket == ticket,
            "fetches must finish in the order they were started");
  const Queued q = std::move(queued_.front());
  queued_.pop_front();
  return fetch(q.version, q.blocks, q.sink);
}

}  // namespace pdtrain
