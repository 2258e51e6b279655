// The emulated node's GPUs (how many, which are visible, their properties), the current device
// of each host thread, and CUDA's two kinds of error: the last error of a host thread and the
// sticky error of a device whose queued work faulted.
#include <unistd.h>

#include <array>
#include <cctype>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "emulator.hpp"

namespace cuda_emu {
namespace {

constexpr int kMaxGpus = 64;
constexpr std::size_t kDefaultMemory = std::size_t{8} << 30;

// "8G", "512M", "4096K", "123": bytes; anything else is a configuration error of the tests.
std::size_t parse_bytes(const char* text, const char* name) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text, &end, 10);
  std::size_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = std::size_t{1} << 10, ++end;
  else if (*end == 'M' || *end == 'm') scale = std::size_t{1} << 20, ++end;
  else if (*end == 'G' || *end == 'g') scale = std::size_t{1} << 30, ++end;
  if (end == text || *end != '\0') {
    std::fprintf(stderr, "cuda emulation: %s=%s is not a size (e.g. 512M, 8G)\n", name, text);
    std::exit(2);
  }
  return static_cast<std::size_t>(n) * scale;
}

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    std::fprintf(stderr, "cuda emulation: %s=%s must be an integer in [%d, %d]\n", name, v, lo, hi);
    std::exit(2);
  }
  return static_cast<int>(n);
}

struct Gpu {
  int physical = 0;  // its index on the emulated node
  cudaUUID_t uuid{};
  std::atomic<int> sticky{cudaSuccess};
};

// The node as the environment describes it, read once.
struct Node {
  bool driver = true;          // PDTRAIN_CUDA_EMU_DRIVER=none: no driver (as on a CPU machine)
  std::size_t memory = kDefaultMemory;
  cudaComputeMode mode = cudaComputeModeDefault;
  std::vector<std::unique_ptr<Gpu>> visible;

  Node() {
    const char* driver_env = std::getenv("PDTRAIN_CUDA_EMU_DRIVER");
    driver = driver_env == nullptr || std::strcmp(driver_env, "none") != 0;
    if (const char* m = std::getenv("PDTRAIN_CUDA_EMU_MEMORY"))
      memory = parse_bytes(m, "PDTRAIN_CUDA_EMU_MEMORY");
    if (const char* c = std::getenv("PDTRAIN_CUDA_EMU_COMPUTE_MODE"))
      mode = std::strcmp(c, "exclusive_process") == 0 ? cudaComputeModeExclusiveProcess
             : std::strcmp(c, "prohibited") == 0      ? cudaComputeModeProhibited
                                                      : cudaComputeModeDefault;
    const int gpus = env_int("PDTRAIN_CUDA_EMU_GPUS", 1, 0, kMaxGpus);
    for (int physical : visible_indices(gpus)) {
      auto g = std::make_unique<Gpu>();
      g->physical = physical;
      g->uuid = uuid_of(physical);
      visible.push_back(std::move(g));
    }
  }

  // CUDA_VISIBLE_DEVICES as CUDA reads it: a comma-separated list of indices or UUIDs
  // ("GPU-..."); the list ends at the first entry that names no GPU, and a GPU listed twice
  // ends it too.
  std::vector<int> visible_indices(int gpus) const {
    std::vector<int> all;
    for (int i = 0; i < gpus; ++i) all.push_back(i);
    const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
    if (v == nullptr) return all;
    std::vector<int> picked;
    std::string list = v;
    std::size_t at = 0;
    while (at <= list.size()) {
      const std::size_t comma = list.find(',', at);
      const std::string entry =
          list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      const int index = index_of(entry, gpus);
      bool seen = false;
      for (int p : picked) seen = seen || p == index;
      if (index < 0 || seen) break;
      picked.push_back(index);
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    return picked;
  }

  int index_of(const std::string& entry, int gpus) const {
    if (entry.rfind("GPU-", 0) == 0) {
      cudaUUID_t named{};
      if (!parse_uuid(entry.substr(4), named)) return -1;
      for (int i = 0; i < gpus; ++i)
        if (std::memcmp(uuid_of(i).bytes, named.bytes, sizeof named.bytes) == 0) return i;
      return -1;
    }
    char* end = nullptr;
    const long n = std::strtol(entry.c_str(), &end, 10);
    if (entry.empty() || *end != '\0' || n < 0 || n >= gpus) return -1;
    return static_cast<int>(n);
  }

  // Host name and index, hashed (FNV-1a) into 16 bytes: the same GPU on the same node has the
  // same UUID in every process, as a real GPU's does.
  static cudaUUID_t uuid_of(int physical) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    const std::string key = std::string(host) + "/gpu" + std::to_string(physical);
    cudaUUID_t u{};
    for (int half = 0; half < 2; ++half) {
      std::uint64_t h = 1469598103934665603ull ^ static_cast<std::uint64_t>(half);
      for (char c : key) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
      std::memcpy(u.bytes + 8 * half, &h, 8);
    }
    return u;
  }

