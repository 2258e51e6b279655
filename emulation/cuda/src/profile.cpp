// Kernel counts of the emulated CUDA target (profile.hpp; docs/cuda-emulation.md "Kernel counts").
//
// Grouping into warp-level requests: each thread counts its shared and its global accesses since
// its last synchronization point (its epoch: the number of __syncthreads and warp calls it
// passed); the k-th shared access of epoch e of every lane of warp w is one request, whatever
// order the scheduler ran the lanes in (fibers, the fast path's one thread after another, the
// race check's random order). A warp's requests of epoch e are complete, and counted, once every
// lane of the warp passed e (or ended).
//
// Shared memory (32 banks of 4-byte words): a request's wavefronts are, per phase, the largest
// number of distinct 4-byte words any one bank is asked for (lanes reading the same word share
// it: a broadcast), summed over its phases. Accesses up to 4 bytes are one phase of the 32 lanes;
// 8-byte accesses two phases of 16 lanes (half-warps), 16-byte ones four phases of 8 lanes
// (quarter-warps), each phase moving at most 128 bytes (docs/cuda-emulation.md cites the rule).
// The ideal is one wavefront per phase that has an active lane.
// Global memory: a request's sectors are the distinct 32-byte sectors its lanes touch; the
// ideal is the distinct bytes it touches over 32, rounded up (lanes reading one element count
// it once). A launch's DRAM bytes are its distinct device sectors times 32.
//
// PDTRAIN_CUDA_EMU_PROFILE=DIR: at exit the process writes DIR/kernel_counts.<pid>.tsv, one row
// per kernel name, block size and dynamic shared memory (header in write()).
#include "profile.hpp"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>

#include "emulator.hpp"

namespace cuda_emu::profile {
namespace {

constexpr int kLanes = 32, kBanks = 32, kBankBytes = 4, kSectorBytes = 32, kPhaseBytes = 128;
constexpr std::uint32_t kEnded = 0xffffffffu;  // the epoch of a lane that ended

// ---------------------------------------------------------------------------------------------
void add(KernelCounts& to, const KernelCounts& o) {
  to.launches += o.launches, to.threads += o.threads;
  to.shared_requests += o.shared_requests, to.shared_wavefronts += o.shared_wavefronts;
  to.shared_ideal_wavefronts += o.shared_ideal_wavefronts;
  to.global_requests += o.global_requests, to.global_sectors += o.global_sectors;
  to.global_ideal_sectors += o.global_ideal_sectors;
  to.dram_bytes += o.dram_bytes, to.barriers += o.barriers, to.tensor_flops += o.tensor_flops;
  for (const auto& [shape, n] : o.tensor_ops) to.tensor_ops[shape] += n;
}

using Key = std::tuple<std::string, unsigned, std::size_t>;  // name, block threads, dynamic bytes

class Table {
 public:
  Table() {
    if (const char* dir = std::getenv("PDTRAIN_CUDA_EMU_PROFILE"); dir != nullptr && *dir != 0)
      dir_ = dir;
  }
  ~Table() { write(); }
  bool on() const { return !dir_.empty(); }
  void add_launch(const Key& key, const KernelCounts& c) {
    std::lock_guard lock(mutex_);
    add(rows_[key], c);
  }
  KernelCounts of(const std::string& name) const {
    std::lock_guard lock(mutex_);
    KernelCounts sum;
    for (const auto& [key, c] : rows_)
      if (std::get<0>(key) == name) add(sum, c);
    return sum;
  }

 private:
  void write() const {
    if (!on()) return;
    const std::string path = dir_ + "/kernel_counts." + std::to_string(getpid()) + ".tsv";
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cuda emulation: cannot write the kernel counts to %s\n", path.c_str());
      return;
    }
    std::fprintf(f,
                 "kernel\tblock_threads\tdynamic_shared\tlaunches\tthreads\tshared_requests\t"
                 "shared_wavefronts\tshared_ideal_wavefronts\tglobal_requests\tglobal_sectors\t"
                 "global_ideal_sectors\tdram_bytes\tbarriers\ttensor_flops\ttensor_ops\n");
    for (const auto& [key, c] : rows_) {
      std::string ops;
      for (const auto& [shape, n] : c.tensor_ops)
        ops += (ops.empty() ? "" : ",") + shape + "=" + std::to_string(n);
      std::fprintf(f, "%s\t%u\t%zu", std::get<0>(key).c_str(), std::get<1>(key), std::get<2>(key));
      for (std::uint64_t v : {c.launches, c.threads, c.shared_requests, c.shared_wavefronts,
                              c.shared_ideal_wavefronts, c.global_requests, c.global_sectors,
                              c.global_ideal_sectors,
                              c.dram_bytes, c.barriers, c.tensor_flops})
        std::fprintf(f, "\t%llu", static_cast<unsigned long long>(v));
      std::fprintf(f, "\t%s\n", ops.empty() ? "-" : ops.c_str());
    }
    std::fclose(f);
  }

