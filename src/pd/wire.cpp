#include "pdtrain/pd/wire.hpp"

#include <cstring>
#include <limits>

#include "pdtrain/core/error.hpp"

namespace pdtrain::wire {

std::vector<char> request_message(const FetchRequest& head, const std::vector<int>& ids) {
  std::vector<char> m(sizeof(head) + ids.size() * sizeof(std::int32_t));
  std::memcpy(m.data(), &head, sizeof(head));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto id = static_cast<std::int32_t>(ids[i]);
    std::memcpy(m.data() + sizeof(head) + i * sizeof(id), &id, sizeof(id));
  }
  return m;
}

PushView::PushView(std::span<const char> msg, const std::string& from)
    : HeadedView(msg, true, "push header", from) {
  for (std::int64_t i = 0; i < n(); ++i) {
    const std::int64_t b = entry(i).bytes;
    PDT_CHECK(b >= 0 && b <= std::numeric_limits<int>::max() - payload_bytes_,
              "malformed push header from " + from + ": block of " + std::to_string(b) +
                  " bytes");
    payload_bytes_ += b;
  }
}

ReplyView::ReplyView(std::span<const char> msg, Payloads payloads, const std::string& from)
    : HeadedView(msg, payloads == Payloads::apart, "fetch reply", from) {
  std::size_t at = header_bytes();
  for (std::int64_t i = 0; i < n(); ++i) {
    const std::int64_t b = entry(i).bytes;
    PDT_CHECK(b >= 0 && b <= std::numeric_limits<int>::max(),
              "malformed fetch reply from " + from + ": block of " + std::to_string(b) +
                  " bytes");
    if (payloads == Payloads::apart) continue;
    PDT_CHECK(static_cast<std::uint64_t>(b) <= msg.size() - at,
              "relayed fetch reply shorter than its headers say");
    at += static_cast<std::size_t>(b);
  }
}

}  // namespace pdtrain::wire