  // 32 hex digits, dashes anywhere (nvidia-smi prints 8-4-4-4-12), into 16 bytes.
  static bool parse_uuid(const std::string& text, cudaUUID_t& out) {
    int digits = 0;
    for (char c : text) {
      if (c == '-') continue;
      const int v = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                    : (c >= 'a' && c <= 'f')                     ? c - 'a' + 10
                    : (c >= 'A' && c <= 'F')                     ? c - 'A' + 10
                                                                 : -1;
      if (v < 0 || digits >= 32) return false;
      char& byte = out.bytes[digits / 2];
      byte = static_cast<char>(digits % 2 == 0 ? v << 4 : (static_cast<unsigned char>(byte) | v));
      ++digits;
    }
    return digits == 32;
  }
};

Node& node() {
  static Node n;
  return n;
}

thread_local int tl_device = 0;
thread_local cudaError_t tl_last_error = cudaSuccess;

bool valid(int device) {
  return device >= 0 && device < static_cast<int>(node().visible.size());
}

// The error a call must return before it does anything: no driver, no device.
cudaError_t runtime_state() {
  if (!node().driver) return fail(cudaErrorInsufficientDriver);
  if (node().visible.empty()) return fail(cudaErrorNoDevice);
  return cudaSuccess;
}

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr std::array kErrors = {
    ErrorText{cudaSuccess, "cudaSuccess", "no error"},
    ErrorText{cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    ErrorText{cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    ErrorText{cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    ErrorText{cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    ErrorText{cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
              "invalid configuration argument"},
    ErrorText{cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer",
              "invalid device pointer"},
    ErrorText{cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
              "invalid copy direction for memcpy"},
    ErrorText{cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
              "CUDA driver version is insufficient for CUDA runtime version"},
    ErrorText{cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    ErrorText{cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    ErrorText{cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
              "invalid resource handle"},
    ErrorText{cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    ErrorText{cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
              "an illegal memory access was encountered"},
    ErrorText{cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
              "too many resources requested for launch"},
    ErrorText{cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    ErrorText{cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction",
              "an illegal instruction was encountered"},
    ErrorText{cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    ErrorText{cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    ErrorText{cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* find_error(cudaError_t e) {
  for (const ErrorText& t : kErrors)
    if (t.code == e) return &t;
  return nullptr;
}

}  // namespace

int visible_device_count() {
  return node().driver ? static_cast<int>(node().visible.size()) : 0;
}

int current_device() { return tl_device; }

std::size_t device_memory_bytes() { return node().memory; }

cudaError_t sticky_error(int device) {
  if (!valid(device)) return cudaSuccess;
  return static_cast<cudaError_t>(node().visible[static_cast<std::size_t>(device)]->sticky.load());
}

cudaError_t fail(cudaError_t error) {
  tl_last_error = error;
  return error;
}

cudaError_t fail(cudaError_t error, const std::string& call, const std::string& why) {
  std::fprintf(stderr, "cuda emulation: %s: %s (%s)\n", call.c_str(), why.c_str(),
               cudaGetErrorName(error));
  return fail(error);
}

void fault(int device, cudaError_t error, const std::string& message) {
  std::fprintf(stderr, "cuda emulation: device %d: %s (%s: sticky, as on a GPU)\n", device,
               message.c_str(), cudaGetErrorName(error));
  std::fflush(stderr);
  if (!valid(device)) return;
  int expected = cudaSuccess;
  node().visible[static_cast<std::size_t>(device)]->sticky.compare_exchange_strong(expected, error);
}

}  // namespace cuda_emu

using namespace cuda_emu;

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 0;
  if (const cudaError_t e = runtime_state()) return e;
  *count = visible_device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (const cudaError_t e = runtime_state()) return e;
  if (!valid(device)) return fail(cudaErrorInvalidDevice);
  tl_device = device;
  return sticky_error(device);
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = runtime_state()) return e;
  *device = tl_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = runtime_state()) return e;
  if (!valid(device)) return fail(cudaErrorInvalidDevice);
  const Gpu& g = *node().visible[static_cast<std::size_t>(device)];
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "emulated GPU %d (on the CPU)", g.physical);
  prop->uuid = g.uuid;
  prop->totalGlobalMem = node().memory;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024, prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647, prop->maxGridSize[1] = 65535, prop->maxGridSize[2] = 65535;
  prop->major = 9, prop->minor = 0;  // what the sources are written for (sm_90)
  prop->multiProcessorCount = 132;
  prop->computeMode = node().mode;
  prop->pciBusID = g.physical + 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  cudaDeviceProp p{};
  if (const cudaError_t e = cudaGetDeviceProperties(&p, device)) return e;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeMode: *value = p.computeMode; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = node().driver ? CUDART_VERSION : 0;  // 0: no driver, as CUDA reports it
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t sticky = sticky_error(tl_device);
  if (sticky != cudaSuccess) return sticky;
  const cudaError_t e = tl_last_error;
  tl_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  const cudaError_t sticky = sticky_error(tl_device);
  return sticky != cudaSuccess ? sticky : tl_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* t = find_error(error);
  return t != nullptr ? t->name : "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* t = find_error(error);
  return t != nullptr ? t->text : "unrecognized error code";
}

// The sanitizers' defaults in every emulated binary (this file is always linked): Open MPI and
// hwloc leave allocations behind at exit that LeakSanitizer would report as a failure; UBSan
// prints where it found undefined behaviour. ASAN_OPTIONS / UBSAN_OPTIONS still override them.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1"; }
