#pragma once
// The compute side of PD: fetches blocks from the holders that own them (receiving them here,
// fanned out over the replicas by a RelayTree) and pushes gradients to them (a PushSender),
// checking every block's id, version and CRC32C on arrival, in one place (verify_block). Several fetches can be in
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

#include "pdtrain/core/size_pool.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/pd/push_sender.hpp"
#include "pdtrain/pd/relay_tree.hpp"
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
  std::int64_t bytes_pushed() const override { return pushes_.bytes_pushed(); }
  // Replies that answered a later fetch before an earlier one from the same holder (an update
  // made the later request ready first); each still lands in its own fetch's place. For tests
  // and the curious.
  std::int64_t replies_out_of_order() const { return out_of_order_; }
  bool background() const { return worker_.joinable(); }

 private:
  // One fetch in flight. Data-parallel replica 0 of a (pp, tp) position asks the holders; the
  // other replicas get the replies through the RelayTree. Only the thread that moves fetches
  // touches a job's fields, except `delivered` and `info` (guarded by mutex_).
  // One holder's reply to a fetch: a header message (ReplyHeader + BlockHeader[n]), then one
  // contiguous message per non-empty block payload, in header order (MPI's non-overtaking rule
  // matches them to the receives posted when the header arrives). A payload is received
  // straight into its tile of the unit when the target places it (fixed-size codec, no
  // relays), else into the reply buffer after the headers; either way it is verified
  // (verify_block) as soon as it has arrived, while it is still in cache.
  struct Arrival {
    wire::ReplyHeader header;             // the reply's
    std::vector<wire::BlockHeader> sent;  // per block: what its holder says it sent
    std::vector<BlockPlace> at;           // per block: where its payload lies
    std::vector<char> in_place;           // per block: `at` is the target's memory
    std::vector<char> checked;            // per block: verify_block() passed
    void expect(const wire::ReplyView& reply);  // sizes the rest to the reply's blocks
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
    std::vector<ByteBuffer> replies;          // per holder: headers, then buffered payloads
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
  // One round of work on every fetch in flight; true if anything moved.
  bool advance_all();
  void send_requests(InFlight& f);
  int wire_width() const;  // bytes per element on the wire; 0: variable (compressed)
  // Receives a reply's header from holder h and posts its payloads' receives.
  void receive_header(MPI_Message& m, int bytes, int h, const std::vector<Job>& jobs);
  void post_payloads(InFlight& f, int h, const wire::ReplyView& reply);
  MPI_Request receive_payload(InFlight& f, const BlockPlace& p, int source);
  // Payloads that have arrived are verified (and, in place, given the target's finishing
  // pass) at once; true if any were.
  bool check_arrived(InFlight& f);
  // The one check of a fetched block (id, version, CRC32C), on every path a block lands by;
  // `from`: a holder's shared segment it is copied from in the same pass.
  void verify_block(InFlight& f, int h, std::size_t i, const char* from = nullptr);
  // Where a relayed reply's payloads lie: back to back after its headers.
  void place_buffered(InFlight& f, int h);
  // Checks the CRC32C of a block that landed in place, handing its rows to the target's
  // `landed` a cache-sized chunk at a time (one pass over memory). With `from` (a holder's
  // shared segment, rows back to back) each chunk is first copied there from it.
  std::uint32_t check_in_place(const InFlight& f, int block, const BlockPlace& p,
                               const char* from = nullptr) const;
  // A reply whose payloads lie in holder h's shared segment: every block copied into its
  // place (or the reply buffer) with its CRC32C taken in the same pass.
  void copy_shared_payloads(InFlight& f, int h);
  void free_receive_types(InFlight& f);
  bool receive_replies(const std::vector<Job>& jobs);
  bool advance(InFlight& f);
  UpdateInfo verify_and_deliver(InFlight& f);
  void worker_loop();
  bool undelivered() const;  // with mutex_ held
  ByteBuffer take_buffer(std::size_t bytes);

  const Layout& layout_;
  const BlockTable& table_;
  std::vector<int> owner_;
  WireCodec fetch_codec_;
  RelayTree relay_;     // dp > 1: replies fanned out over the replicas
  PushSender pushes_;   // gradients to the holders
  mutable std::mutex mutex_;             // in_flight_ (the deque), delivery, known_
  std::condition_variable changed_;      // a job was added, delivered, or the worker must stop
  std::deque<Job> in_flight_;            // oldest first
  bool stopping_ = false;
  std::thread worker_;
  Ticket next_ticket_ = 0;
  SizePool<ByteBuffer> spare_{8};             // buffers of delivered replies, by capacity
  std::vector<float> decoded_;                // one block, decoded
  std::vector<char> header_;                  // the reply header being read
  std::vector<int> completed_;                // MPI_Testsome's indices
  std::map<std::int64_t, UpdateInfo> known_;  // updates learnt from reply headers
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> fetched_{0}, from_holders_{0}, from_shared_{0}, out_of_order_{0};
  const SharedSegments* segments_ = nullptr;
  std::int64_t flip_at_version_ = -1;  // test_hooks::flip_fetch_bit_at_version()
};

}  // namespace pdtrain
