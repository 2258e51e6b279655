#pragma once
// Message formats between compute ranks and holders. Every block travels with its id, version
// and the CRC32C of its bytes; receivers check all three.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "pdtrain/core/error.hpp"

namespace pdtrain::wire {

enum Tag : int {
  kFetchRequest = 101,  // compute -> holder: FetchRequest + int32 ids[n]
  kFetchReply = 102,    // holder -> compute: ReplyHeader + BlockHeader[n], then per block with
                        // bytes > 0 one kFetchPayload message, in header order (none when
                        // the payloads lie in the holder's shared segment: ReplyHeader::shared)
  kPush = 103,          // compute -> holder: PushHeader + BlockHeader[n], then a kPushPayload
  kPushPayload = 107,   // compute -> holder: the n encoded payloads back to back, contiguous,
                        // so the holder copies it in without the pushing rank's help
  kDone = 104,          // compute -> holder: this rank has finished the run
  kFinalCrc = 105,      // holder 0 -> reporter: uint32 canonical CRC
  kRelay = 106,         // replica -> replica (data-parallel tree): one holder's fetch reply,
                        // headers and payloads back to back
  kFetchPayload = 108,  // holder -> compute: one block's encoded bytes, contiguous, so the
                        // receiver moves it alone straight into place
};

struct FetchRequest {
  std::int64_t version;
  std::int64_t n;
  std::int64_t ticket;  // chosen by the requester, echoed in the reply (several may be in flight)
};

struct WireUpdateInfo {
  std::int64_t version;
  double grad_norm;
  double lr;
};

// The holder's record of its recent updates travels with every reply, so the reporting rank
// learns every step's gradient norm and learning rate even when it fetches older versions.
inline constexpr int kMaxRecentUpdates = 4;  // staleness <= 3 keeps at most 4 versions

struct ReplyHeader {
  std::int64_t version;  // of the blocks in this reply
  std::int64_t n;        // blocks
  std::int64_t ticket;   // the request's
  std::int64_t stop;     // 1: a holder was asked to stop (signal); compute ranks end the run
  std::int64_t shared;   // 1: payloads lie in the holder's shared segment at BlockHeader::at
  std::int64_t n_recent;
  WireUpdateInfo recent[kMaxRecentUpdates];
};

struct PushHeader {
  std::int64_t step;
  std::int64_t n;
};

struct BlockHeader {
  std::int32_t id;
  std::uint32_t crc;     // CRC32C of the encoded payload as sent
  std::int64_t version;  // fetch: version of the data; push: the step it belongs to
  std::int64_t bytes;    // encoded payload size (see wire_codec.hpp)
  std::int64_t at;       // fetch reply with `shared`: offset in the holder's segment; else -1
};

// Messages as sent, laid out here only, the counterpart of the views below: kFetchRequest's
// header and ids, and a header followed by its blocks' headers (kFetchReply, kPush).
std::vector<char> request_message(const FetchRequest& head, const std::vector<int>& ids);
template <class Head>
std::vector<char> message_with_blocks(const Head& head, const std::vector<BlockHeader>& blocks) {
  std::vector<char> m(sizeof(head) + blocks.size() * sizeof(BlockHeader));
  std::memcpy(m.data(), &head, sizeof(head));
  if (!blocks.empty())
    std::memcpy(m.data() + sizeof(head), blocks.data(), blocks.size() * sizeof(BlockHeader));
  return m;
}

// Views of received messages: a `Head` (whose `n` counts its entries) followed by n `Entry`s.
// A view checks, when it is made, that the message holds them (exactly, or at least where more
// follows), and is the only reader of the message's bytes as headers; a message that does not
// fit ends the job naming `from`. The message must outlive the view.
template <class Head, class Entry>
class HeadedView {
 public:
  const Head& head() const { return head_; }
  std::int64_t n() const { return head_.n; }
  Entry entry(std::int64_t i) const {
    Entry e;
    std::memcpy(&e, msg_.data() + sizeof(Head) + static_cast<std::size_t>(i) * sizeof(Entry),
                sizeof(Entry));
    return e;
  }
  // Bytes of the head and the entries (where anything that follows them begins).
  std::size_t header_bytes() const {
    return sizeof(Head) + static_cast<std::size_t>(head_.n) * sizeof(Entry);
  }

 protected:
  HeadedView(std::span<const char> msg, bool exactly, const std::string& what,
             const std::string& from)
      : msg_(msg) {
    PDT_CHECK(msg.size() >= sizeof(Head), "short " + what + " from " + from);
    std::memcpy(&head_, msg.data(), sizeof(Head));
    const std::size_t room = (msg.size() - sizeof(Head)) / sizeof(Entry);
    PDT_CHECK(head_.n >= 0 && static_cast<std::uint64_t>(head_.n) <= room &&
                  (!exactly || header_bytes() == msg.size()),
              "malformed " + what + " from " + from + ": " + std::to_string(head_.n) +
                  " entries in " + std::to_string(msg.size()) + " bytes");
  }
  std::span<const char> msg_;

 private:
  Head head_;
};

// kFetchRequest: FetchRequest + int32 ids[n].
class RequestView : public HeadedView<FetchRequest, std::int32_t> {
 public:
  RequestView(std::span<const char> msg, const std::string& from)
      : HeadedView(msg, true, "fetch request", from) {}
};

// kPush: PushHeader + BlockHeader[n] (the payloads follow in their own message).
class PushView : public HeadedView<PushHeader, BlockHeader> {
 public:
  PushView(std::span<const char> msg, const std::string& from);
  // The payload message's size: every block's bytes (each checked to be >= 0).
  std::int64_t payload_bytes() const { return payload_bytes_; }

 private:
  std::int64_t payload_bytes_ = 0;
};

// kFetchReply: ReplyHeader + BlockHeader[n], or (kRelay) the same followed by the payloads
// back to back, each block's bytes >= 0 and all of them within the message.
class ReplyView : public HeadedView<ReplyHeader, BlockHeader> {
 public:
  enum class Payloads { apart, following };  // kFetchReply / kRelay
  ReplyView(std::span<const char> msg, Payloads payloads, const std::string& from);
};

}  // namespace pdtrain::wire