  std::string dir_;
  mutable std::mutex mutex_;
  std::map<Key, KernelCounts> rows_;
};

Table& table() {
  static Table t;  // written by its destructor at exit
  return t;
}

// ---------------------------------------------------------------------------------------------
// One warp-level request: each lane's address and width (0: the lane made no such access).
struct Request {
  std::array<std::uintptr_t, kLanes> address{};
  std::array<std::uint8_t, kLanes> bytes{};
};

struct Epoch {
  std::vector<Request> shared, global;  // the k-th request at [k]
};

struct Warp {
  std::deque<Epoch> epochs;  // epochs first, first + 1, ...
  std::uint32_t first = 0;
};

// Wavefronts of a shared-memory request (the phase rule in the file's comment).
void count_shared(const Request& r, KernelCounts& c) {
  unsigned widest = 0;
  for (std::uint8_t b : r.bytes) widest = std::max<unsigned>(widest, b);
  if (widest == 0) return;
  const int lanes_per_phase = widest <= kBankBytes ? kLanes : kPhaseBytes / static_cast<int>(widest);
  ++c.shared_requests;
  for (int first = 0; first < kLanes; first += lanes_per_phase) {
    std::array<std::vector<std::uintptr_t>, kBanks> words;  // distinct words asked of each bank
    bool active = false;
    for (int lane = first; lane < first + lanes_per_phase; ++lane) {
      if (r.bytes[lane] == 0) continue;
      active = true;
      const std::uintptr_t lo = r.address[lane] / kBankBytes;
      const std::uintptr_t hi = (r.address[lane] + r.bytes[lane] - 1) / kBankBytes;
      for (std::uintptr_t w = lo; w <= hi; ++w) {
        auto& bank = words[w % kBanks];
        if (std::find(bank.begin(), bank.end(), w) == bank.end()) bank.push_back(w);
      }
    }
    if (!active) continue;
    std::size_t most = 0;
    for (const auto& bank : words) most = std::max(most, bank.size());
    c.shared_wavefronts += most;
    ++c.shared_ideal_wavefronts;
  }
}

// Sectors of a global request, and the ideal for the bytes it touches.
void count_global(const Request& r, KernelCounts& c) {
  std::vector<std::uintptr_t> sectors, bytes;
  for (int lane = 0; lane < kLanes; ++lane)
    for (unsigned b = 0; b < r.bytes[lane]; ++b) bytes.push_back(r.address[lane] + b);
  if (bytes.empty()) return;
  std::sort(bytes.begin(), bytes.end());
  bytes.erase(std::unique(bytes.begin(), bytes.end()), bytes.end());
  for (std::uintptr_t b : bytes)
    if (sectors.empty() || sectors.back() != b / kSectorBytes) sectors.push_back(b / kSectorBytes);
  ++c.global_requests;
  c.global_sectors += sectors.size();
  c.global_ideal_sectors += (bytes.size() + kSectorBytes - 1) / kSectorBytes;
}

// ---------------------------------------------------------------------------------------------
// The calling worker thread's static TLS block of the executable, where `__shared__` (a static
// thread_local) lives: [lo, hi).
struct Range {
  const char* lo = nullptr;
  const char* hi = nullptr;
  bool holds(const void* p) const { return p >= lo && p < hi; }
};

Range executable_tls() {
  Range r;
  void* self = dlopen(nullptr, RTLD_LAZY | RTLD_NOLOAD);
  std::size_t module = 0;
  void* block = nullptr;
  if (self == nullptr || dlinfo(self, RTLD_DI_TLS_MODID, &module) != 0 || module == 0 ||
      dlinfo(self, RTLD_DI_TLS_DATA, &block) != 0 || block == nullptr)
    return r;
  struct Find {
    std::size_t module, bytes = 0;
  } find{module};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto* f = static_cast<Find*>(data);
        if (info->dlpi_tls_modid != f->module) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i)
          if (info->dlpi_phdr[i].p_type == PT_TLS) f->bytes = info->dlpi_phdr[i].p_memsz;
        return 1;
      },
      &find);
  r.lo = static_cast<const char*>(block);
  r.hi = r.lo + find.bytes;
  return r;
}

