#include "pdtrain/pd/wire.hpp"

#include <cstring>
#include <limits>

#include "pdtrain/core/error.hpp"

namespace pdtrain::wire {

namespace {

template <class Head>
Head read_head(std::span<const char> msg, const char* what, const std::string& from) {
  PDT_CHECK(msg.size() >= sizeof(Head), std::string("short ") + what + " from " + from);
  Head h;
  std::memcpy(&h, msg.data(), sizeof(h));
  return h;
}

// Whether `n` entries of `entry` bytes after the header fit in `size` bytes (exactly, or at
// least); n < 0 never does.
bool fits(std::size_t size, std::size_t head, std::int64_t n, std::size_t entry, bool exactly) {
  if (n < 0 || static_cast<std::uint64_t>(n) > (size - head) / entry) return false;
  const std::size_t used = head + static_cast<std::size_t>(n) * entry;
  return exactly ? used == size : used <= size;
}

BlockHeader block_at(std::span<const char> msg, std::size_t head, std::int64_t i) {
  BlockHeader b;
  std::memcpy(&b, msg.data() + head + static_cast<std::size_t>(i) * sizeof(b), sizeof(b));
  return b;
}

}  // namespace

std::vector<char> request_message(const FetchRequest& head, const std::vector<int>& ids) {
  std::vector<char> m(sizeof(head) + ids.size() * sizeof(std::int32_t));
  std::memcpy(m.data(), &head, sizeof(head));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto id = static_cast<std::int32_t>(ids[i]);
    std::memcpy(m.data() + sizeof(head) + i * sizeof(id), &id, sizeof(id));
  }
  return m;
}

RequestView::RequestView(std::span<const char> msg, const std::string& from)
    : msg_(msg), head_(read_head<FetchRequest>(msg, "fetch request", from)) {
  PDT_CHECK(fits(msg.size(), sizeof(head_), head_.n, sizeof(std::int32_t), true),
            "malformed fetch request from " + from + ": " + std::to_string(head_.n) +
                " blocks in " + std::to_string(msg.size()) + " bytes");
}

std::int32_t RequestView::id(std::int64_t i) const {
  std::int32_t id = 0;
  std::memcpy(&id, msg_.data() + sizeof(head_) + static_cast<std::size_t>(i) * sizeof(id),
              sizeof(id));
  return id;
}

PushView::PushView(std::span<const char> msg, const std::string& from)
    : msg_(msg), head_(read_head<PushHeader>(msg, "push header", from)) {
  PDT_CHECK(fits(msg.size(), sizeof(head_), head_.n, sizeof(BlockHeader), true),
            "malformed push header from " + from);
  for (std::int64_t i = 0; i < head_.n; ++i) {
    const std::int64_t b = block(i).bytes;
    PDT_CHECK(b >= 0 && b <= std::numeric_limits<int>::max() - payload_bytes_,
              "malformed push header from " + from + ": block of " + std::to_string(b) +
                  " bytes");
    payload_bytes_ += b;
  }
}

BlockHeader PushView::block(std::int64_t i) const { return block_at(msg_, sizeof(head_), i); }

ReplyView::ReplyView(std::span<const char> msg, Payloads payloads, const std::string& from)
    : msg_(msg), head_(read_head<ReplyHeader>(msg, "fetch reply", from)) {
  const bool apart = payloads == Payloads::apart;
  PDT_CHECK(fits(msg.size(), sizeof(head_), head_.n, sizeof(BlockHeader), apart),
            "malformed fetch reply header from " + from);
  std::size_t at = header_bytes();
  for (std::int64_t i = 0; i < head_.n; ++i) {
    const std::int64_t b = block(i).bytes;
    PDT_CHECK(b >= 0 && b <= std::numeric_limits<int>::max(),
              "malformed fetch reply from " + from + ": block of " + std::to_string(b) +
                  " bytes");
    if (apart) continue;
    PDT_CHECK(static_cast<std::uint64_t>(b) <= msg.size() - at,
              "relayed fetch reply shorter than its headers say");
    at += static_cast<std::size_t>(b);
  }
}

BlockHeader ReplyView::block(std::int64_t i) const { return block_at(msg_, sizeof(head_), i); }

std::size_t ReplyView::header_bytes() const {
  return sizeof(head_) + static_cast<std::size_t>(head_.n) * sizeof(BlockHeader);
}

}  // namespace pdtrain::wire
