#pragma once
// Message formats between compute ranks and holders. Every block travels with its id, version
// and the CRC32C of its bytes; receivers check all three.
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

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

// Views of received messages. Each checks the message's size against its own count once, when
// it is made (a message that does not fit ends the job naming `from`), and is the only reader
// of the message's bytes as headers; the message must outlive the view.

// kFetchRequest: FetchRequest + int32 ids[n].
class RequestView {
 public:
  RequestView(std::span<const char> msg, const std::string& from);
  const FetchRequest& request() const { return head_; }
  std::int64_t n() const { return head_.n; }
  std::int32_t id(std::int64_t i) const;

 private:
  std::span<const char> msg_;
  FetchRequest head_;
};

// kPush: PushHeader + BlockHeader[n] (the payloads follow in their own message).
class PushView {
 public:
  PushView(std::span<const char> msg, const std::string& from);
  const PushHeader& header() const { return head_; }
  std::int64_t n() const { return head_.n; }
  BlockHeader block(std::int64_t i) const;
  // The payload message's size: every block's bytes (each checked to be >= 0).
  std::int64_t payload_bytes() const { return payload_bytes_; }

 private:
  std::span<const char> msg_;
  PushHeader head_;
  std::int64_t payload_bytes_ = 0;
};

// kFetchReply: ReplyHeader + BlockHeader[n], or (kRelay) the same followed by the payloads
// back to back, each block's bytes >= 0 and all of them within the message.
class ReplyView {
 public:
  enum class Payloads { apart, following };  // kFetchReply / kRelay
  ReplyView(std::span<const char> msg, Payloads payloads, const std::string& from);
  const ReplyHeader& header() const { return head_; }
  std::int64_t n() const { return head_.n; }
  BlockHeader block(std::int64_t i) const;
  // Bytes of the headers (where a relayed reply's first payload begins).
  std::size_t header_bytes() const;

 private:
  std::span<const char> msg_;
  ReplyHeader head_;
};

}  // namespace pdtrain::wire