// ---------------------------------------------------------------------------------------------
// The launch the calling worker thread runs.
struct Launch {
  Key key;
  KernelCounts counts;
  // The block.
  int threads = 0;
  Range dynamic_shared, static_shared, runtime_record;
  std::vector<std::uint32_t> epoch, shared_k, global_k;  // per thread
  std::vector<Warp> warps;
  // Device sectors touched by the launch: 4096-sector chunks of the address space, a bit each.
  std::unordered_map<std::uintptr_t, std::array<std::uint64_t, 64>> sectors;
  std::optional<Region> last_region;  // the allocation found last (most accesses hit it again)
  // The vector access the running thread announced last (vector_access): the callbacks of its
  // components that follow, inside [lo, hi) and in the same direction, are that one access.
  struct Vector {
    int thread = -1;
    Range bytes;
    bool is_store = false;
  } vector;
};

thread_local Launch tl_launch;
// Tested first by the callbacks: plain thread_locals with no initializer to run. A callback can
// come from the runtime's own code too (an inline library function, std::string's say, whose
// instrumented copy from a kernel source the linker kept), even from inside the counting itself:
// tl_inside makes the counting's own code invisible to it.
thread_local bool tl_counting = false, tl_inside = false;

struct Inside {
  Inside() { tl_inside = true; }
  ~Inside() { tl_inside = false; }
};

const Range& static_shared_range() {
  thread_local const Range r = [] {
    const Range found = executable_tls();
    if (found.lo == found.hi)
      std::fprintf(stderr, "cuda emulation: kernel counts: the executable's TLS block was not "
                           "found: static __shared__ accesses are not counted\n");
    return found;
  }();
  return r;
}

void count_epoch(const Epoch& e, KernelCounts& c) {
  for (const Request& r : e.shared) count_shared(r, c);
  for (const Request& r : e.global) count_global(r, c);
}

// Counts warp w's requests of the epochs every lane of it passed.
void complete_epochs(Launch& l, int w) {
  const int lanes = std::min(kLanes, l.threads - kLanes * w);
  std::uint32_t passed = kEnded;
  for (int j = 0; j < lanes; ++j)
    passed = std::min(passed, l.epoch[static_cast<std::size_t>(kLanes * w + j)]);
  Warp& warp = l.warps[static_cast<std::size_t>(w)];
  while (!warp.epochs.empty() && warp.first < passed) {
    count_epoch(warp.epochs.front(), l.counts);
    warp.epochs.pop_front();
    ++warp.first;
  }
  if (warp.epochs.empty() && passed != kEnded) warp.first = passed;
}

bool is_global(Launch& l, const void* p) {
  if (!l.last_region || p < l.last_region->base || p >= l.last_region->base + l.last_region->bytes) {
    std::optional<Region> r = find_region(p);
    if (!r) return false;
    l.last_region = r;
  }
  return true;  // device memory, or pinned host memory a kernel reads as global memory
}

void touch_sectors(Launch& l, std::uintptr_t address, unsigned bytes) {
  for (std::uintptr_t s = address / kSectorBytes; s <= (address + bytes - 1) / kSectorBytes; ++s)
    l.sectors[s >> 12][(s >> 6) & 63] |= std::uint64_t{1} << (s & 63);
}

}  // namespace

bool on() {
  static const bool on = table().on();
  return on;
}

KernelCounts counted(const std::string& name) { return table().of(name); }

void access(const void* address, unsigned bytes, bool is_store) {
  // Loads and stores are requests alike (a bank or a sector serves either); the direction only
  // tells a vector's components apart.
  if (!tl_counting || tl_inside) return;
  const Inside inside;
  Launch& l = tl_launch;
  const int t = running_thread();
  if (t < 0) return;
  if (l.vector.thread == t) {
    if (l.vector.bytes.holds(address) && l.vector.is_store == is_store) return;  // a component
    l.vector.thread = -1;
  }
  bool shared = false;
  if (l.dynamic_shared.holds(address) ||
      (l.static_shared.holds(address) && !l.runtime_record.holds(address)))
    shared = true;
  else if (!is_global(l, address))
    return;  // the thread's stack, the kernel's arguments, the runtime's own data
  const auto at = static_cast<std::size_t>(t);
  Warp& warp = l.warps[at / kLanes];
  const std::size_t e = l.epoch[at] - warp.first;
  if (warp.epochs.size() <= e) warp.epochs.resize(e + 1);
  std::vector<Request>& requests = shared ? warp.epochs[e].shared : warp.epochs[e].global;
  const std::size_t k = (shared ? l.shared_k : l.global_k)[at]++;
  if (requests.size() <= k) requests.resize(k + 1);
  requests[k].address[at % kLanes] = reinterpret_cast<std::uintptr_t>(address);
  requests[k].bytes[at % kLanes] = static_cast<std::uint8_t>(bytes);
  if (!shared) touch_sectors(l, reinterpret_cast<std::uintptr_t>(address), bytes);
}

