// Device and pinned memory: host memory the emulation allocates exactly (so AddressSanitizer
// reports an access one byte past an allocation, where a GPU would round the allocation up and
// say nothing) and tracks by address range, so that every copy is checked against the kinds
// and the bounds of what it touches, as CUDA's unified addressing sees them.
//
// New device memory is filled with 0xff bytes (NaN as floats; cudaMalloc does not clear it):
// code that reads device memory it never wrote computes NaN instead of a lucky zero. Each
// device has PDTRAIN_CUDA_EMU_MEMORY bytes (devices.cpp); an allocation past that fails with
// cudaErrorMemoryAllocation, as on a GPU that is full.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "emulator.hpp"

namespace cuda_emu {
namespace {

constexpr std::size_t kDeviceAlign = 256;  // cudaMalloc's alignment
constexpr std::size_t kPinnedAlign = 4096;
constexpr std::size_t kPoisonBelow = std::size_t{256} << 20;  // fill allocations up to 256 MiB

struct Tracker {
  std::mutex mu;
  std::map<std::uintptr_t, Region> regions;  // by base address
  std::map<int, std::size_t> used;           // device memory in use per device
};

Tracker& tracker() {
  static Tracker* t = new Tracker;  // outlives static destructors that may still free memory
  return *t;
}

std::optional<Region> region_at(const void* p) {
  Tracker& t = tracker();
  std::lock_guard lock(t.mu);
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = t.regions.upper_bound(address);
  if (it == t.regions.begin()) return std::nullopt;
  --it;
  const Region& r = it->second;
  if (address < it->first + (r.bytes > 0 ? r.bytes : 1)) return r;
  return std::nullopt;
}

std::string describe(const void* p, const std::optional<Region>& r) {
  char text[160];
  if (!r) {
    std::snprintf(text, sizeof text, "%p (pageable host memory)", p);
  } else {
    std::snprintf(text, sizeof text, "%p (byte %zu of a %zu-byte allocation of %s)", p,
                  static_cast<std::size_t>(static_cast<const char*>(p) - r->base), r->bytes,
                  kind_name(r->kind));
  }
  return text;
}

cudaError_t check_runtime() {
  if (visible_device_count() == 0) {
    int n = 0;
    return cudaGetDeviceCount(&n);  // the reason: no driver or no device
  }
  return sticky_error(current_device());
}

void* allocate(std::size_t bytes, std::size_t align) {
  void* p = nullptr;
  if (posix_memalign(&p, align, bytes) != 0) return nullptr;
  return p;
}

void track(void* p, std::size_t bytes, MemoryKind kind, int device) {
  Tracker& t = tracker();
  std::lock_guard lock(t.mu);
  t.regions[reinterpret_cast<std::uintptr_t>(p)] =
      Region{static_cast<char*>(p), bytes, kind, device};
  if (kind == MemoryKind::device) t.used[device] += bytes;
}

void untrack(const Region& r) {
  Tracker& t = tracker();
  std::lock_guard lock(t.mu);
  t.regions.erase(reinterpret_cast<std::uintptr_t>(r.base));
  if (r.kind == MemoryKind::device) t.used[r.device] -= r.bytes;
}

// The allocation that starts at p and is of `kind`, or an error naming what p is instead.
cudaError_t allocation_start(const char* call, void* p, MemoryKind kind, Region& out) {
  const std::optional<Region> r = region_at(p);
  if (!r || r->base != p || r->kind != kind)
    return fail(cudaErrorInvalidValue, call,
                describe(p, r) + " is not the start of an allocation of " + kind_name(kind));
  out = *r;
  return cudaSuccess;
}

cudaError_t device_malloc(void** p, std::size_t bytes, int device) {
  if (p == nullptr) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (const cudaError_t e = check_runtime()) return e;
  if (bytes == 0) return cudaSuccess;
  {
    Tracker& t = tracker();
    std::lock_guard lock(t.mu);
    if (bytes > device_memory_bytes() || t.used[device] > device_memory_bytes() - bytes)
      return fail(cudaErrorMemoryAllocation);
  }
  void* q = allocate(bytes, kDeviceAlign);
  if (q == nullptr) return fail(cudaErrorMemoryAllocation);
  if (bytes <= kPoisonBelow) std::memset(q, 0xff, bytes);
  track(q, bytes, MemoryKind::device, device);
  *p = q;
  return cudaSuccess;
}

// Whether `kind` may be the source (or destination) of a copy of direction `dir`.
bool host_kind(MemoryKind k) { return k != MemoryKind::device; }
bool direction_allows(cudaMemcpyKind dir, MemoryKind src, MemoryKind dst) {
  switch (dir) {
    case cudaMemcpyHostToHost: return host_kind(src) && host_kind(dst);
    case cudaMemcpyHostToDevice: return host_kind(src) && dst == MemoryKind::device;
    case cudaMemcpyDeviceToHost: return src == MemoryKind::device && host_kind(dst);
    case cudaMemcpyDeviceToDevice: return src == MemoryKind::device && dst == MemoryKind::device;
    case cudaMemcpyDefault: return true;
  }
  return false;
}

const char* direction_name(cudaMemcpyKind dir) {
  switch (dir) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

// [p, p + bytes) must lie inside p's allocation when p is tracked memory (a GPU faults on the
// bytes past it; pageable memory is AddressSanitizer's to check).
cudaError_t check_bounds(const char* call, const char* role, const void* p, std::size_t bytes) {
  const std::optional<Region> r = region_at(p);
  if (!r) return cudaSuccess;
  const std::size_t offset = static_cast<std::size_t>(static_cast<const char*>(p) - r->base);
  if (bytes <= r->bytes - offset) return cudaSuccess;
  return fail(cudaErrorInvalidValue, call,
              std::to_string(bytes) + " bytes at " + role + " " + describe(p, r) +
                  " run past the allocation's end");
}

// A copy checked for null pointers, direction and bounds (CUDA: a direction that does not match
// the pointers is undefined behaviour; here it is an error saying which pointer is wrong).
cudaError_t check_copy(const char* call, void* dst, const void* src, std::size_t bytes,
                       cudaMemcpyKind dir) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue, call, "a null pointer");
  if (dir < cudaMemcpyHostToHost || dir > cudaMemcpyDefault)
    return fail(cudaErrorInvalidMemcpyDirection, call, "not a cudaMemcpyKind");
  const MemoryKind s = kind_of(src), d = kind_of(dst);
  if (!direction_allows(dir, s, d))
    return fail(cudaErrorInvalidMemcpyDirection, call,
                std::string(direction_name(dir)) + " from " + describe(src, region_at(src)) +
                    " to " + describe(dst, region_at(dst)));
  if (const cudaError_t e = check_bounds(call, "source", src, bytes)) return e;
  return check_bounds(call, "destination", dst, bytes);
}

// "device to host", "pinned host to device", ...: a copy's route for the work counts.
std::string copy_route(const void* src, const void* dst) {
  const auto side = [](const void* p) {
    switch (kind_of(p)) {
      case MemoryKind::device: return "device";
      case MemoryKind::pinned: return "pinned host";
      case MemoryKind::pageable: break;
    }
    return "pageable host";
  };
  return std::string(side(src)) + " to " + side(dst);
}

// Queues the copy as CUDA runs it: a pageable source is staged at the call (the caller may
// reuse it on return), a pageable destination makes the call wait for the copy.
cudaError_t queue_copy(const char* call, void* dst, const void* src, std::size_t bytes,
                       cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const bool src_pageable = kind_of(src) == MemoryKind::pageable;
  const bool dst_pageable = kind_of(dst) == MemoryKind::pageable;
  if (counting()) count_work("copy", copy_route(src, dst), 0, 0, bytes);
  cudaError_t e = cudaSuccess;
  if (src_pageable && !dst_pageable) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    e = enqueue(stream, call, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    e = enqueue(stream, call, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  if (e == cudaSuccess && dst_pageable) e = synchronize(stream);
  return e;
}

}  // namespace

std::optional<Region> find_region(const void* p) { return region_at(p); }

MemoryKind kind_of(const void* p) {
  const std::optional<Region> r = region_at(p);
  return r ? r->kind : MemoryKind::pageable;
}

const char* kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::device: return "device memory";
    case MemoryKind::pinned: return "pinned host memory";
    case MemoryKind::pageable: return "pageable host memory";
  }
  return "memory";
}

}  // namespace cuda_emu

