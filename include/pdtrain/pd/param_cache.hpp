#pragma once
// The compute rank's bounded parameter cache with prefetch. A pass (one training step, or one
// evaluation) uses parameter units in an order known before it starts (the pipeline schedule
// and the model's layer order). The cache:
//  - prefetches the units of the next `prefetch_depth` uses with non-blocking fetches, so the
//    fetch hides behind the compute of the current use;
//  - keeps at most `capacity_bytes` of parameters resident (0: no limit) and, when full, evicts
//    the unit whose next use is farthest away (Belady's rule, optimal because the order is
//    known), never one needed sooner than the unit it makes room for;
//  - counts uses, hits, fetches and re-fetched bytes per unit (the hotness table).
// Units of an older version are dropped when a pass at a new version begins.
//
// On a GPU (a Device that is not the host) the bound is on device memory: each cache buffer is
// device memory with a pinned host staging buffer of the same size. Blocks are received into
// the staging in place (UnitStore::place) or unpacked there, and checked (possibly by the fetch
// thread); when a unit's fetch is delivered the cache queues its upload on the device's copy
// queue, and the compute queue waits for that upload (an event) before the unit's first use:
// no host synchronization on the way. A buffer
// is refilled only after the compute queue has passed its previous unit's last use (an event
// recorded at eviction), and its staging only after its previous upload is done.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pdtrain/device/device.hpp"
#include "pdtrain/io/trace.hpp"
#include "pdtrain/pd/parameter_service.hpp"

namespace pdtrain {

struct CacheUnit {
  std::string name;
  std::int64_t numel = 0;
  std::vector<int> blocks;  // fetched together; each is unpacked into the unit's storage
};

// Where the cache puts units: the model's parameter storage.
class UnitStore {
 public:
  virtual ~UnitStore() = default;
  // Device memory for the unit and its host staging (the same on the CPU); nullptr: gone.
  virtual void bind(int unit, float* storage, float* staging) = 0;
  virtual void unpack(int block, const float* data) = 0;  // into its bound unit's staging
  // Receiving in place (see BlockTarget): where block's payload of `elem_bytes` per element can
  // land in its bound unit's staging (nowhere by default: unpack() gets it), and the pass that
  // finishes rows that landed there (e.g. widening bf16).
  virtual BlockPlace place(int block, int elem_bytes) {
    (void)block, (void)elem_bytes;
    return {};
  }
  virtual void landed(int block, int elem_bytes, std::int64_t row_begin, std::int64_t row_end) {
    (void)block, (void)elem_bytes, (void)row_begin, (void)row_end;
  }
};

struct CacheStats {
  std::int64_t uses = 0;     // unit uses (a use of two units counts two)
  std::int64_t hits = 0;     // ... that found the unit resident, no wait
  std::int64_t late = 0;     // ... that found it in flight (prefetched too late) and waited
  std::int64_t misses = 0;   // ... that had to start its fetch
  std::int64_t fetches = 0;  // unit fetches
  std::int64_t bytes_fetched = 0;    // parameter bytes (fp32) fetched
  std::int64_t bytes_refetched = 0;  // ... of units fetched before at the same version
  std::int64_t peak_bytes = 0;       // most parameter bytes allocated at once
  std::int64_t pass_peak_bytes = 0;  // ... during the pass begun last
  double wait_seconds = 0.0;         // exposed: time uses spent waiting for their units
  std::vector<std::int64_t> unit_uses, unit_fetches;
};

class ParamCache {
 public:
  ParamCache(ParameterService& service, std::vector<CacheUnit> units, UnitStore& store,
             std::int64_t capacity_bytes, int prefetch_depth, TraceRecorder* trace = nullptr,
             Device& device = cpu_device());
  ~ParamCache();
  ParamCache(const ParamCache&) = delete;
  ParamCache& operator=(const ParamCache&) = delete;

  // The smallest capacity that can run `plan`: its largest single use.
  static std::int64_t min_capacity_bytes(const std::vector<CacheUnit>& units,
                                         const std::vector<std::vector<int>>& plan);

  // Starts a pass over `plan` (the uses, in order) on parameters of `version`.
  void begin(std::int64_t version, std::vector<std::vector<int>> plan);
  // The next use of the plan: makes `units` resident (waiting if needed) and prefetches ahead.
  // Throws if `units` is not the plan's next use.
  void acquire(const std::vector<int>& units);
  // Ends the pass; every use of the plan must have been acquired.
  void end();

  const CacheStats& stats() const { return stats_; }
  const std::vector<CacheUnit>& units() const { return units_; }
  std::int64_t capacity_bytes() const { return capacity_; }
  // A new capacity (0: no limit) from the next begin() on, which evicts down to it (farthest
  // next use first) and releases free buffers beyond it. The cold start keeps whole stages
  // resident for the first steps this way (StageCache); the numbers never change.
  void set_capacity(std::int64_t bytes) { next_capacity_ = bytes; }

 private:
  struct Slot;
  struct State {
    Slot* slot = nullptr;         // bound memory (resident or being fetched)
    std::int64_t version = -1;    // of the data in storage
    bool in_flight = false;
    ParameterService::Ticket ticket = 0;
    bool fetched_this_version = false;
    double started = 0.0;  // when its fetch was started (for the trace)
  };
  std::size_t next_use(int unit, std::size_t from) const;  // plan index, or npos
  bool tracing() const { return trace_ != nullptr && trace_->enabled(); }
  bool make_room(std::int64_t numel, std::size_t needed_at);
  bool start(int unit, std::size_t needed_at);  // false: no room
  void wait_for(int unit);
  void upload(int unit);
  void ready_for_compute(int unit);
  void prefetch();
  void drop(int unit);
  void apply_capacity();
  void release_free_slots(std::int64_t room);  // until `room` more bytes fit the capacity
  Slot* take_slot(std::int64_t numel);
  void give_back(Slot* slot);

  ParameterService& service_;
  Device& device_;
  std::vector<CacheUnit> units_;
  UnitStore& store_;
  std::int64_t capacity_;  // bytes, 0: unlimited
  std::int64_t next_capacity_;  // from the next begin() on
  int depth_;
  TraceRecorder* trace_;
  std::vector<State> state_;
  std::vector<int> fifo_;  // units in flight, oldest first (fetches finish in this order)
  std::int64_t version_ = -1;
  std::vector<std::vector<int>> plan_;
  std::size_t pos_ = 0;     // next use of the plan
  std::vector<int> pinned_;  // units of the current use
  // A cache buffer: device memory, its host staging (none on the CPU), and the events that
  // order its reuse.
  struct Slot {
    std::int64_t numel = 0;
    Buffer<float> storage, staging;
    std::unique_ptr<Event> uploaded, released;
    bool upload_pending = false;   // an upload from staging may still be running
    bool compute_waits = false;    // the compute queue has yet to wait for that upload
    bool release_pending = false;  // the compute queue may still read the previous unit
    float* device() { return storage.data(); }
    float* host() { return staging.empty() ? storage.data() : staging.data(); }
  };
  std::vector<std::unique_ptr<Slot>> free_;  // allocated, unused
  std::vector<std::unique_ptr<Slot>> used_;  // allocated, bound to a unit
  std::int64_t in_use_bytes_ = 0, allocated_bytes_ = 0;
  CacheStats stats_;
};

}  // namespace pdtrain