void vector_access(const void* address, unsigned bytes, bool is_store) {
  if (!tl_counting || tl_inside) return;
  access(address, bytes, is_store);
  const Inside inside;
  const auto* lo = static_cast<const char*>(address);
  tl_launch.vector = {running_thread(), Range{lo, lo + bytes}, is_store};
}

void tensor_op(const char* shape, std::uint64_t flops) {
  if (!tl_counting || tl_inside || running_thread() < 0) return;
  const Inside inside;
  ++tl_launch.counts.tensor_ops[shape];
  tl_launch.counts.tensor_flops += flops;
}

void launch_begins(const LaunchConfig& config) {
  if (!on()) return;
  const Inside inside;
  Launch& l = tl_launch;
  tl_counting = true;
  l.key = Key{config.name, config.block.x * config.block.y * config.block.z, config.shared_bytes};
  l.counts = KernelCounts{};
  l.counts.launches = 1;
  l.counts.threads = std::uint64_t{config.grid.x} * config.grid.y * config.grid.z *
                     std::get<1>(l.key);
  l.sectors.clear();
  l.last_region.reset();
  l.vector = {};
  l.static_shared = static_shared_range();
  l.dynamic_shared = Range{};
}

void launch_ends() {
  if (!tl_counting) return;
  const Inside inside;
  Launch& l = tl_launch;
  tl_counting = false;
  std::uint64_t sectors = 0;
  for (const auto& [chunk, bits] : l.sectors)
    for (std::uint64_t word : bits) sectors += static_cast<std::uint64_t>(std::popcount(word));
  l.counts.dram_bytes = sectors * kSectorBytes;
  l.sectors.clear();
  table().add_launch(l.key, l.counts);
}

void block_begins(int threads, const void* dynamic_shared, const void* runtime_record,
                  std::size_t runtime_record_bytes) {
  if (!tl_counting) return;
  const Inside inside;
  Launch& l = tl_launch;
  l.threads = threads;
  const auto n = static_cast<std::size_t>(threads);
  l.epoch.assign(n, 0);
  l.shared_k.assign(n, 0);
  l.global_k.assign(n, 0);
  l.warps.assign((n + kLanes - 1) / kLanes, Warp{});
  const auto* dyn = static_cast<const char*>(dynamic_shared);
  l.dynamic_shared = Range{dyn, dyn == nullptr ? nullptr : dyn + std::get<2>(l.key)};
  const auto* record = static_cast<const char*>(runtime_record);
  l.runtime_record = Range{record, record + runtime_record_bytes};
}

void block_ends() {
  if (!tl_counting) return;
  const Inside inside;
  Launch& l = tl_launch;
  for (Warp& w : l.warps)
    for (const Epoch& e : w.epochs) count_epoch(e, l.counts);
  l.warps.clear();
}

void thread_synchronized(int linear, bool barrier) {
  if (!tl_counting) return;
  const Inside inside;
  Launch& l = tl_launch;
  const auto at = static_cast<std::size_t>(linear);
  ++l.epoch[at];
  l.shared_k[at] = l.global_k[at] = 0;
  if (barrier && linear == 0) ++l.counts.barriers;  // one per block that passes it
  complete_epochs(l, linear / kLanes);
}

void thread_ended(int linear) {
  if (!tl_counting) return;
  const Inside inside;
  Launch& l = tl_launch;
  l.epoch[static_cast<std::size_t>(linear)] = kEnded;
  complete_epochs(l, linear / kLanes);
}

}  // namespace cuda_emu::profile

void cuda_emu::vector_access(const void* p, unsigned bytes, bool is_store) {
  profile::vector_access(p, bytes, is_store);
}

// ---------------------------------------------------------------------------------------------
// clang's -fsanitize-coverage=trace-loads,trace-stores callbacks (the profiling build compiles
// the kernel sources with them): every load and store of kernel code, with its width. No other
// coverage callback is needed: "edge" alone adds none (no trace-pc-guard), checked with nm on a
// clang 14 object.
extern "C" {
#define PDTRAIN_EMU_TRACE(bytes, type)                                            \
  void __sanitizer_cov_load##bytes(type* p) { cuda_emu::profile::access(p, bytes, false); } \
  void __sanitizer_cov_store##bytes(type* p) { cuda_emu::profile::access(p, bytes, true); }
PDTRAIN_EMU_TRACE(1, std::uint8_t)
PDTRAIN_EMU_TRACE(2, std::uint16_t)
PDTRAIN_EMU_TRACE(4, std::uint32_t)
PDTRAIN_EMU_TRACE(8, std::uint64_t)
PDTRAIN_EMU_TRACE(16, __int128)
#undef PDTRAIN_EMU_TRACE
}
