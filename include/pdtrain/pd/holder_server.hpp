#pragma once
// The holder side of parameter/compute decoupling: a server loop that owns a shard of the
// canonical parameters and their AdamW state, serves fetches, takes gradient pushes from any
// rank in any order, and, once every expected gradient of a step has arrived, applies AdamW
// (with the global-norm clip agreed among holders) and advances the version clock. Fetches for
// a version not yet reached wait in a queue.
//
// Bounded staleness s: step k computes on version max(0, k-1-s), so compute ranks run up to s
// steps ahead of the updates. The holder keeps the last s+1 versions of each block (encoded for
// the wire) and buffers pushes of up to s+1 future steps; s = 0 is exact synchronous training.
// Versions that delayed steps compute on may be served predicted (pd/staleness.hpp).
//
// The arithmetic runs on a pool of threads (holder_update.hpp): a block's gradient is summed and
// its sum of squares taken as soon as its last contribution arrives; after the norm agreement
// the fused update (AdamW + encoding + CRC per cache-sized slice) runs on the workers while this
// thread publishes blocks in block order and serves fetches as soon as their blocks are ready.
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "pdtrain/core/size_pool.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/io/trace.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/optim/adamw.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/holder_update.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/pd/shared_segments.hpp"
#include "pdtrain/pd/staleness.hpp"
#include "pdtrain/pd/wire.hpp"
#include "pdtrain/pd/wire_codec.hpp"

namespace pdtrain {

// What the app plugs into a holder without the PD layer knowing about files: checkpoint
// writing after updates and at the end, and a request to stop early (a signal).
struct HolderHooks {
  using OwnedBlocks = std::map<int, const BlockState*>;
  // The owner's blocks, asked for only when a hook needs them (a device-resident owner copies
  // them to the host then).
  using BlocksGetter = std::function<OwnedBlocks()>;
  // After every update, with all holders at `version` (collective calls are safe here).
  std::function<void(std::int64_t version, const BlocksGetter&)> after_update;
  // Once, after every compute rank has finished, with all holders at the final version.
  std::function<void(std::int64_t version, const BlocksGetter&)> at_end;
  // Instead of at_end when training diverged: finishes what is being written, writes nothing.
  std::function<void()> after_divergence;
  // True once this holder was asked to stop (SIGTERM, SIGINT or SIGUSR1); told to compute ranks
  // in replies.
  std::function<bool()> stop_requested;
};

class HolderServer {
 public:
  // `owner[b]` is the holder index of block b; `contributions[b]` how many pushes of block b
  // make up one step (1, or 2 for the tied embedding on two pipeline stages).
  HolderServer(const Layout& layout, const BlockTable& table, std::vector<int> owner,
               std::vector<int> contributions, const AdamWConfig& opt, WireCodec fetch_codec,
               WireCodec push_codec, const StalenessPlan& staleness, TraceRecorder* trace);

  // Serves until every compute rank has said it is done, then gathers the canonical CRC.
  void run();

  std::int64_t version() const { return version_; }
  // Why training diverged, when this holder saw it (the agreed gradient norm was not
  // finite); "" otherwise. Every holder holds the same text.
  const std::string& divergence() const { return divergence_; }
  void set_hooks(HolderHooks hooks) { hooks_ = std::move(hooks); }
  // Replaces the initial state by a restored one (a checkpoint at `version`, for its blocks).
  void restore(std::int64_t version, std::map<int, BlockState> blocks);
  HolderHooks::OwnedBlocks owned_blocks() const;
  void set_verbose(bool v) { verbose_ = v; }  // print a traffic line at the end
  // Threads of the update (pd.holder_threads; 0: see resolve_holder_threads, with the number of
  // the job's ranks on this node); before run().
  void set_update_threads(int configured, int ranks_on_node) {
    threads_configured_ = configured;
    ranks_on_node_ = ranks_on_node;
  }
  const PhaseTimers& timers() const { return timers_; }

  // Bytes of the shared segment holder `holder` needs to publish its blocks there: every owned
  // block's last staleness+1 versions in a fixed-width fetch codec (raw, bf16); 0 for lz4.
  static std::size_t shared_bytes(const BlockTable& table, const std::vector<int>& owner,
                                  int holder, WireCodec fetch_codec, int staleness);
  // Publishes into `segments->mine()` (shared_bytes() long) from now on, and serves compute
  // ranks on this node from there: their replies name where each block lies instead of
  // carrying it. Before run().
  void publish_through(const SharedSegments* segments);

