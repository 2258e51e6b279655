#pragma once
// The compute side of PD: fetches blocks from the holders that own them and pushes gradients
// to them, checking every block's version and CRC32C on arrival. Several fetches can be in
// flight at once (prefetching); they complete in the order they were started.
//
// With MPI_THREAD_MULTIPLE (and pd.fetch_thread), a background thread moves the fetches:
// it sends requests, receives and relays replies, checks and unpacks blocks while the compute
// thread runs kernels, so fetch time hides behind compute even where MPI has no asynchronous
// progress. Otherwise the compute thread does the same work in progress()/finish_fetch().
//
// Receiving in place (start_fetch_in_place): a reply is a header, then one message per block;
// with a fixed-size codec (raw, bf16) each placed block's payload is received straight into its
// tile of the unit's memory and its CRC32C checked there as soon as it has arrived, fused with
// the target's finishing pass. A block crosses memory once after MPI's copy instead of three
// times. With dp > 1 replies keep a buffer (relays stay one contiguous message per holder).
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pdtrain/layout/layout.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/pd/shared_segments.hpp"
#include "pdtrain/pd/wire.hpp"
#include "pdtrain/pd/wire_codec.hpp"

namespace pdtrain {

class FetchClient final : public ParameterService {
 public:
  // `segments`: the holders' shared segments (null: every payload comes by message).
  FetchClient(const Layout& layout, const BlockTable& table, std::vector<int> owner,
              WireCodec fetch_codec, WireCodec push_codec, bool fetch_thread = true,
              const SharedSegments* segments = nullptr);
  ~FetchClient() override;
  FetchClient(const FetchClient&) = delete;
  FetchClient& operator=(const FetchClient&) = delete;

  UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                   const BlockSink& sink) override;
  Ticket start_fetch(std::int64_t version, std::vector<int> blocks, BlockSink sink) override;
  Ticket start_fetch_in_place(std::int64_t version, std::vector<int> blocks, BlockSink sink,
                              BlockTarget target) override;
  void progress() override;
  UpdateInfo finish_fetch(Ticket ticket) override;
  void push(std::int64_t step, const std::vector<int>& blocks, const float* grads) override;
  PushTicket start_push(std::int64_t step, const std::vector<int>& blocks,
                        const float* grads) override;
  PushTicket start_push_from(std::int64_t step, const std::vector<int>& blocks,
                             const std::vector<ConstBlockPlace>& places) override;
  bool push_done(PushTicket ticket) override;
  void wait_push(PushTicket ticket) override;
  std::uint32_t finish_and_checksum() override;
  std::optional<UpdateInfo> update_info(std::int64_t version) const override;
  bool holders_asked_to_stop() const override { return stop_; }
  std::int64_t bytes_fetched() const override { return fetched_; }
  // Bytes (encoded) this rank received from holders; the rest of bytes_fetched() came by relay.
  std::int64_t bytes_from_holders() const { return from_holders_; }
  // Of bytes_from_holders(), those copied from a holder's shared segment.
  std::int64_t bytes_from_shared_memory() const { return from_shared_; }
  std::int64_t bytes_pushed() const override { return pushed_; }
  // Replies that answered a later fetch before an earlier one from the same holder (an update
  // made the later request ready first); each still lands in its own fetch's place. For tests
  // and the curious.
  std::int64_t replies_out_of_order() const { return out_of_order_; }
  bool background() const { return worker_.joinable(); }

 private:
  // A message buffer that grows without zero-filling (a reply can be tens of MiB); reused
  // across fetches.
  struct Buffer {
    std::unique_ptr<char[]> data;
    std::size_t size = 0, capacity = 0;
    void resize(std::size_t n) {
      if (n > capacity) data.reset(new char[n]), capacity = n;
      size = n;
    }
  };
  // One fetch in flight. Data-parallel replica 0 of a (pp, tp) position asks the holders; the
  // replies then travel down a binary tree of the replicas (replica r forwards to 2r+1 and
  // 2r+2) as point-to-point messages over relay_comm_, in ticket order and holder order, so
  // MPI's non-overtaking rule matches them and no rank sends more than two copies. Point to
  // point, not MPI_Ibcast: the compute thread runs non-blocking collectives at the same time,
  // and Open MPI 4.1's libnbc is not safe to drive from two threads. Only the thread that
  // moves fetches touches a job's fields, except `delivered` and `info` (guarded by mutex_).
  // One holder's reply to a fetch: a header message (ReplyHeader + BlockHeader[n]), then one
  // contiguous message per non-empty block payload, in header order (MPI's non-overtaking rule
  // matches them to the receives posted when the header arrives). A payload is received
  // straight into its tile of the unit when the target places it (fixed-size codec, no
  // relays), else into the reply buffer after the headers; either way its CRC32C is taken as
  // soon as it has arrived, while it is still in cache.
  struct Arrival {
    std::vector<BlockPlace> at;       // per block: where its payload lies
    std::vector<char> in_place;       // per block: `at` is the target's memory
    std::vector<char> checked;        // per block: `crc` is taken
    std::vector<std::uint32_t> crc;   // per block: CRC32C of what arrived
  };
  struct InFlight {
    Ticket ticket = 0;
    std::int64_t version = 0;
    BlockSink sink;
    BlockTarget target;
    std::vector<Arrival> arrivals;            // per holder
    std::vector<char> replied;                // per holder: its reply's header is here
    std::vector<std::vector<int>> groups;     // block ids by owning holder
    std::vector<std::vector<char>> requests;  // per holder, kept until sent
    std::vector<Buffer> replies;              // per holder: headers, then buffered payloads
    std::vector<MPI_Request> sends;
    int awaited_replies = 0;                  // headers still to come
    std::vector<MPI_Request> payloads;        // posted payload receives
    std::vector<std::pair<int, int>> payload_of;  // per receive: (holder, block index)
    std::vector<MPI_Datatype> strided;        // receive types of strided tiles, freed after
    int awaited_payloads = 0;
    bool flip_pending = false;                // test hook: damage the first payload checked
    std::size_t next_group = 0;            // relay: the next holder's reply to receive
    bool relay_posted = false;             // relay: sends to the children posted
    std::vector<MPI_Request> relay_reqs;
    enum class Stage { created, awaiting_replies, relay_recv, relay_send, ready } stage{};
    bool delivered = false;  // checked and handed to the sink
    UpdateInfo info;
  };
  using Job = std::shared_ptr<InFlight>;
  // One push on its way: per holder with blocks, a header message and a contiguous payload
  // message (sent from where the gradients lie when they are back to back raw, else packed or
  // encoded here), kept until the sends complete.
  struct Pushing {
    PushTicket ticket = 0;
    std::vector<std::vector<char>> headers, payloads;
    std::vector<MPI_Request> requests;
    std::vector<MPI_Datatype> described;  // payloads sent as datatypes over their tiles
  };
  // The push of blocks[i]'s gradient (fp32) from places[i]; `describe`: raw tiles that are not
  // back to back go as one datatype over them instead of being packed.
  PushTicket send_push(std::int64_t step, const std::vector<int>& blocks,
                       const std::vector<ConstBlockPlace>& places, bool describe);
  static MPI_Datatype tiles_type(const std::vector<const ConstBlockPlace*>& tiles);
  std::map<PushTicket, Pushing>::iterator pushing(PushTicket ticket);
  void free_push(std::map<PushTicket, Pushing>::iterator it);

