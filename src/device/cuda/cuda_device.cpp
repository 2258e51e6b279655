// The CUDA device: one GPU's memory, a compute and a copy stream, events.
#include "pdtrain/device/cuda_device.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "pdtrain/core/error.hpp"
#include "pdtrain/device/cuda_check.hpp"

namespace pdtrain {
namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent() { CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

const CudaEvent& cuda_event(const Event& e) {
  const auto* ce = dynamic_cast<const CudaEvent*>(&e);
  if (ce == nullptr)
    fatal_abort(ExitCode::runtime, "CudaDevice: an event of another device was passed to it");
  return *ce;
}

std::string mib(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1ull << 20));
  return text;
}

std::string gib(std::size_t bytes) {  // a GPU's size: MiB below 1 GiB (an emulated one's)
  if (bytes < (1ull << 30)) return mib(bytes);
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

// A release that fails because the CUDA runtime is already shutting down (process exit) has
// nothing left to free; any other failure is a fault.
void check_release(cudaError_t rc, const char* call) {
  if (rc == cudaErrorCudartUnloading) return;
  if (rc != cudaSuccess) cuda_fail(rc, call, __FILE__, __LINE__);
}

}  // namespace

std::string gpu_uuid(int gpu) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, gpu) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  const cudaUUID_t& u = prop.uuid;
  static const char* hex = "0123456789abcdef";
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[static_cast<unsigned char>(u.bytes[i]) >> 4];
    s += hex[static_cast<unsigned char>(u.bytes[i]) & 15];
  }
  return s;
}

namespace {

constexpr std::size_t kHostAlign = 64;  // as the CPU device: a cache line, an AVX-512 vector

}  // namespace

CudaDevice::CudaDevice(int gpu) : gpu_(gpu) {
  make_current();
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu_));
  sm_count_ = prop.multiProcessorCount;
  uuid_ = gpu_uuid(gpu_);
  description_ = "cuda:" + std::to_string(gpu_) + " " + prop.name + " (" +
                 std::to_string(sm_count_) + " SMs, " + gib(prop.totalGlobalMem) + ")";
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&filled_, cudaEventDisableTiming));
}

CudaDevice::~CudaDevice() {
  (void)cudaSetDevice(gpu_);
  check_release(cudaStreamSynchronize(copy_), "cudaStreamSynchronize(copy)");
  check_release(cudaStreamSynchronize(compute_), "cudaStreamSynchronize(compute)");
  (void)cudaEventDestroy(filled_);
  (void)cudaStreamDestroy(copy_);
  (void)cudaStreamDestroy(compute_);
}

void CudaDevice::make_current() const { CUDA_CHECK(cudaSetDevice(gpu_)); }

// The error of a failed cudaMalloc: which GPU, what for (the AllocationLabel), the bytes asked
// for against what the GPU has free (cudaMemGetInfo) and what this rank holds, and what makes a
// compute rank need less. Only this rank sees it: main ends the job with it, naming the rank
// ("pdtrain: error (rank R): out of GPU memory ...").
std::string CudaDevice::out_of_memory(std::size_t bytes) const {
  std::size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) (void)cudaGetLastError();
  const std::string what = allocation_label().empty() ? "device memory" : allocation_label();
  return "out of GPU memory on " + description_ +
         ": allocating " + what + " needs " + std::to_string(bytes) + " bytes (" + mib(bytes) +
         ") but the GPU has " + std::to_string(free_bytes) + " bytes (" + mib(free_bytes) +
         ") free of " + std::to_string(total) + " (" + mib(total) + "); this rank holds " +
         std::to_string(bytes_in_use()) + " bytes (" +
         mib(static_cast<std::size_t>(bytes_in_use())) +
         ") of it. Hint: with parameter holders (parallel.holders >= 1) and pd.cache_mb set, a "
         "compute rank keeps only a bounded parameter cache, its units' gradients and its "
         "activations on the GPU, not the whole model's parameters, gradients and AdamW state "
         "(with them already: a smaller pd.cache_mb, parallel.order = \"layer\" on one stage "
         "for one layer's gradients at a time); or use smaller micro-batches (more "
         "parallel.micro_batches, train.recompute = \"full\"); `pdtrain plan DECK --machine "
         "FILE` predicts each rank's memory";
}

