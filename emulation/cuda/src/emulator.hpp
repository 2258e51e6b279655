#pragma once
// What the parts of the CUDA emulation share (emulation/cuda/src): the tracked memory, the
// current device, queued work on streams and the device faults. The cuBLASLt and NCCL
// emulations queue their work through enqueue() exactly as kernels and copies do.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace cuda_emu {

// ---------------------------------------------------------------------------------------------
// Memory (memory.cpp). Device and pinned memory are host memory the emulation allocates and
// tracks; anything else is pageable host memory.
enum class MemoryKind { device, pinned, pageable };

struct Region {
  char* base = nullptr;
  std::size_t bytes = 0;
  MemoryKind kind = MemoryKind::pageable;
  int device = -1;  // the device it belongs to (pinned: the device current when allocated)
};

// The tracked allocation that holds the byte at p; nullopt for pageable host memory.
std::optional<Region> find_region(const void* p);
// The kind of memory at p (pageable when untracked).
MemoryKind kind_of(const void* p);
const char* kind_name(MemoryKind kind);  // "device memory", "pinned host memory", ...

// ---------------------------------------------------------------------------------------------
// Devices and errors (devices.cpp).
int visible_device_count();   // 0 when the emulated node has none visible
int current_device();         // this host thread's (cudaSetDevice), 0 by default
std::size_t device_memory_bytes();  // each device's memory (PDTRAIN_CUDA_EMU_MEMORY)
// cudaSuccess, or the sticky error of `device` once one of its kernels faulted.
cudaError_t sticky_error(int device);
// Records `error` as this host thread's last error and returns it (every failing call does).
cudaError_t fail(cudaError_t error);
// fail() with a message on stderr saying what was wrong ("cuda emulation: <call>: <why>").
cudaError_t fail(cudaError_t error, const std::string& call, const std::string& why);
// A fault of queued work on `device` (a kernel's barrier never reached, a race, a library call
// whose arguments were refused when it ran): printed at once, then sticky as on a GPU: every
// later call on the device returns `error`.
void fault(int device, cudaError_t error, const std::string& message);

// The running kernel thread's fault (kernels.cpp): what it did is one a GPU refuses or leaves
// undefined (`why`, after the block and thread it names); the thread never runs again and the
// launch faults as a barrier never reached does.
[[noreturn]] void thread_fault(const std::string& why);
// The running kernel thread's linear index in its block; -1 when the caller runs no kernel
// thread (the kernel counts attribute accesses with it: profile.cpp).
int running_thread();

// ---------------------------------------------------------------------------------------------
// Streams (streams.cpp). Each stream is an in-order queue run by a worker thread of its own.

// The stream's device; for nullptr (the legacy default stream) the current device.
int device_of(cudaStream_t stream);
// Queues `work` on `stream` (nullptr: the current device's legacy default stream). `what` names
// it in fault messages. Fails (without queueing) on a device with a sticky error. Work never
// runs after its device faulted.
cudaError_t enqueue(cudaStream_t stream, std::string what, std::function<void()> work);
// The host waits until everything queued so far on `stream` has run.
cudaError_t synchronize(cudaStream_t stream);
// The host waits until everything queued on every stream of `device` has run.
cudaError_t synchronize_device(int device);

// ---------------------------------------------------------------------------------------------
// Kernel attributes (func_attributes.cpp): the dynamic shared memory a launch of `func` may
// ask for: 48 KiB, or what cudaFuncSetAttribute raised it to (at most kMaxOptinShared).
constexpr std::size_t kDefaultDynamicShared = 48 * 1024;
constexpr std::size_t kMaxOptinShared = 227 * 1024;  // sm_90's opt-in limit per block
std::size_t dynamic_shared_limit(const void* func);

// ---------------------------------------------------------------------------------------------
// Work counts (counters.cpp; PDTRAIN_CUDA_EMU_COUNTS=DIR): one queued piece of work of `kind`
// ("kernel", "gemm", "copy", "memset") called `name`, with the threads it runs and the FLOPs and
// bytes known for it (0 where unknown).
bool counting();
void count_work(const char* kind, const std::string& name, std::uint64_t threads,
                std::uint64_t flops, std::uint64_t bytes);

}  // namespace cuda_emu
