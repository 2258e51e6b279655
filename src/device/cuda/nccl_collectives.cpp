// The NCCL implementation of the collectives seam: a communicator per group of compute ranks,
// its own stream gated by events on the device's compute stream. See
// device/nccl_collectives.hpp.
#include "pdtrain/device/nccl_collectives.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pdtrain/core/error.hpp"
#include "pdtrain/device/cuda_check.hpp"
#include "pdtrain/device/cuda_device.hpp"
#include "pdtrain/device/nccl_check.hpp"
#include "fixed_order_sum.hpp"

namespace pdtrain {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NcclId must hold an ncclUniqueId");

namespace {

std::vector<std::int64_t> starts_of(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> starts(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) starts[r] = starts[r - 1] + counts[r - 1];
  return starts;
}

// n floats in `parts` segments whose sizes differ by at most one (core/counts' split_evenly;
// the segmentation never changes a sum's bits, each element being added in rank order).
std::vector<std::int64_t> even_counts(std::int64_t n, int parts) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(parts), n / parts);
  for (std::int64_t r = 0; r < n % parts; ++r) ++counts[static_cast<std::size_t>(r)];
  return counts;
}

// A device buffer that grows: the old one is freed in the compute stream's order, after the
// work queued so far (which waited for the NCCL stream's) may have read it.
class DeviceScratch {
 public:
  explicit DeviceScratch(cudaStream_t compute) : compute_(compute) {}
  ~DeviceScratch() {
    if (data_) (void)cudaFreeAsync(data_, compute_);
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  float* at_least(std::int64_t n) {
    if (n > capacity_) {
      if (data_) CUDA_CHECK(cudaFreeAsync(data_, compute_));
      CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_),
                                 static_cast<std::size_t>(n) * sizeof(float), compute_));
      capacity_ = n;
    }
    return data_;
  }

 private:
  cudaStream_t compute_;
  float* data_ = nullptr;
  std::int64_t capacity_ = 0;
};

using Clock = std::chrono::steady_clock;

// The units of work posted on a communicator's stream (one operation each: its NCCL calls and
// the kernels and copies between them), oldest first, for the watchdog: NCCL itself waits
// forever on a peer that is alive but stalled. Each unit has two events: `ready`, recorded on
// the compute stream where its inputs are written (the NCCL stream waits for it), and `done`,
// recorded on the NCCL stream after it. The oldest unit not done is the one the stream runs; it
// can wait on nothing but its peers once its `ready` has passed, so the time since then (as the
// host first sees it) is time lost to peers. A unit still waiting for its inputs (a long kernel
// on the compute stream) or an idle stream never counts.
class StreamProgress {
 public:
  StreamProgress() = default;
  ~StreamProgress() {
    for (const Unit& u : units_) spare_.insert(spare_.end(), {u.ready, u.done});
    for (cudaEvent_t e : spare_) (void)cudaEventDestroy(e);
  }
  StreamProgress(const StreamProgress&) = delete;
  StreamProgress& operator=(const StreamProgress&) = delete;

  // A new unit, described by `what` for the watchdog's message; returns its `ready` event.
  cudaEvent_t open(std::string what) {
    retire_done();
    units_.push_back({spare_event(), spare_event(), std::move(what), true});
    return units_.back().ready;
  }
  cudaEvent_t ready_of_open() const { return units_.back().ready; }
  // The open unit is posted: returns its `done` event (to record after it on the NCCL stream).
  cudaEvent_t close() {
    units_.back().open = false;
    return units_.back().done;
  }

  // What the stream's oldest unit waits for when it has made no progress for `limit`, its
  // inputs ready; nothing otherwise.
  struct Stall {
    std::string what;
    double seconds = 0;
    std::size_t queued_behind = 0;
  };
  std::optional<Stall> stalled(Clock::duration limit) {
    retire_done();
    if (units_.empty() || units_.front().open) return std::nullopt;
    const Clock::time_point now = Clock::now();
    if (!front_since_) {
      if (cudaEventQuery(units_.front().ready) != cudaSuccess) return std::nullopt;
      front_since_ = now;
    }
    if (now - *front_since_ <= limit) return std::nullopt;
    return Stall{units_.front().what,
                 std::chrono::duration<double>(now - *front_since_).count(), units_.size() - 1};
  }

