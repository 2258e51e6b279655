// The NCCL implementation of the collectives seam: a communicator per group of compute ranks,
// its own stream gated by events on the device's compute stream. See
// device/nccl_collectives.hpp.
#include "pdtrain/device/nccl_collectives.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
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

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(CudaDevice& device, int rank, int size, const NcclId& id, std::string group)
      : device_(device), rank_(rank), size_(size), group_name_(std::move(group)),
        received_(device.compute_stream()), sum_(device.compute_stream()) {
    device_.make_current();
    ncclUniqueId unique;
    std::memcpy(&unique, id.data(), sizeof unique);
    NCCL_CHECK(ncclCommInitRank(&comm_, size, unique, rank));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&results_ready_, cudaEventDisableTiming));
    device_.add_wait_watch(this, [this] { check_peers(); });
  }

  ~NcclCollectives() override {
    device_.remove_wait_watch(this);
    // Nothing may still use the communicator or the buffers: the stream drains first (an
    // aborted communicator's work has ended already).
    (void)cudaStreamSynchronize(stream_);
    if (comm_) (void)ncclCommDestroy(comm_);
    (void)cudaEventDestroy(inputs_ready_);
    (void)cudaEventDestroy(results_ready_);
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
    after_compute();
    const float* mine = queue_reduce_scatter(data, counts);
    queue_allgather(mine, data, counts);
    before_compute();
  }
  // Max is exact in any order: NCCL's own.
  void allreduce_max(float* data, std::int64_t n) override {
    if (size_ == 1 || n == 0) return;
    after_compute();
    NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(n), ncclFloat, ncclMax, comm_,
                             stream_));
    before_compute();
  }

  const float* reduce_scatter(const float* data,
                              const std::vector<std::int64_t>& counts) override {
    if (size_ == 1) return data;
    after_compute();
    const float* mine = queue_reduce_scatter(data, counts);
    before_compute();
    return mine;
  }

  void allgather(const float* segment, float* out,
                 const std::vector<std::int64_t>& counts) override {
    after_compute();
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
    after_compute();
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

  // The NCCL stream starts after the work queued so far on the compute stream (which wrote the
  // inputs) ...
  void after_compute() {
    CUDA_CHECK(cudaEventRecord(inputs_ready_, device_.compute_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
  }
  // ... (scratch just allocated on the compute stream included) ...
  void wait_for_allocations() { after_compute(); }
  // ... and the compute stream's later work waits for the NCCL stream (which wrote the results).
  void before_compute() {
    CUDA_CHECK(cudaEventRecord(results_ready_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(device_.compute_stream(), results_ready_, 0));
  }

  // Run by the device while the host waits on it: a peer that failed or stopped (NCCL reports
  // it as an asynchronous error: a remote error, a timeout in the emulation) aborts this
  // rank's communicator, so no work of it can hang, and ends the whole job at once naming the
  // group and this rank (fatal_abort, as NCCL_CHECK: an exception would unwind through
  // destructors that wait on the broken device and fail there first, under another name).
  void check_peers() {
    if (comm_ == nullptr) return;
    ncclResult_t state = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
    if (state == ncclSuccess || state == ncclInProgress) return;
    const char* last = ncclGetLastError(comm_);
    const std::string message =
        "NCCL " + group_name_ + " group (rank " + std::to_string(rank_) + " of " +
        std::to_string(size_) + "): " + ncclGetErrorString(state) +
        (last && *last ? std::string(": ") + last : std::string()) +
        "; its communicator was aborted";
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    fatal_abort(ExitCode::runtime, message);
  }

  CudaDevice& device_;
  int rank_, size_;
  std::string group_name_;  // "tp", "dp", "pp": for messages
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr, results_ready_ = nullptr;
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
                                                   const NcclId& id, const std::string& group) {
  auto* gpu = dynamic_cast<CudaDevice*>(&device);
  if (gpu == nullptr)
    throw Error(ExitCode::runtime, "NCCL needs the compute rank's device to be a GPU, not " +
                                       device.describe());
  pin_deterministic_nccl();
  return std::make_unique<NcclCollectives>(*gpu, rank, size, id, group);
}

}  // namespace pdtrain
