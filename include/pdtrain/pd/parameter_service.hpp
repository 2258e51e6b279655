#pragma once
// The compute side's view of the parameters, whoever holds them: FetchClient (PD, the holders
// own them) or DeviceReplica (the replicated baseline, this rank owns a copy on its device).
// Same calls, same numerics. Blocks are named by id only (pd/blocks.hpp).
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "pdtrain/core/block_place.hpp"


namespace pdtrain {

// What the compute side learns with each fetched version: the update that produced it.
struct UpdateInfo {
  std::int64_t version = 0;  // number of optimizer steps applied
  double grad_norm = 0.0;    // global gradient norm of that step (before clipping)
  double lr = 0.0;           // learning rate of that step
};

// Optional, for a service that can receive blocks in place (FetchClient): `place` says where
// block `id` may land given the wire's element width (4: raw fp32, 2: bf16); after the service
// has checked the block's CRC32C there, it calls `landed` with the rows checked, a cache-sized
// chunk at a time, so that a finishing pass (widening bf16, rounding) reads them while they
// are still in cache. The same rules as the sink apply: possibly another thread, and only
// memory nothing else looks at until the fetch finishes.
struct BlockTarget {
  std::function<BlockPlace(int id, int elem_bytes)> place;
  std::function<void(int id, int elem_bytes, std::int64_t row_begin, std::int64_t row_end)> landed;
  explicit operator bool() const { return static_cast<bool>(place); }
};

class ParameterService {
 public:
  virtual ~ParameterService() = default;
  using BlockSink = std::function<void(int id, const float* data)>;
  // Gets `blocks` at exactly `version` (waiting until it exists) and hands each to `sink`.
  // Returns the update that produced `version`.
  virtual UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                           const BlockSink& sink) = 0;
  // The same fetch split in two, so several can be in flight while this rank computes:
  // start_fetch() sends the request and returns at once; `sink` gets each block when it has
  // arrived and been checked (possibly on another thread, before finish_fetch returns, so it
  // must only write where nothing else looks until then); progress() moves the fetches in
  // flight forward where no background thread does; finish_fetch() waits for the oldest fetch
  // in flight (fetches finish in the order they were started) to be delivered. This default
  // runs the whole fetch in finish_fetch(), which suits a service with the parameters at hand.
  using Ticket = std::int64_t;
  virtual Ticket start_fetch(std::int64_t version, std::vector<int> blocks, BlockSink sink) {
    queued_.push_back({next_ticket_, version, std::move(blocks), std::move(sink)});
    return next_ticket_++;
  }
  // start_fetch() with blocks received where `target` places them (those it places skip the
  // sink). This default ignores the target: every block goes to the sink.
  virtual Ticket start_fetch_in_place(std::int64_t version, std::vector<int> blocks,
                                      BlockSink sink, BlockTarget target) {
    (void)target;
    return start_fetch(version, std::move(blocks), std::move(sink));
  }
  virtual void progress() {}
  virtual UpdateInfo finish_fetch(Ticket ticket);
  // The update that produced `version`, if this rank has learnt it (fetch replies carry the
  // holders' recent updates, so later steps' figures arrive before their versions are fetched).
  virtual std::optional<UpdateInfo> update_info(std::int64_t version) const = 0;
  // Gives the gradients of 1-based step `step` (summed over data-parallel replicas) for
  // `blocks`, packed back to back in block order.
  virtual void push(std::int64_t step, const std::vector<int>& blocks, const float* grads) = 0;
  // The same push without waiting, so a compute rank can push a unit's gradients while its
  // backward goes on: `grads` must stay valid and unchanged until push_done() has said true or
  // wait_push() has returned. Pushes of one step may come in any number of parts (each block
  // once). This default pushes at once, which suits a service with the parameters at hand.
  using PushTicket = std::int64_t;
  virtual PushTicket start_push(std::int64_t step, const std::vector<int>& blocks,
                                const float* grads) {
    push(step, blocks, grads);
    return next_push_++;
  }
  // The same push from where the gradients lie (places[i]: block i's rows, apart in a unit's
  // storage), without packing them first. A remote service describes the tiles to MPI, which
  // then moves them only while this rank is inside MPI: it suits a rank that waits for the push
  // (pd.pushes_in_flight = 0), not one that computes meanwhile. This default packs them.
  virtual PushTicket start_push_from(std::int64_t step, const std::vector<int>& blocks,
                                     const std::vector<ConstBlockPlace>& places);
  virtual bool push_done(PushTicket) { return true; }  // also frees it when done
  virtual void wait_push(PushTicket) {}
  // Ends the run. Returns the canonical parameter CRC32C on the reporting rank.
  virtual std::uint32_t finish_and_checksum() = 0;
  // Training diverged at 1-based step `step` (its loss or gradient norm was not finite): the
  // parameters' owners write no final checkpoint when the run finishes.
  void mark_diverged(std::int64_t step) { diverged_step_ = step; }
  // True once a holder has said it was asked to stop (a signal reached it).
  virtual bool holders_asked_to_stop() const { return false; }
  // Bytes this rank moved through the service so far (fetched, pushed).
  virtual std::int64_t bytes_fetched() const = 0;
  virtual std::int64_t bytes_pushed() const = 0;

 protected:
  std::int64_t diverged_step_ = 0;  // 0: the run did not diverge

 private:
  struct Queued {
    Ticket ticket;
    std::int64_t version;
    std::vector<int> blocks;
    BlockSink sink;
  };
  std::deque<Queued> queued_;  // the default start_fetch()'s requests
  Ticket next_ticket_ = 0;
  PushTicket next_push_ = 0;
};

}  // namespace pdtrain
