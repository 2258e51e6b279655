#pragma once
// Compute-to-compute traffic of a GPU rank goes through pinned host memory: MPI here sees host
// memory only (no CUDA-aware MPI is assumed; NCCL is a separate path). Several compute ranks
// may then share one GPU. On the CPU device nothing is copied: the adapters pass pointers on.
#include <cstdint>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/device/device.hpp"

namespace pdtrain {

// A growing pinned buffer for device -> host -> device round trips.
class HostStaging {
 public:
  explicit HostStaging(Device& device) : device_(device) {}
  Device& device() const { return device_; }
  // The n floats at device pointer `data`, readable on the host (waits for the device).
  const float* download(const float* data, std::int64_t n);
  // `host` (n floats, e.g. from download()) to device pointer `data`, queued on the compute
  // queue; staging stays valid until the next download or upload.
  void upload(float* data, const float* host, std::int64_t n);
  float* buffer(std::int64_t n);  // at least n floats of pinned memory

 private:
  Device& device_;
  Buffer<float> pinned_;
};

// A tensor-parallel group for a model in device memory: each collective downloads, runs the
// host group's collective (the same fixed-order sums), and uploads the result.
class StagedTensorParallel final : public TensorParallelOps {
 public:
  StagedTensorParallel(TensorParallelOps& host_group, Device& device)
      : group_(host_group), staging_(device) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void allreduce_sum(float* data, std::int64_t n) override;
  void allreduce_max(float* data, std::int64_t n) override;

 private:
  template <class Collective>
  void staged(float* data, std::int64_t n, Collective&& collective);
  TensorParallelOps& group_;
  HostStaging staging_;
};

}  // namespace pdtrain
