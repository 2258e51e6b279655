#include "pdtrain/pd/parameter_service.hpp"

#include <cstring>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

UpdateInfo ParameterService::finish_fetch(Ticket ticket) {
  PDT_CHECK(!queued_.empty() && queued_.front().ticket == ticket,
            "fetches must finish in the order they were started");
  const Queued q = std::move(queued_.front());
  queued_.pop_front();
  return fetch(q.version, q.blocks, q.sink);
}

ParameterService::PushTicket ParameterService::start_push_from(
    std::int64_t step, const std::vector<int>& blocks, const std::vector<ConstBlockPlace>& places) {
  PDT_CHECK(places.size() == blocks.size(), "a push needs one place per block");
  std::int64_t bytes = 0;
  for (const ConstBlockPlace& p : places) bytes += p.bytes();
  std::vector<float> packed(static_cast<std::size_t>(bytes) / sizeof(float));
  char* to = reinterpret_cast<char*>(packed.data());
  for (const ConstBlockPlace& p : places) to = pack_rows(p, to);
  push(step, blocks, packed.data());
  return next_push_++;
}

}  // namespace pdtrain
