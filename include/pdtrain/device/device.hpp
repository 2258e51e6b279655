#pragma once
// Where a compute rank's model lives and runs: the CPU (host memory, CpuDevice) or one NVIDIA
// GPU (CudaDevice, in builds with -DPDTRAIN_CUDA=ON). The model, the parameter cache and the
// staging code speak only this interface; nothing above it includes a CUDA header.
//
// Two queues order the work: `compute` (kernels, and the copies the model makes) and `copy`
// (parameter uploads from pinned staging, so they overlap compute). Work on one queue runs in
// the order it was queued; events order one queue after a point of the other without blocking
// the host. On the CPU everything runs at once, in program order, and events are no-ops.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace pdtrain {

enum class MemoryKind {
  host,    // ordinary host memory
  pinned,  // page-locked host memory: asynchronous copies to and from the device
  device,  // the device's own memory (host memory on the CPU device)
};

enum class Queue { compute, copy };

// A point in a queue's work (cudaEvent_t on a GPU).
class Event {
 public:
  virtual ~Event() = default;
};

class Device {
 public:
  virtual ~Device() = default;
  // "cpu" or e.g. "cuda:0 NVIDIA H200 (132 SMs, 140.4 GiB)".
  virtual std::string describe() const = 0;
  // True when device memory is host memory: staging copies are then skipped entirely.
  virtual bool is_host() const = 0;

  // Zero-filled memory of `bytes` (the fill is queued on the compute queue on a GPU). Throws
  // pdtrain::Error(runtime) naming the size when the memory is not there.
  void* allocate(std::size_t bytes, MemoryKind kind) {
    void* p = do_allocate(bytes, kind);
    if (kind == MemoryKind::device) count(static_cast<std::int64_t>(bytes));
    return p;
  }
  void release(void* p, std::size_t bytes, MemoryKind kind) noexcept {
    if (kind == MemoryKind::device) count(-static_cast<std::int64_t>(bytes));
    do_release(p, kind);
  }

  // Copies `bytes` between any two of host, pinned and device memory, queued on `queue`
  // (asynchronous on a GPU: host memory must stay valid and unchanged until the queue has
  // reached the copy; only pinned host memory overlaps with compute).
  virtual void copy(void* dst, const void* src, std::size_t bytes,
                    Queue queue = Queue::compute) = 0;
  virtual void zero(void* dst, std::size_t bytes) = 0;  // on the compute queue
  // The host waits until everything queued on the compute queue is done.
  virtual void synchronize() = 0;

  virtual std::unique_ptr<Event> make_event() = 0;
  virtual void record(Event& event, Queue queue) = 0;       // event = queue's current end
  virtual void wait(Queue queue, const Event& event) = 0;   // later work on queue waits for it
  virtual void wait_host(const Event& event) = 0;           // the host waits for it

  // Bytes of device memory allocated now and at most, for summaries and tests.
  std::int64_t bytes_in_use() const { return in_use_; }
  std::int64_t peak_bytes() const { return peak_; }

  // What the device memory allocated now is for ("the parameter cache's slot for layer3"),
  // named by an out-of-memory error; set by AllocationLabel around the allocations, read only
  // by the rank's thread that allocates.
  const std::string& allocation_label() const { return label_; }
  void set_allocation_label(std::string label) { label_ = std::move(label); }

 protected:
  virtual void* do_allocate(std::size_t bytes, MemoryKind kind) = 0;
  virtual void do_release(void* p, MemoryKind kind) noexcept = 0;

 private:
  void count(std::int64_t bytes) {
    in_use_ += bytes;
    if (in_use_ > peak_) peak_ = in_use_;
  }
  std::int64_t in_use_ = 0, peak_ = 0;
  std::string label_;
};

// Names what the allocations of a scope are for, so that an out-of-memory error says what was
// being allocated (the previous label comes back at the end of the scope).
class AllocationLabel {
 public:
  AllocationLabel(Device& device, std::string label)
      : device_(device), previous_(device.allocation_label()) {
    device_.set_allocation_label(std::move(label));
  }
  ~AllocationLabel() { device_.set_allocation_label(std::move(previous_)); }
  AllocationLabel(const AllocationLabel&) = delete;
  AllocationLabel& operator=(const AllocationLabel&) = delete;

 private:
  Device& device_;
  std::string previous_;
};

// The process's CPU device (host memory, synchronous).
Device& cpu_device();

// n elements of T in one kind of a device's memory, zero-filled; move-only.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device& device, std::int64_t n, MemoryKind kind = MemoryKind::device)
      : device_(&device), kind_(kind), n_(n) {
    if (n_ > 0) data_ = static_cast<T*>(device.allocate(bytes(), kind));
  }
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::int64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  std::size_t bytes() const { return static_cast<std::size_t>(n_) * sizeof(T); }
  MemoryKind kind() const { return kind_; }

 private:
  void reset() {
    if (data_ != nullptr) device_->release(data_, bytes(), kind_);
    data_ = nullptr;
    n_ = 0;
  }
  void swap(Buffer& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(kind_, o.kind_);
    std::swap(n_, o.n_);
    std::swap(data_, o.data_);
  }

  Device* device_ = nullptr;
  MemoryKind kind_ = MemoryKind::host;
  std::int64_t n_ = 0;
  T* data_ = nullptr;
};

// Device memory with a host view: `device()` is where kernels read and write, `host()` where
// the host does (a pinned mirror on a GPU, the same memory on the CPU). Moving data between
// the two is explicit (upload/download), so the CPU path makes no copy at all.
template <class T>
class Mirrored {
 public:
  Mirrored() = default;
  Mirrored(Device& device, std::int64_t n) : device_(&device), dev_(device, n) {
    if (!device.is_host()) host_ = Buffer<T>(device, n, MemoryKind::pinned);
  }
  T* device() { return dev_.data(); }
  const T* device() const { return dev_.data(); }
  T* host() { return host_.empty() ? dev_.data() : host_.data(); }
  const T* host() const { return host_.empty() ? dev_.data() : host_.data(); }
  std::int64_t size() const { return dev_.size(); }
  bool empty() const { return dev_.empty(); }
  // host -> device of elements [begin, begin + n), on `queue`.
  void upload(std::int64_t begin, std::int64_t n, Queue queue = Queue::compute) {
    if (!host_.empty() && n > 0)
      device_->copy(dev_.data() + begin, host_.data() + begin, bytes(n), queue);
  }
  void upload() { upload(0, size()); }
  // device -> host of every element; the host view is valid once the device synchronized.
  void download() {
    if (!host_.empty() && size() > 0) device_->copy(host_.data(), dev_.data(), bytes(size()));
  }

 private:
  static std::size_t bytes(std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(T); }
  Device* device_ = nullptr;
  Buffer<T> dev_, host_;
};

}  // namespace pdtrain