using namespace cuda_emu;

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  return device_malloc(p, bytes, current_device());
}

// CUDA's cudaFree waits for the device's queued work first, so work queued before it may still
// use the memory.
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  Region r;
  if (const cudaError_t e = allocation_start("cudaFree", p, MemoryKind::device, r)) return e;
  synchronize_device(r.device);
  untrack(r);
  std::free(p);
  return sticky_error(r.device);
}

cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  return cudaHostAlloc(p, bytes, cudaHostAllocDefault);
}

cudaError_t cudaHostAlloc(void** p, std::size_t bytes, unsigned flags) {
  if (p == nullptr || flags != cudaHostAllocDefault) return fail(cudaErrorInvalidValue);
  *p = nullptr;
  if (const cudaError_t e = check_runtime()) return e;
  if (bytes == 0) return cudaSuccess;
  void* q = allocate(bytes, kPinnedAlign);
  if (q == nullptr) return fail(cudaErrorMemoryAllocation);
  track(q, bytes, MemoryKind::pinned, current_device());
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  Region r;
  if (const cudaError_t e = allocation_start("cudaFreeHost", p, MemoryKind::pinned, r)) return e;
  synchronize_device(r.device);
  untrack(r);
  std::free(p);
  return cudaSuccess;
}

// Stream-ordered allocation: the memory exists at once (valid for work queued after this call);
// the free happens when the stream reaches it. Work of other streams still using it then reads
// freed memory, which AddressSanitizer reports.
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t stream) {
  return device_malloc(p, bytes, device_of(stream));
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (p == nullptr) return cudaSuccess;
  Region r;
  if (const cudaError_t e = allocation_start("cudaFreeAsync", p, MemoryKind::device, r)) return e;
  return enqueue(stream, "cudaFreeAsync", [r] {
    untrack(r);
    std::free(r.base);
  });
}

cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = check_runtime()) return e;
  Tracker& t = tracker();
  std::lock_guard lock(t.mu);
  *total_bytes = device_memory_bytes();
  *free_bytes = *total_bytes - t.used[current_device()];
  return cudaSuccess;
}

// As CUDA 11 and later: unregistered host memory is cudaMemoryTypeUnregistered with device -2.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (a == nullptr) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = check_runtime()) return e;
  const std::optional<Region> r = region_at(p);
  *a = cudaPointerAttributes{};
  if (!r) {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    return cudaSuccess;
  }
  a->device = r->device;
  a->devicePointer = const_cast<void*>(p);
  if (r->kind == MemoryKind::device) {
    a->type = cudaMemoryTypeDevice;
  } else {
    a->type = cudaMemoryTypeHost;
    a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (const cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, bytes, kind)) return e;
  return queue_copy("cudaMemcpyAsync", dst, src, bytes, stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (const cudaError_t e = check_copy("cudaMemcpy", dst, src, bytes, kind)) return e;
  if (const cudaError_t e = queue_copy("cudaMemcpy", dst, src, bytes, nullptr)) return e;
  return synchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (kind_of(p) != MemoryKind::device)
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync",
                describe(p, region_at(p)) + " is not device memory");
  if (const cudaError_t e = check_bounds("cudaMemsetAsync", "destination", p, bytes)) return e;
  if (counting()) count_work("memset", "cudaMemset", 0, 0, bytes);
  return enqueue(stream, "cudaMemsetAsync", [p, value, bytes] { std::memset(p, value, bytes); });
}

cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  if (const cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr)) return e;
  return synchronize(nullptr);
}