void* CudaDevice::do_allocate(std::size_t bytes, MemoryKind kind) {
  make_current();
  const std::size_t n = bytes > 0 ? bytes : 1;  // a valid, distinct pointer even for 0 bytes
  void* p = nullptr;
  switch (kind) {
    case MemoryKind::device: {
      const cudaError_t rc = cudaMalloc(&p, n);
      if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // not sticky, but clear it so no later check reports it
        throw Error(ExitCode::runtime, out_of_memory(bytes));
      }
      if (rc != cudaSuccess) cuda_fail(rc, "cudaMalloc", __FILE__, __LINE__);
      // Zero-filled on the compute stream; the copy stream waits for the fill too, so an upload
      // on either queue lands after it.
      CUDA_CHECK(cudaMemsetAsync(p, 0, n, compute_));
      CUDA_CHECK(cudaEventRecord(filled_, compute_));
      CUDA_CHECK(cudaStreamWaitEvent(copy_, filled_, 0));
      return p;
    }
    case MemoryKind::pinned: {
      const cudaError_t rc = cudaMallocHost(&p, n);
      if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        throw Error(ExitCode::runtime,
                    "cannot allocate " + std::to_string(bytes) +
                        " bytes of pinned (page-locked) host memory" +
                        (allocation_label().empty() ? "" : " for " + allocation_label()));
      }
      if (rc != cudaSuccess) cuda_fail(rc, "cudaMallocHost", __FILE__, __LINE__);
      std::memset(p, 0, n);
      return p;
    }
    case MemoryKind::host:
      break;
  }
  p = std::aligned_alloc(kHostAlign, (n + kHostAlign - 1) / kHostAlign * kHostAlign);
  if (p == nullptr)
    throw Error(ExitCode::runtime,
                "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
  std::memset(p, 0, n);
  return p;
}

void CudaDevice::do_release(void* p, MemoryKind kind) noexcept {
  if (kind == MemoryKind::host) {
    std::free(p);
    return;
  }
  // Queued work on either stream may still use the memory: wait for both before freeing it
  // (releases are rare: buffers are recycled, not freed per step).
  (void)cudaSetDevice(gpu_);
  check_release(cudaStreamSynchronize(compute_), "cudaStreamSynchronize(compute)");
  check_release(cudaStreamSynchronize(copy_), "cudaStreamSynchronize(copy)");
  if (kind == MemoryKind::device)
    check_release(cudaFree(p), "cudaFree");
  else
    check_release(cudaFreeHost(p), "cudaFreeHost");
}

void CudaDevice::copy(void* dst, const void* src, std::size_t bytes, Queue queue) {
  if (bytes == 0 || dst == src) return;
  make_current();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream(queue)));
}

void CudaDevice::zero(void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  make_current();
  cudaPointerAttributes attributes{};
  CUDA_CHECK(cudaPointerGetAttributes(&attributes, dst));
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, compute_));
  } else {  // host memory (pinned or not): in queue order, by the host
    synchronize();
    std::memset(dst, 0, bytes);
  }
}

void CudaDevice::synchronize() {
  if (watches_.empty()) {
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    return;
  }
  wait_watched([this] { return cudaStreamQuery(compute_); }, "cudaStreamQuery(compute)");
}

void CudaDevice::add_wait_watch(const void* owner, std::function<void()> check) {
  watches_.emplace_back(owner, std::move(check));
}

void CudaDevice::remove_wait_watch(const void* owner) {
  std::erase_if(watches_, [owner](const auto& w) { return w.first == owner; });
}

void CudaDevice::run_wait_watches() const {
  for (const auto& w : watches_) w.second();
}

// Polls `query` until the work is done, running the watches between polls: a short spin
// first (most waits are short), then sleeps of 100 us, which cost a waiting rank nothing.
// A CUDA error runs the watches once more first, so a failed NCCL peer is named as such
// rather than as the fault it left on the stream.
template <class Query>
void CudaDevice::wait_watched(Query query, const char* call) {
  for (int polls = 0;; ++polls) {
    const cudaError_t rc = query();
    if (rc == cudaSuccess) return;
    run_wait_watches();
    if (rc != cudaErrorNotReady) cuda_fail(rc, call, __FILE__, __LINE__);
    if (polls < 100)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

std::unique_ptr<Event> CudaDevice::make_event() {
  make_current();
  return std::make_unique<CudaEvent>();
}

void CudaDevice::record(Event& event, Queue queue) {
  CUDA_CHECK(cudaEventRecord(cuda_event(event).get(), stream(queue)));
}

void CudaDevice::wait(Queue queue, const Event& event) {
  CUDA_CHECK(cudaStreamWaitEvent(stream(queue), cuda_event(event).get(), 0));
}

void CudaDevice::wait_host(const Event& event) {
  const cudaEvent_t e = cuda_event(event).get();
  if (watches_.empty()) {
    CUDA_CHECK(cudaEventSynchronize(e));
    return;
  }
  wait_watched([e] { return cudaEventQuery(e); }, "cudaEventQuery");
}

}  // namespace pdtrain