 private:
  struct Unit {
    cudaEvent_t ready, done;
    std::string what;
    bool open;
  };

  // Drops the units the stream has finished (their events back to the pool): progress. A
  // query that fails leaves them; the wait that runs the watchdog reports its error.
  void retire_done() {
    while (!units_.empty() && !units_.front().open &&
           cudaEventQuery(units_.front().done) == cudaSuccess) {
      spare_.insert(spare_.end(), {units_.front().ready, units_.front().done});
      units_.pop_front();
      front_since_.reset();
    }
  }
  cudaEvent_t spare_event() {
    cudaEvent_t e = nullptr;
    if (spare_.empty()) {
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      return e;
    }
    e = spare_.back();
    spare_.pop_back();
    return e;
  }

  std::deque<Unit> units_;
  std::vector<cudaEvent_t> spare_;
  std::optional<Clock::time_point> front_since_;  // when the front unit was seen ready
};

std::string floats(std::int64_t n) { return std::to_string(n) + " floats"; }

// "600 s", "2.5 s"; a measured time to a tenth of a second.
std::string seconds_text(double s, bool measured = false) {
  char text[48];
  std::snprintf(text, sizeof text, measured ? "%.1f s" : "%g s", s);
  return text;
}

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(CudaDevice& device, int rank, int size, const NcclId& id, std::string group,
                  double stall_limit_s)
      : device_(device), rank_(rank), size_(size), group_name_(std::move(group)),
        stall_limit_s_(stall_limit_s), received_(device.compute_stream()),
        sum_(device.compute_stream()) {
    device_.make_current();
    ncclUniqueId unique;
    std::memcpy(&unique, id.data(), sizeof unique);
    NCCL_CHECK(ncclCommInitRank(&comm_, size, unique, rank));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    device_.add_wait_watch(this, [this] { check_peers(); });
  }

  ~NcclCollectives() override {
    device_.remove_wait_watch(this);
    // Nothing may still use the communicator or the buffers: the stream drains first (an
    // aborted communicator's work has ended already).
    (void)cudaStreamSynchronize(stream_);
    if (comm_) (void)ncclCommDestroy(comm_);
    (void)cudaStreamDestroy(stream_);
  }

  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  const char* transport() const override { return "nccl"; }
  bool device_memory() const override { return true; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Fixed order, as the MPI path: a reduce-scatter over even segments, then an all-gather.
  void allreduce_sum(float* data, std::int64_t n) override {
    if (size_ == 1 || n == 0) return;
    const std::vector<std::int64_t> counts = even_counts(n, size_);
    after_compute("all-reduce (sum) of " + floats(n));
    const float* mine = queue_reduce_scatter(data, counts);
    queue_allgather(mine, data, counts);
    before_compute();
  }
  // Max is exact in any order: NCCL's own.
  void allreduce_max(float* data, std::int64_t n) override {
    if (size_ == 1 || n == 0) return;
    after_compute("all-reduce (max) of " + floats(n));
    NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(n), ncclFloat, ncclMax, comm_,
                             stream_));
    before_compute();
  }

  const float* reduce_scatter(const float* data,
                              const std::vector<std::int64_t>& counts) override {
    if (size_ == 1) return data;
    after_compute("reduce-scatter of " + floats(total(counts)));
    const float* mine = queue_reduce_scatter(data, counts);
    before_compute();
    return mine;
  }

  void allgather(const float* segment, float* out,
                 const std::vector<std::int64_t>& counts) override {
    after_compute("all-gather of " + floats(total(counts)));
    queue_allgather(segment, out, counts);
    before_compute();
  }

  void send(const float* data, std::int64_t n, int peer, int) override {
    group_.push_back({const_cast<float*>(data), n, peer, true});
  }
  void recv(float* data, std::int64_t n, int peer, int) override {
    group_.push_back({data, n, peer, false});
  }

  // The group's sends and receives as one NCCL group: NCCL starts them together, so a send
  // waiting for its receive cannot hold up the group's receive.
  void end_group() override {
    if (group_.empty()) return;
    after_compute(describe_group());
    NCCL_CHECK(ncclGroupStart());
    for (const Message& m : group_) {
      const auto n = static_cast<std::size_t>(m.n);
      if (m.send)
        NCCL_CHECK(ncclSend(m.data, n, ncclFloat, m.peer, comm_, stream_));
      else
        NCCL_CHECK(ncclRecv(m.data, n, ncclFloat, m.peer, comm_, stream_));
    }
    NCCL_CHECK(ncclGroupEnd());
    before_compute();
    group_.clear();
  }

  // Sends are ordered on the device: compute work queued after end_group() runs after them, so
  // it may overwrite their buffers. Nothing to wait for on the host.
  void finish_sends() override {}

 private:
  struct Message {
    float* data;
    std::int64_t n;
    int peer;
    bool send;
  };

  // Rank r's segment of every peer lands in row r of `received_` ([size][mine]) in one group of
  // sends and receives (peers in turn from the next rank on, as FixedOrderReducer posts them);
  // then one kernel adds the rows in rank order 0..n-1 on the NCCL stream.
  const float* queue_reduce_scatter(const float* data, const std::vector<std::int64_t>& counts) {
    const std::vector<std::int64_t> starts = starts_of(counts);
    const std::int64_t mine = counts[static_cast<std::size_t>(rank_)];
    float* received = received_.at_least(mine * size_);
    float* sum = sum_.at_least(mine);
    wait_for_allocations();
    NCCL_CHECK(ncclGroupStart());
    for (int k = 1; k < size_; ++k) {
      const int r = (rank_ + k) % size_;
      if (mine > 0)
        NCCL_CHECK(ncclRecv(received + r * mine, static_cast<std::size_t>(mine), ncclFloat, r,
                            comm_, stream_));
      if (counts[static_cast<std::size_t>(r)] > 0)
        NCCL_CHECK(ncclSend(data + starts[r], static_cast<std::size_t>(counts[r]), ncclFloat, r,
                            comm_, stream_));
    }
    NCCL_CHECK(ncclGroupEnd());
    sum_in_rank_order(stream_, sum, data + starts[rank_], received, mine, size_, rank_);
    return sum;
  }

  // Every rank's segment to every other rank (copies: every rank gets the same bits).
  void queue_allgather(const float* segment, float* out, const std::vector<std::int64_t>& counts) {
    const std::vector<std::int64_t> starts = starts_of(counts);
    const std::int64_t mine = counts[static_cast<std::size_t>(rank_)];
    if (segment != out + starts[rank_] && mine > 0)
      CUDA_CHECK(cudaMemcpyAsync(out + starts[rank_], segment,
                                 static_cast<std::size_t>(mine) * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream_));
    if (size_ == 1) return;
    NCCL_CHECK(ncclGroupStart());
    for (int k = 1; k < size_; ++k) {
      const int r = (rank_ + k) % size_;
      if (counts[static_cast<std::size_t>(r)] > 0)
        NCCL_CHECK(ncclRecv(out + starts[r], static_cast<std::size_t>(counts[r]), ncclFloat, r,
                            comm_, stream_));
      if (mine > 0)
        NCCL_CHECK(ncclSend(segment, static_cast<std::size_t>(mine), ncclFloat, r, comm_,
                            stream_));
    }
    NCCL_CHECK(ncclGroupEnd());
  }

  static std::int64_t total(const std::vector<std::int64_t>& counts) {
    std::int64_t n = 0;
    for (const std::int64_t c : counts) n += c;
    return n;
  }
  std::string describe_group() const {
    std::string text;
    for (const Message& m : group_)
      text += std::string(text.empty() ? "" : ", ") + (m.send ? "send " : "receive ") +
              floats(m.n) + (m.send ? " to rank " : " from rank ") + std::to_string(m.peer);
    return text;
  }

  // An operation (a unit of work the watchdog follows, described by `what`): the NCCL stream
  // starts after the work queued so far on the compute stream (which wrote the inputs) ...
  void after_compute(std::string what) { start_after_compute(progress_.open(std::move(what))); }
  // ... (scratch just allocated on the compute stream included) ...
  void wait_for_allocations() { start_after_compute(progress_.ready_of_open()); }
  void start_after_compute(cudaEvent_t ready) {
    CUDA_CHECK(cudaEventRecord(ready, device_.compute_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
  }
  // ... and the compute stream's later work waits for the NCCL stream (which wrote the results).
  void before_compute() {
    const cudaEvent_t done = progress_.close();
    CUDA_CHECK(cudaEventRecord(done, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(device_.compute_stream(), done, 0));
  }

  // Run by the device while the host waits on it: a peer that failed or stopped (NCCL reports
  // it as an asynchronous error: a remote error, a timeout in the emulation), or this stream's
  // work waiting on its peers without progress for longer than parallel.nccl_timeout_s (a peer
  // alive but stalled, which NCCL never reports), aborts this rank's communicator, so no work
  // of it can hang, and ends the whole job at once naming the group and this rank (fatal_abort,
  // as NCCL_CHECK: an exception would unwind through destructors that wait on the broken device
  // and fail there first, under another name).
  void check_peers() {
    if (comm_ == nullptr) return;
    ncclResult_t state = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      const char* last = ncclGetLastError(comm_);
      abort_job(std::string(ncclGetErrorString(state)) +
                (last && *last ? std::string(": ") + last : std::string()) +
                "; its communicator was aborted");
    }
    if (stall_limit_s_ <= 0) return;
    const auto limit = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(stall_limit_s_));
    if (const std::optional<StreamProgress::Stall> stall = progress_.stalled(limit))
      abort_job("no progress for " + seconds_text(stall->seconds, true) +
                " (parallel.nccl_timeout_s = " + seconds_text(stall_limit_s_) +
                ") waiting on its peers for " + stall->what +
                (stall->queued_behind ? " (" + std::to_string(stall->queued_behind) +
                                            " more queued behind it)"
                                      : std::string()) +
                "; a stalled peer? its communicator was aborted; raise parallel.nccl_timeout_s if "
                "a collective legitimately takes longer");
  }

  [[noreturn]] void abort_job(const std::string& why) {
    const std::string message = "NCCL " + group_name_ + " group (rank " + std::to_string(rank_) +
                                " of " + std::to_string(size_) + "): " + why;
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    fatal_abort(ExitCode::runtime, message);
  }

  CudaDevice& device_;
  int rank_, size_;
  std::string group_name_;  // "tp", "dp", "pp": for messages
  double stall_limit_s_;    // parallel.nccl_timeout_s; 0: no watchdog
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  StreamProgress progress_;  // the units of work on stream_, for the watchdog
  DeviceScratch received_;  // [size][this rank's segment]: every peer's copy of it
  DeviceScratch sum_;       // this rank's reduced segment
  std::vector<Message> group_;  // messages posted since the last end_group()
};

