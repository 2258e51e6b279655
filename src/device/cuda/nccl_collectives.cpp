// The NCCL implementation of the collectives seam: a communicator per group of compute ranks,
// its own stream gated by events on the device's compute stream. See
// device/nccl_collectives.hpp.
#include "pdtrain/device/nccl_collectives.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "pdtrain/core/error.hpp"
#include "pdtrain/device/cuda_check.hpp"
#include "pdtrain/device/cuda_device.hpp"
#include "pdtrain/device/nccl_check.hpp"

namespace pdtrain {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NcclId must hold an ncclUniqueId");

namespace {

std::vector<std::int64_t> starts_of(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> starts(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) starts[r] = starts[r - 1] + counts[r - 1];
  return starts;
}

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(CudaDevice& device, int rank, int size, const NcclId& id)
      : device_(device), rank_(rank), size_(size) {
    device_.make_current();
    ncclUniqueId unique;
    std::memcpy(&unique, id.data(), sizeof unique);
    NCCL_CHECK(ncclCommInitRank(&comm_, size, unique, rank));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&results_ready_, cudaEventDisableTiming));
  }

  ~NcclCollectives() override {
    // Nothing may still use the communicator or the buffers: the stream drains first.
    (void)cudaStreamSynchronize(stream_);
    (void)ncclCommDestroy(comm_);
    (void)cudaEventDestroy(inputs_ready_);
    (void)cudaEventDestroy(results_ready_);
    (void)cudaStreamDestroy(stream_);
  }

  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  const char* transport() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(float* data, std::int64_t n) override { allreduce(data, n, ncclSum); }
  void allreduce_max(float* data, std::int64_t n) override { allreduce(data, n, ncclMax); }

  // One ncclReduce per segment, rooted at the segment's rank, in one group: segments may differ
  // in size (ncclReduceScatter's may not).
  const float* reduce_scatter(const float* data,
                              const std::vector<std::int64_t>& counts) override {
    if (size_ == 1) return data;
    const std::vector<std::int64_t> starts = starts_of(counts);
    ensure_sum_capacity(counts[static_cast<std::size_t>(rank_)]);
    after_compute();
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r)
      NCCL_CHECK(ncclReduce(data + starts[r], sum_, static_cast<std::size_t>(counts[r]),
                            ncclFloat, ncclSum, r, comm_, stream_));
    NCCL_CHECK(ncclGroupEnd());
    before_compute();
    return sum_;
  }

  // One ncclBroadcast per segment from its rank: copies, so every rank gets the same bits.
  void allgather(const float* segment, float* out,
                 const std::vector<std::int64_t>& counts) override {
    const std::vector<std::int64_t> starts = starts_of(counts);
    after_compute();
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r)
      NCCL_CHECK(ncclBroadcast(r == rank_ ? segment : nullptr, out + starts[r],
                               static_cast<std::size_t>(counts[r]), ncclFloat, r, comm_,
                               stream_));
    NCCL_CHECK(ncclGroupEnd());
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

  void allreduce(float* data, std::int64_t n, ncclRedOp_t op) {
    if (size_ == 1 || n == 0) return;
    after_compute();
    NCCL_CHECK(ncclAllReduce(data, data, static_cast<std::size_t>(n), ncclFloat, op, comm_,
                             stream_));
    before_compute();
  }

  // The NCCL stream starts after the work queued so far on the compute stream (which wrote the
  // inputs) ...
  void after_compute() {
    CUDA_CHECK(cudaEventRecord(inputs_ready_, device_.compute_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
  }
  // ... and the compute stream's later work waits for the NCCL stream (which wrote the results).
  void before_compute() {
    CUDA_CHECK(cudaEventRecord(results_ready_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(device_.compute_stream(), results_ready_, 0));
  }

  void ensure_sum_capacity(std::int64_t n) {
    if (n <= sum_capacity_) return;
    // The old buffer may still be read by queued work: free it in stream order.
    if (sum_) CUDA_CHECK(cudaFreeAsync(sum_, device_.compute_stream()));
    CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&sum_),
                               static_cast<std::size_t>(n) * sizeof(float),
                               device_.compute_stream()));
    sum_capacity_ = n;
  }

  CudaDevice& device_;
  int rank_, size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr, results_ready_ = nullptr;
  float* sum_ = nullptr;  // this rank's reduced segment (device memory)
  std::int64_t sum_capacity_ = 0;
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
                                                   const NcclId& id) {
  auto* gpu = dynamic_cast<CudaDevice*>(&device);
  if (gpu == nullptr)
    throw Error(ExitCode::runtime, "NCCL needs the compute rank's device to be a GPU, not " +
                                       device.describe());
  pin_deterministic_nccl();
  return std::make_unique<NcclCollectives>(*gpu, rank, size, id);
}

}  // namespace pdtrain