  // Block ids of `blocks` grouped by owning holder, keeping their order.
  std::vector<std::vector<int>> by_holder(const std::vector<int>& blocks) const;
  bool relays() const { return layout_.shape().dp > 1; }
  // One round of work on every fetch in flight; true if anything moved.
  bool advance_all();
  void send_requests(InFlight& f);
  int wire_width() const;  // bytes per element on the wire; 0: variable (compressed)
  // Receives a reply's header from holder h and posts its payloads' receives.
  void receive_header(MPI_Message& m, int bytes, int h, const std::vector<Job>& jobs);
  void post_payloads(InFlight& f, int h, const std::vector<char>& header);
  MPI_Request receive_payload(InFlight& f, const BlockPlace& p, int source);
  // Payloads that have arrived get their CRC32C taken (and, in place, the target's finishing
  // pass) at once; true if any did.
  bool check_arrived(InFlight& f);
  void check_block(InFlight& f, int h, std::size_t i);
  // Where a relayed reply's payloads lie: back to back after its headers.
  void place_buffered(InFlight& f, int h);
  // Checks the CRC32C of a block that landed in place, handing its rows to the target's
  // `landed` a cache-sized chunk at a time (one pass over memory). With `from` (a holder's
  // shared segment, rows back to back) each chunk is first copied there from it.
  std::uint32_t check_in_place(const InFlight& f, int block, const BlockPlace& p,
                               const char* from = nullptr) const;
  // A reply whose payloads lie in holder h's shared segment: every block copied into its
  // place (or the reply buffer) with its CRC32C taken in the same pass.
  void copy_shared_payloads(InFlight& f, int h, const std::vector<char>& header);
  void free_receive_types(InFlight& f);
  bool receive_replies(const std::vector<Job>& jobs);
  bool advance(InFlight& f);
  UpdateInfo verify_and_deliver(InFlight& f);
  void worker_loop();
  bool undelivered() const;  // with mutex_ held
  Buffer take_buffer(std::size_t bytes);

  const Layout& layout_;
  const BlockTable& table_;
  std::vector<int> owner_;
  WireCodec fetch_codec_, push_codec_;
  MPI_Comm relay_comm_ = MPI_COMM_NULL;  // a duplicate of dp_comm: relays only
  std::vector<int> relay_children_;      // in relay_comm_
  mutable std::mutex mutex_;             // in_flight_ (the deque), delivery, known_
  std::condition_variable changed_;      // a job was added, delivered, or the worker must stop
  std::deque<Job> in_flight_;            // oldest first
  bool stopping_ = false;
  std::thread worker_;
  Ticket next_ticket_ = 0;
  std::vector<Buffer> spare_;                 // buffers of delivered replies
  std::vector<float> decoded_;                // one block, decoded
  std::vector<char> header_;                  // the reply header being read
  std::vector<int> completed_;                // MPI_Testsome's indices
  std::map<std::int64_t, UpdateInfo> known_;  // updates learnt from reply headers
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> fetched_{0}, from_holders_{0}, from_shared_{0}, out_of_order_{0};
  const SharedSegments* segments_ = nullptr;
  std::int64_t pushed_ = 0;
  std::map<PushTicket, Pushing> pushes_;  // on their way (compute thread only)
  PushTicket next_push_ticket_ = 0;
  std::int64_t flip_at_version_ = -1;  // test_hooks::flip_fetch_bit_at_version()
};

}  // namespace pdtrain
