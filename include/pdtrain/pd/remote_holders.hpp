#pragma once
// The compute side of PD: fetches blocks from the holders that own them and pushes gradients
// to them, checking every block's version and CRC32C on arrival. Several fetches can be in
// flight at once (prefetching); they complete in the order they were started.
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "pdtrain/layout/layout.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/wire_codec.hpp"

namespace pdtrain {

class RemoteHolders final : public ParameterService {
 public:
  RemoteHolders(const Layout& layout, const BlockTable& table, std::vector<int> owner,
                WireCodec fetch_codec, WireCodec push_codec);
  ~RemoteHolders() override;
  RemoteHolders(const RemoteHolders&) = delete;
  RemoteHolders& operator=(const RemoteHolders&) = delete;

  UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                   const BlockSink& sink) override;
  Ticket start_fetch(std::int64_t version, std::vector<int> blocks) override;
  void progress() override;
  UpdateInfo finish_fetch(Ticket ticket, const BlockSink& sink) override;
  void push(std::int64_t step, const std::vector<int>& blocks, const float* grads) override;
  std::uint32_t finish() override;
  std::optional<UpdateInfo> update_info(std::int64_t version) const override;
  bool holders_asked_to_stop() const override { return stop_; }
  std::int64_t bytes_fetched() const override { return fetched_; }
  // Bytes (encoded) this rank received from holders; the rest of bytes_fetched() came by relay.
  std::int64_t bytes_from_holders() const { return from_holders_; }
  std::int64_t bytes_pushed() const override { return pushed_; }

 private:
  // One fetch in flight. Data-parallel replica 0 of a (pp, tp) position asks the holders; the
  // replies then go to the other replicas by broadcast over relay_comm_ (sizes first: they
  // depend on the encoding). Relays are posted in ticket order on every replica, which keeps
  // the broadcasts matched.
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
  struct InFlight {
    Ticket ticket = 0;
    std::int64_t version = 0;
    std::vector<std::vector<int>> groups;     // block ids by owning holder
    std::vector<std::vector<char>> requests;  // per holder, kept until sent
    std::vector<Buffer> replies;              // per holder
    std::vector<MPI_Request> sends;
    int awaited_replies = 0;
    std::vector<std::int64_t> sizes;           // relay: reply sizes
    MPI_Request sizes_req = MPI_REQUEST_NULL;
    std::vector<MPI_Request> relay_reqs;
    enum class Stage { awaiting_replies, relay_sizes, relay_data, ready } stage{};
  };

  // Block ids of `blocks` grouped by owning holder, keeping their order.
  std::vector<std::vector<int>> by_holder(const std::vector<int>& blocks) const;
  bool relays() const { return layout_.shape().dp > 1; }
  void send_requests(InFlight& f);
  void receive_replies();
  void advance(InFlight& f);
  UpdateInfo verify_and_deliver(InFlight& f, const BlockSink& sink);

  const Layout& layout_;
  const BlockTable& table_;
  std::vector<int> owner_;
  WireCodec fetch_codec_, push_codec_;
  MPI_Comm relay_comm_ = MPI_COMM_NULL;  // a duplicate of dp_comm: relays only
  std::deque<InFlight> in_flight_;       // oldest first
  Ticket next_ticket_ = 0;
  Buffer take_buffer(std::size_t bytes);
  std::vector<Buffer> spare_;                 // buffers of delivered replies
  std::vector<float> decoded_;                // one block, decoded
  std::map<std::int64_t, UpdateInfo> known_;  // updates learnt from reply headers
  bool stop_ = false;
  std::int64_t fetched_ = 0, pushed_ = 0, from_holders_ = 0;
  std::int64_t flip_at_version_ = -1;  // test hook, see the constructor
};

}  // namespace pdtrain