void set_unless_set(const char* name, const char* value) {
  if (std::getenv(name) == nullptr) setenv(name, value, 0);
}

}  // namespace

bool nccl_built() { return true; }

std::string nccl_version() {
  int v = 0;
  NCCL_CHECK(ncclGetVersion(&v));
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

NcclId make_nccl_id() {
  ncclUniqueId unique;
  NCCL_CHECK(ncclGetUniqueId(&unique));
  NcclId id;
  std::memcpy(id.data(), &unique, sizeof unique);
  return id;
}

std::string pin_deterministic_nccl() {
  set_unless_set("NCCL_ALGO", "Ring");
  set_unless_set("NCCL_PROTO", "Simple");
  set_unless_set("NCCL_NVLS_ENABLE", "0");
  set_unless_set("NCCL_COLLNET_ENABLE", "0");
  std::string in_force;
  for (const char* name : {"NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE"})
    in_force += std::string(in_force.empty() ? "" : " ") + name + "=" + std::getenv(name);
  return in_force;
}

std::unique_ptr<Collectives> make_nccl_collectives(Device& device, int rank, int size,
                                                   const NcclId& id, const std::string& group,
                                                   double stall_limit_s) {
  auto* gpu = dynamic_cast<CudaDevice*>(&device);
  if (gpu == nullptr)
    throw Error(ExitCode::runtime, "NCCL needs the compute rank's device to be a GPU, not " +
                                       device.describe());
  pin_deterministic_nccl();
  return std::make_unique<NcclCollectives>(*gpu, rank, size, id, group, stall_limit_s);
}

}  // namespace pdtrain