 private:
  struct Pending {
    int source;
    std::vector<char> msg;
  };
  struct Encoded {
    std::vector<char> storage;   // the block's parameters in the fetch codec, encoded once...
    const char* data = nullptr;  // ...and what is sent: `storage`, or the parameters themselves
    std::size_t size = 0;        // (raw at staleness 0: no copy is needed, see serves_in_place)
    std::uint32_t crc = 0;       // of the bytes sent
    std::int64_t shared_at = -1; // `data`'s offset in this holder's shared segment, if there
  };
  // One block's gradient of one step.
  struct StepGradient {
    std::map<int, std::vector<float>> by_source;  // contributions until all have arrived
    std::vector<float> sum;                       // then their sum, in source-rank order,
    double sumsq = 0.0;                           // and its sum of squares
    bool complete = false;
  };
  struct Owned {
    BlockState state;
    std::map<std::int64_t, Encoded> versions;      // the last staleness+1 versions
    std::map<std::int64_t, StepGradient> grads;    // by step
    std::vector<float> predicted;                  // lz4: a predicted version before encoding
    // Publishing through the shared segment: version v lies at slots_at + (v mod (s+1)) x
    // slot_bytes there.
    std::int64_t slots_at = -1;
    std::int64_t slot_bytes = 0;
  };

  bool poll_once();  // receives and handles one message, if one is waiting
  void handle(int source, int tag, std::span<const char> msg);
  void serve_fetch(int source, const wire::RequestView& request);
  bool ready(const wire::RequestView& request) const;
  std::span<const char> receive_push_payload(int source, const wire::PushView& push);
  void take_push(int source, const wire::PushView& push, std::span<const char> payload);
  void take_contribution(int id, int source, std::int64_t step, const char* data,
                         std::int64_t bytes, std::uint32_t crc);
  void finish_completed_steps();
  void finish_step();
  double agree_on_norm(std::int64_t step);
  void check_norm(std::int64_t step, double norm, const std::vector<double>& by_block);
  void keep_blocks(std::int64_t step);
  void update_blocks(std::int64_t step, double lr, float scale);
  void publish(Owned& o, std::int64_t step, Encoded fresh, std::uint32_t crc);
  bool serves_in_place() const;
  char* slot(const Owned& o, std::int64_t version) const;
  void encode(Owned& o);
  std::vector<float> take_buffer(std::size_t n);
  void give_buffer(std::vector<float> buffer);
  void serve_deferred();
  void retire_sent_replies();  // frees replies the network has taken, in order
  void drain_sent_replies();   // waits for every reply on its way
  void send_final_crc();
  void print_traffic() const;

  const Layout& layout_;
  const BlockTable& table_;
  std::vector<int> owner_, contributions_;
  AdamWConfig opt_;
  WireCodec fetch_codec_, push_codec_;
  std::map<int, Owned> owned_;  // by block id, ascending
  // The owned blocks in the order an update runs and publishes them: by BlockDesc::need_rank
  // (the next forward's order), then id.
  std::vector<std::pair<int, Owned*>> update_order_;
  std::int64_t version_ = 0;
  std::int64_t start_version_ = 0;  // the version a restart began at
  StalenessPlan plan_;
  int staleness_ = 0;  // plan_.staleness
  std::int64_t pushes_per_step_ = 0;               // gradients this holder takes per step
  std::map<std::int64_t, std::int64_t> missing_;   // step -> gradients still expected
  std::map<std::int64_t, UpdateInfo> recent_;      // the updates of the versions kept
  std::deque<Pending> deferred_;
  int threads_configured_ = 0, ranks_on_node_ = 1;
  std::unique_ptr<WorkerPool> pool_;       // created by run()
  bool updating_ = false;                  // a step's update is running on the pool
  std::vector<char> inbox_;                // the message being handled (grows, never shrinks)
  std::vector<char> payload_;              // a push's payloads (grows, never shrinks)
  SizePool<std::vector<float>> spare_;     // gradient buffers for reuse
  struct Sending {
    std::vector<char> bytes;            // the headers; the payloads are the blocks' encoded bytes
    std::vector<MPI_Request> requests;  // the header's send, then one per non-empty payload
  };
  std::deque<Sending> sending_;  // replies on their way (std::deque: elements never move)
  int done_ranks_ = 0;
  // The divergence guard: the first step whose agreed gradient norm was not finite (that update
  // and every later one are not applied), why, and whether a compute rank's loss diverged.
  std::int64_t diverged_at_ = 0;
  std::string divergence_;
  bool compute_diverged_ = false;
  std::int64_t sent_ = 0, received_ = 0;  // bytes on the wire, for the traffic line
  bool verbose_ = false;
  HolderHooks hooks_;
  PhaseTimers timers_;
  TraceRecorder* trace_;
  const SharedSegments* segments_ = nullptr;  // publishing through shared memory, if set
  std::int64_t sent_shared_ = 0;  // of sent_, the bytes compute ranks copied from the segment
};

// Collective over layout.world(): the node shared segments the holders publish into, each
// holder's shared_bytes() long (compute ranks' empty), for HolderServer::publish_through and
// FetchClient. Null on every rank, with why_not, for a codec without a fixed width (lz4; no
// collective call then) or when a node lacks the room (SharedSegments::create). `node`: the
// job's node of this rank.
std::unique_ptr<SharedSegments> share_holder_segments(const Layout& layout,
                                                      const BlockTable& table,
                                                      const std::vector<int>& owner,
                                                      WireCodec fetch_codec, int staleness,
                                                      int node, std::string* why_not);

}  // namespace pdtrain
