#pragma once
// The CUDA device (src/device/cuda/cuda_device.cpp): one GPU, its memory, and two streams. For
// CUDA code only (it includes the CUDA runtime); everything else sees a Device&.
//
// Memory: device = cudaMalloc (zero-filled on the compute stream, which the copy stream then
// waits for, so a first upload on either queue lands after the fill), pinned = cudaMallocHost
// (zero-filled on the host), host = ordinary aligned host memory. Queues: compute and copy are
// two streams created with cudaStreamNonBlocking (they never synchronize with the legacy
// default stream); copies are cudaMemcpyAsync with cudaMemcpyDefault (any pair of kinds), events
// are cudaEvents without timing. The CUDA kernels run on compute_stream().
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pdtrain/device/device.hpp"

namespace pdtrain {

// GPU `gpu`'s UUID as nvidia-smi -L prints it ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"); ""
// when this process cannot see that GPU.
std::string gpu_uuid(int gpu);

class CudaDevice final : public Device {
 public:
  // Makes GPU `gpu` current on the calling thread (cudaSetDevice) and creates the streams.
  // The caller has checked that the GPU exists.
  explicit CudaDevice(int gpu);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  // "cuda:0 NVIDIA H200 (132 SMs, 140.4 GiB)"
  std::string describe() const override { return description_; }
  bool is_host() const override { return false; }

  void copy(void* dst, const void* src, std::size_t bytes, Queue queue) override;
  // Device memory: cudaMemsetAsync on the compute stream; host memory: the host waits for the
  // compute stream and clears it.
  void zero(void* dst, std::size_t bytes) override;
  // The host waits; with wait watches (below) it polls and runs them meanwhile.
  void synchronize() override;

  std::unique_ptr<Event> make_event() override;
  void record(Event& event, Queue queue) override;
  void wait(Queue queue, const Event& event) override;
  void wait_host(const Event& event) override;

  int gpu() const { return gpu_; }
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it: the same GPU has the
  // same UUID in every process of the node, whatever CUDA_VISIBLE_DEVICES numbers it.
  const std::string& uuid() const { return uuid_; }
  int sm_count() const { return sm_count_; }
  cudaStream_t stream(Queue queue) const { return queue == Queue::copy ? copy_ : compute_; }
  cudaStream_t compute_stream() const { return compute_; }
  // Makes this device's GPU current on the calling thread (a thread other than the one that
  // created the device must call this before it launches kernels on the device's streams).
  void make_current() const;

  // A check the host runs over and over while it waits for this device (synchronize,
  // wait_host, and once when a wait ends in a CUDA error), so that a wait on work that can never
  // finish ends with the check's error instead of a hang: the NCCL collectives add theirs
  // (ncclCommGetAsyncError; a peer that failed). `owner` names it for remove_wait_watch. While
  // none is set, waits block in the CUDA runtime as before.
  void add_wait_watch(const void* owner, std::function<void()> check);
  void remove_wait_watch(const void* owner);
  void run_wait_watches() const;

 protected:
  void* do_allocate(std::size_t bytes, MemoryKind kind) override;
  void do_release(void* p, MemoryKind kind) noexcept override;

 private:
  std::string out_of_memory(std::size_t bytes) const;

  int gpu_;
  int sm_count_ = 0;
  std::string description_;
  std::string uuid_;
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  std::vector<std::pair<const void*, std::function<void()>>> watches_;
  template <class Query>
  void wait_watched(Query query, const char* call);
  cudaEvent_t filled_ =
      nullptr;  // the last zero-fill of new memory, for the copy stream to wait on
};

}  // namespace pdtrain
