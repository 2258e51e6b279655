// Kernel launches. A launch is checked as a GPU checks it, then queued on its stream; the
// stream's worker runs the grid's blocks one after another, each block's threads as fibers
// (Boost.Context) that switch at every __syncthreads and warp-level call. A scheduler per block
// runs the threads that can run; a barrier opens when every thread of the block reached it, a
// warp call completes when every lane of its mask made it. Whatever a GPU would hang on or
// leave undefined is a fault naming the kernel, the block and the thread (sticky on the device,
// as a GPU's fault is).
//
// Race check (PDTRAIN_CUDA_EMU_RACECHECK=1): threads that can run are picked in a random order
// (not thread order), blocks run in a random order, and every launch runs twice over the same
// inputs (the device allocations its arguments point into, saved before the first run and
// restored before the second) with two different orders; any byte that differs between the two
// results is a fault: the kernel's result depends on the order its threads or blocks ran in (a
// missing __syncthreads, a read of shared memory before its write, two threads writing one
// element). PDTRAIN_CUDA_EMU_RACECHECK_SEED fixes the orders to repeat a run.
//
// Fast path: a kernel whose whole first launch made no __syncthreads or warp call (element-wise
// kernels, the optimizer's) runs its threads one after another on the worker's own stack from
// then on, without fibers; a later launch of it that synchronizes after all is a fault.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <typeindex>
#include <typeinfo>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "emulator.hpp"
#include "profile.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define PDTRAIN_EMU_ASAN 1
#endif

// The scheduler's own bookkeeping runs millions of times a step and touches only its own
// vectors: AddressSanitizer's poisoning of its stack frames would be most of the emulation's
// time. Kernel code and everything it reaches stay instrumented.
#define PDTRAIN_EMU_HOT __attribute__((no_sanitize_address, noinline))

namespace cuda_emu {
namespace {

namespace ctx = boost::context;

constexpr unsigned kMaxThreads = 1024, kMaxBlockZ = 64, kMaxGridYZ = 65535;
constexpr unsigned kMaxGridX = 2147483647u;
constexpr std::size_t kStackBytes = 256 * 1024;  // per thread; AddressSanitizer's frames are large
constexpr std::size_t kGuardBytes = 4096;

// ---------------------------------------------------------------------------------------------
// Configuration.

struct RaceCheck {
  bool on = false;
  std::uint64_t seed = 0;
};

const RaceCheck& race_check() {
  static const RaceCheck r = [] {
    RaceCheck c;
    const char* on = std::getenv("PDTRAIN_CUDA_EMU_RACECHECK");
    c.on = on != nullptr && *on != '\0' && std::strcmp(on, "0") != 0;
    if (const char* s = std::getenv("PDTRAIN_CUDA_EMU_RACECHECK_SEED"))
      c.seed = std::strtoull(s, nullptr, 10);
    else
      c.seed = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    if (c.on)
      std::fprintf(stderr,
                   "cuda emulation: race check on (thread and block orders from seed %llu; "
                   "PDTRAIN_CUDA_EMU_RACECHECK_SEED=%llu repeats them)\n",
                   static_cast<unsigned long long>(c.seed),
                   static_cast<unsigned long long>(c.seed));
    return c;
  }();
  return r;
}

std::atomic<std::uint64_t> g_launches{0};

// ---------------------------------------------------------------------------------------------
// Fiber stacks: mmap'd with a guard page below (a stack overflow faults instead of writing into
// a neighbour), pooled per worker thread.

class StackPool {
 public:
  ctx::stack_context take() {
    if (!free_.empty()) {
      ctx::stack_context sc = free_.back();
      free_.pop_back();
      return sc;
    }
    void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "cuda emulation: cannot map a fiber stack\n");
      std::abort();
    }
    mprotect(p, kGuardBytes, PROT_NONE);
    ctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(p) + kGuardBytes + kStackBytes;
    return sc;
  }
  void give(const ctx::stack_context& sc) { free_.push_back(sc); }

 private:
  std::vector<ctx::stack_context> free_;
};

thread_local StackPool tl_stacks;

// Boost.Context's stack allocator interface over the pool; remembers the stack it handed out
// (AddressSanitizer is told about every switch onto it).
struct PooledStack {
  ctx::stack_context* handed;
  ctx::stack_context allocate() { return *handed = tl_stacks.take(); }
  void deallocate(ctx::stack_context& sc) noexcept { tl_stacks.give(sc); }
};

// Fibers of faulted blocks are never resumed again: they and their stacks are kept here, so
// that nothing unwinds kernel frames that a GPU would simply have stopped.
std::mutex g_graveyard_mu;
std::vector<ctx::fiber>* g_graveyard = new std::vector<ctx::fiber>;

// ---------------------------------------------------------------------------------------------
// A block's threads and their scheduler.

enum class State { ready, barrier, warp, done };

struct Thread {
  uint3 idx{};
  int linear = 0;
  ctx::fiber fiber;
  ctx::stack_context stack{};
  State state = State::ready;
  // The pending warp call, and its result.
  WarpOp op = WarpOp::sync;
  unsigned mask = 0;
  std::uint64_t value = 0, result = 0;
  int arg = 0, width = 32;
};

struct Collective {
  WarpOp op;
  unsigned mask, arrived;
  int width;
};

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::shfl_idx: return "__shfl_sync";
    case WarpOp::shfl_xor: return "__shfl_xor_sync";
    case WarpOp::shfl_down: return "__shfl_down_sync";
    case WarpOp::shfl_up: return "__shfl_up_sync";
    case WarpOp::ballot: return "__ballot_sync";
    case WarpOp::sync: return "__syncwarp";
    case WarpOp::wmma_load: return "nvcuda::wmma::load_matrix_sync";
    case WarpOp::wmma_store: return "nvcuda::wmma::store_matrix_sync";
    case WarpOp::wmma_mma: return "nvcuda::wmma::mma_sync";
    case WarpOp::ldmatrix: return "ldmatrix.sync.aligned.m8n8";
    case WarpOp::mma_sync: return "mma.sync.aligned.m16n8k16";
  }
  return "a warp call";
}

std::string coords(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

std::string hex(unsigned v) {
  char t[16];
  std::snprintf(t, sizeof t, "0x%08x", v);
  return t;
}

class Block {
 public:
  const Kernel* kernel = nullptr;
  const char* name = "";
  uint3 idx{};
  dim3 dim, grid;
  void* dynamic_shared = nullptr;
  Thread* running = nullptr;
  std::string fault;  // set when the block faulted

  // Runs the block to its end (or its fault). `rng`: the race check's order, else thread order.
  // With `fibers` false the threads run one after another on the worker's own stack (a kernel
  // that did not synchronize in its first block: run_grid); one that synchronizes after all is
  // a fault of the emulation's fast path.
  void run(std::minstd_rand* rng, bool fibers) {
    const int n = static_cast<int>(dim.x * dim.y * dim.z);
    threads_.clear();
    threads_.resize(static_cast<std::size_t>(n));
    collectives_.resize(static_cast<std::size_t>((n + 31) / 32));
    for (auto& open : collectives_) open.clear();
    runnable_.clear();
    head_ = 0;
    synchronized_ = false;
    direct_ = !fibers;
    for (int i = 0; i < n; ++i) {
      Thread& t = threads_[static_cast<std::size_t>(i)];
      t.linear = i;
      t.idx = uint3{static_cast<unsigned>(i) % dim.x, static_cast<unsigned>(i) / dim.x % dim.y,
                    static_cast<unsigned>(i) / (dim.x * dim.y)};
    }
    rng_ = rng;
    make_all_runnable();
    profile::block_begins(n, dynamic_shared, this, sizeof *this);
    if (direct_)
      run_directly();
    else
      schedule(n);
    profile::block_ends();
    if (!fault.empty()) bury();
  }

  // Whether a thread of the block ran since run() began called __syncthreads or a warp call.
  bool synchronized() const { return synchronized_; }

  // Called by the running thread (on its fiber).
  void wait_at_barrier() {
    synchronized_ = true;
    if (direct_) throw NotDirect{"__syncthreads"};
    profile::thread_synchronized(running->linear, true);
    running->state = State::barrier;
    yield();
  }
  // The running thread did what a GPU refuses or leaves undefined (a wmma pointer that is not
  // 256-bit aligned, ...): the block's fault, and the thread never runs again.
  [[noreturn]] void fault_running(const std::string& why) {
    fault = where(*running) + ": " + why;
    if (direct_) throw ThreadFault{};
    running->state = State::barrier;  // not done: the scheduler stops at the fault
    yield();
    std::abort();  // never resumed: a faulted block's fibers are buried
  }

  std::uint64_t warp_call(WarpOp op, unsigned mask, std::uint64_t value, int arg, int width) {
    synchronized_ = true;
    if (direct_) throw NotDirect{op_name(op)};
    Thread& t = *running;
    profile::thread_synchronized(t.linear, false);
    t.state = State::warp;
    t.op = op, t.mask = mask, t.value = value, t.arg = arg, t.width = width;
    yield();
    return t.result;
  }

 private:
  struct NotDirect {
    const char* call;
  };
  struct ThreadFault {};

  std::vector<Thread> threads_;
  std::vector<std::vector<Collective>> collectives_;  // open warp calls, per warp (kept allocated)
  std::vector<int> runnable_;                         // from head_ on
  std::size_t head_ = 0;
  std::minstd_rand* rng_ = nullptr;
  bool synchronized_ = false, direct_ = false;
  ctx::fiber scheduler_;  // the scheduler's context while a thread runs
#ifdef PDTRAIN_EMU_ASAN
  const void* scheduler_bottom_ = nullptr;
  std::size_t scheduler_size_ = 0;
#endif

  void run_directly() {
    try {
      while (head_ < runnable_.size()) {
        running = &threads_[static_cast<std::size_t>(next_runnable())];
        kernel->run_thread();
        profile::thread_ended(running->linear);
      }
    } catch (const NotDirect& e) {
      fault = "thread " + coords(running->idx) + " calls " + e.call +
              ", which no thread of the kernel's first launch did: the emulation ran it without "
              "fibers (a kernel that synchronizes in some launches only is beyond its fast path)";
    } catch (const ThreadFault&) {
      // fault says why
    }
    running = nullptr;
  }

  PDTRAIN_EMU_HOT void schedule(int n) {
    int done = 0, at_barrier = 0;
    for (;;) {
      while (head_ < runnable_.size() && fault.empty()) {
        Thread& t = threads_[static_cast<std::size_t>(next_runnable())];
        resume(t);
        if (t.state == State::done) ++done;
        else if (t.state == State::barrier) ++at_barrier;
        else if (t.state == State::warp) arrive(t);
      }
      if (!fault.empty() || done == n) return;
      if (at_barrier == n) {  // every thread reached the barrier: it opens
        at_barrier = 0;
        for (Thread& t : threads_) t.state = State::ready;
        make_all_runnable();
        continue;
      }
      fault = stuck(n, done, at_barrier);
      return;
    }
  }

  PDTRAIN_EMU_HOT int next_runnable() {
    if (rng_ == nullptr) return runnable_[head_++];
    const std::size_t k = head_ + (*rng_)() % (runnable_.size() - head_);
    const int i = runnable_[k];
    runnable_[k] = runnable_.back();
    runnable_.pop_back();
    return i;
  }

  // The ids join the runnable threads (in a random order in the race check).
  PDTRAIN_EMU_HOT void make_runnable(const int* ids, int count) {
    if (head_ == runnable_.size()) runnable_.clear(), head_ = 0;
    const std::size_t first = runnable_.size();
    runnable_.insert(runnable_.end(), ids, ids + count);
    if (rng_ != nullptr)
      std::shuffle(runnable_.begin() + static_cast<std::ptrdiff_t>(first), runnable_.end(), *rng_);
  }

  PDTRAIN_EMU_HOT void make_all_runnable() {
    if (head_ == runnable_.size()) runnable_.clear(), head_ = 0;
    const std::size_t first = runnable_.size();
    for (const Thread& t : threads_) runnable_.push_back(t.linear);
    if (rng_ != nullptr)
      std::shuffle(runnable_.begin() + static_cast<std::ptrdiff_t>(first), runnable_.end(), *rng_);
  }

  // ---- switching between the scheduler and a thread (told to AddressSanitizer, whose stack
  // bounds must follow the switches).
  void resume(Thread& t) {
    running = &t;
    t.state = State::ready;
    if (!t.fiber) start(t);
#ifdef PDTRAIN_EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, static_cast<char*>(t.stack.sp) - t.stack.size,
                                   t.stack.size);
#endif
    t.fiber = std::move(t.fiber).resume();
#ifdef PDTRAIN_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    running = nullptr;
  }

  void start(Thread& t) {
    t.fiber = ctx::fiber(std::allocator_arg, PooledStack{&t.stack},
                         [this, &t](ctx::fiber&& scheduler) {
#ifdef PDTRAIN_EMU_ASAN
                           __sanitizer_finish_switch_fiber(nullptr, &scheduler_bottom_,
                                                           &scheduler_size_);
#endif
                           scheduler_ = std::move(scheduler);
                           kernel->run_thread();
                           profile::thread_ended(t.linear);
                           t.state = State::done;
#ifdef PDTRAIN_EMU_ASAN
                           __sanitizer_start_switch_fiber(nullptr, scheduler_bottom_,
                                                          scheduler_size_);
#endif
                           return std::move(scheduler_);
                         });
  }

  void yield() {
#ifdef PDTRAIN_EMU_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, scheduler_bottom_, scheduler_size_);
#endif
    scheduler_ = std::move(scheduler_).resume();
#ifdef PDTRAIN_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, &scheduler_bottom_, &scheduler_size_);
#endif
  }

  // ---- warp calls

  std::string where(const Thread& t) const {
    return "block " + coords(idx) + ", thread " + coords(t.idx) + " (warp " +
           std::to_string(t.linear / 32) + ", lane " + std::to_string(t.linear % 32) + ")";
  }

  // The lanes of warp w that exist (a block whose size is not a multiple of 32 has a partial
  // last warp).
  unsigned lanes_of(int w) const {
    const int n = static_cast<int>(threads_.size()) - 32 * w;
    return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
  }

  PDTRAIN_EMU_HOT void arrive(Thread& t) {
    const int w = t.linear / 32, lane = t.linear % 32;
    const unsigned bit = 1u << lane;
    if ((t.mask & bit) == 0) {
      fault = where(t) + ": " + op_name(t.op) + " with mask " + hex(t.mask) +
              ", which does not hold the calling lane";
      return;
    }
    if ((t.mask & ~lanes_of(w)) != 0) {
      fault = where(t) + ": " + op_name(t.op) + " with mask " + hex(t.mask) +
              " names lanes this block does not have (" + hex(t.mask & ~lanes_of(w)) + ")";
      return;
    }
    if (t.width < 1 || t.width > 32 || (t.width & (t.width - 1)) != 0) {
      fault = where(t) + ": " + op_name(t.op) + " with width " + std::to_string(t.width) +
              " (a power of two up to 32)";
      return;
    }
    auto& open = collectives_[static_cast<std::size_t>(w)];
    auto c =
        std::find_if(open.begin(), open.end(), [&](const Collective& o) { return o.mask & bit; });
    if (c == open.end()) {
      open.push_back({t.op, t.mask, 0, t.width});
      c = open.end() - 1;
    } else if (c->mask != t.mask || c->op != t.op || c->width != t.width) {
      fault = where(t) + ": " + op_name(t.op) + " with mask " + hex(t.mask) + " while lanes " +
              hex(c->arrived) + " of its warp wait in " + op_name(c->op) + " with mask " +
              hex(c->mask) + ": the lanes of a warp call must make the same call";
      return;
    }
    c->arrived |= bit;
    if (c->arrived != c->mask) return;
    const Collective done = *c;
    open.erase(c);
    complete(w, done);
  }

  // Every lane of the call arrived: each gets its result and runs on.
  PDTRAIN_EMU_HOT void complete(int w, const Collective& c) {
    Thread* lanes = &threads_[static_cast<std::size_t>(32 * w)];
    if (is_wmma(c.op) && !same_arguments(lanes, c)) return;
    std::uint64_t ballot = 0;
    for (int j = 0; j < 32; ++j)
      if ((c.mask >> j & 1u) && lanes[j].value != 0) ballot |= 1ull << j;
    int ready[32], count = 0;
    for (int j = 0; j < 32; ++j) {
      if ((c.mask >> j & 1u) == 0) continue;
      Thread& t = lanes[j];
      if (c.op == WarpOp::ballot) {
        t.result = ballot;
      } else if (c.op != WarpOp::sync) {
        const int src = source_lane(c.op, j, t.arg, c.width);
        if ((c.mask >> src & 1u) == 0) {
          fault = where(t) + ": " + op_name(c.op) + " reads lane " + std::to_string(src) +
                  ", outside the mask " + hex(c.mask) + " (its value is undefined on a GPU)";
          return;
        }
        t.result = lanes[src].value;
      }
      ready[count++] = t.linear;
    }
    for (int k = 0; k < count; ++k)
      threads_[static_cast<std::size_t>(ready[k])].state = State::ready;
    make_runnable(ready, count);
  }

  static bool is_wmma(WarpOp op) {
    return op == WarpOp::wmma_load || op == WarpOp::wmma_store || op == WarpOp::wmma_mma ||
           op == WarpOp::ldmatrix || op == WarpOp::mma_sync;
  }

  // A wmma call's pointer, leading dimension and layout (value, arg) must be the same in every
  // lane (CUDA: "the same value in all threads of the warp"); else a fault naming two lanes.
  bool same_arguments(const Thread* lanes, const Collective& c) {
    int first = -1;
    for (int j = 0; j < 32; ++j) {
      if ((c.mask >> j & 1u) == 0) continue;
      if (first < 0) {
        first = j;
        continue;
      }
      const Thread &a = lanes[first], &b = lanes[j];
      if (a.value == b.value && a.arg == b.arg) continue;
      char t[160];
      std::snprintf(t, sizeof t, "lane %d passes 0x%llx, %d and lane %d passes 0x%llx, %d", first,
                    static_cast<unsigned long long>(a.value), a.arg, j,
                    static_cast<unsigned long long>(b.value), b.arg);
      fault = where(b) + ": " + op_name(c.op) + " with arguments that differ between the lanes ("
              + t + "; pointer, then leading dimension and layout): a GPU requires them uniform";
      return false;
    }
    return true;
  }

  // The lane whose value lane j reads, as CUDA defines each shuffle (within segments of
  // `width` lanes; a lane that would read past its segment reads its own value).
  static int source_lane(WarpOp op, int j, int arg, int width) {
    const int base = j & ~(width - 1);
    switch (op) {
      case WarpOp::shfl_idx: return base + (arg & (width - 1));
      case WarpOp::shfl_xor: {
        const int s = j ^ arg;
        return s >= base + width ? j : s;
      }
      case WarpOp::shfl_down: return j + arg >= base + width ? j : j + arg;
      case WarpOp::shfl_up: return j - arg < base ? j : j - arg;
      default: return j;
    }
  }

  // Why no thread can run although not all are done.
  std::string stuck(int n, int done, int at_barrier) const {
    std::string why = "block " + coords(idx) + " cannot go on: ";
    if (at_barrier > 0)
      why += std::to_string(at_barrier) + " of its " + std::to_string(n) +
             " threads wait at __syncthreads, " + std::to_string(done) +
             " exited without reaching it";
    for (std::size_t w = 0; w < collectives_.size(); ++w)
      for (const Collective& c : collectives_[w])
        why += std::string(at_barrier > 0 ? "; " : "") + "lanes " + hex(c.arrived) + " of warp " +
               std::to_string(w) + " wait in " + op_name(c.op) + " with mask " + hex(c.mask) +
               " for lanes " + hex(c.mask & ~c.arrived) + " that never make it";
    return why + " (a GPU hangs or is undefined here)";
  }

  void bury() {
    std::lock_guard lock(g_graveyard_mu);
    for (Thread& t : threads_)
      if (t.fiber) g_graveyard->push_back(std::move(t.fiber));
  }
};

thread_local Block tl_block;

Block& current_block() { return tl_block; }

// ---------------------------------------------------------------------------------------------
// Grids.

// The fast path: a kernel (launch site and name) whose whole first launch ran without any
// __syncthreads or warp call runs its threads one after another, without fibers, from then on.
// A later launch that synchronizes after all is a fault naming it (Block::run_directly).
std::mutex g_direct_mu;
std::set<std::pair<std::type_index, std::string>>* g_direct =
    new std::set<std::pair<std::type_index, std::string>>;

bool runs_directly(const LaunchConfig& config, const Kernel& kernel) {
  std::lock_guard lock(g_direct_mu);
  return g_direct->count({std::type_index(typeid(kernel)), config.name}) != 0;
}

void never_synchronizes(const LaunchConfig& config, const Kernel& kernel) {
  std::lock_guard lock(g_direct_mu);
  g_direct->insert({std::type_index(typeid(kernel)), config.name});
}

// Runs every block of the grid (in a random order when rng is given); false after a fault.
bool run_grid(const LaunchConfig& config, const Kernel& kernel, std::minstd_rand* rng) {
  const std::uint64_t blocks = std::uint64_t{config.grid.x} * config.grid.y * config.grid.z;
  std::vector<std::uint64_t> order(blocks);
  for (std::uint64_t b = 0; b < blocks; ++b) order[b] = b;
  if (rng != nullptr) std::shuffle(order.begin(), order.end(), *rng);
  std::vector<std::byte> shared(config.shared_bytes);
  Block& block = current_block();
  const bool fibers = !runs_directly(config, kernel);
  bool synchronized = false;
  for (std::uint64_t b : order) {
    block.kernel = &kernel;
    block.name = config.name;
    block.dim = config.block;
    block.grid = config.grid;
    block.idx = uint3{static_cast<unsigned>(b % config.grid.x),
                      static_cast<unsigned>(b / config.grid.x % config.grid.y),
                      static_cast<unsigned>(b / (std::uint64_t{config.grid.x} * config.grid.y))};
    block.dynamic_shared = shared.empty() ? nullptr : shared.data();
    block.fault.clear();
    block.run(rng, fibers);
    synchronized = synchronized || block.synchronized();
    if (!block.fault.empty()) {
      fault(device_of(config.stream), cudaErrorLaunchFailure,
            std::string("kernel ") + config.name + ": " + block.fault);
      return false;
    }
  }
  if (fibers && !synchronized) never_synchronizes(config, kernel);
  return true;
}

// The device and pinned allocations a kernel's arguments point into (pointers found among the
// argument bytes, including pointers inside structs passed by value).
std::vector<Region> referenced_regions(const Kernel& kernel) {
  std::vector<Region> regions;
  const std::span<const std::byte> bytes = kernel.argument_bytes();
  for (std::size_t at = 0; at + sizeof(void*) <= bytes.size(); at += alignof(void*)) {
    const void* p = nullptr;
    std::memcpy(&p, bytes.data() + at, sizeof p);
    const std::optional<Region> r = find_region(p);
    if (!r) continue;
    const bool seen = std::any_of(regions.begin(), regions.end(),
                                  [&](const Region& o) { return o.base == r->base; });
    if (!seen) regions.push_back(*r);
  }
  return regions;
}

std::vector<std::vector<char>> save(const std::vector<Region>& regions) {
  std::vector<std::vector<char>> copies;
  for (const Region& r : regions) copies.emplace_back(r.base, r.base + r.bytes);
  return copies;
}

void restore(const std::vector<Region>& regions, const std::vector<std::vector<char>>& copies) {
  for (std::size_t i = 0; i < regions.size(); ++i)
    std::memcpy(regions[i].base, copies[i].data(), regions[i].bytes);
}

// The race check's two runs in two orders, compared byte for byte.
void run_checked_twice(const LaunchConfig& config, const Kernel& kernel, std::uint64_t launch) {
  const std::vector<Region> regions = referenced_regions(kernel);
  const std::vector<std::vector<char>> inputs = save(regions);
  std::minstd_rand first(
      static_cast<unsigned>(race_check().seed ^ (launch * 0x9e3779b97f4a7c15ull)));
  if (!run_grid(config, kernel, &first)) return;
  profile::launch_ends();  // the second run is not counted
  const std::vector<std::vector<char>> results = save(regions);
  restore(regions, inputs);
  std::minstd_rand second(
      static_cast<unsigned>((race_check().seed + 1) ^ (launch * 0xc2b2ae3d27d4eb4full)));
  if (!run_grid(config, kernel, &second)) return;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Region& r = regions[i];
    if (std::memcmp(r.base, results[i].data(), r.bytes) == 0) continue;
    std::size_t at = 0;
    while (r.base[at] == results[i][at]) ++at;
    char where[96];
    std::snprintf(where, sizeof where, "%p", static_cast<void*>(r.base));
    fault(device_of(config.stream), cudaErrorLaunchFailure,
          std::string("kernel ") + config.name +
              ": two runs in different orders of its threads and blocks differ at byte " +
              std::to_string(at) + " of the " + std::to_string(r.bytes) + "-byte allocation of " +
              kind_name(r.kind) + " at " + where +
              " (race check): its result depends on the order its threads ran in (a missing "
              "__syncthreads, shared memory read before it is written, or two threads writing "
              "one element)");
    return;
  }
}

cudaError_t check_config(const LaunchConfig& c) {
  const dim3 b = c.block, g = c.grid;
  const std::uint64_t threads = std::uint64_t{b.x} * b.y * b.z;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > kMaxThreads || b.y > kMaxThreads ||
      b.z > kMaxBlockZ || threads > kMaxThreads)
    return fail(cudaErrorInvalidConfiguration, std::string("launch of ") + c.name,
                "block " + coords(uint3(b)) + " (at most 1024 threads, z at most 64)");
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > kMaxGridX || g.y > kMaxGridYZ || g.z > kMaxGridYZ)
    return fail(cudaErrorInvalidConfiguration, std::string("launch of ") + c.name,
                "grid " + coords(uint3(g)) + " (y and z at most 65535, none 0)");
  if (c.shared_bytes > dynamic_shared_limit(c.func))
    return fail(cudaErrorInvalidValue, std::string("launch of ") + c.name,
                std::to_string(c.shared_bytes) + " bytes of dynamic shared memory (at most " +
                    std::to_string(dynamic_shared_limit(c.func)) +
                    "; above 49152 after cudaFuncSetAttribute only)");
  return cudaSuccess;
}

}  // namespace

void launch(const LaunchConfig& config, std::shared_ptr<const Kernel> kernel) {
  if (check_config(config) != cudaSuccess) return;  // the thread's last error says why
  const std::uint64_t id = g_launches++;
  if (counting())
    count_work("kernel", config.name,
               std::uint64_t(config.grid.x) * config.grid.y * config.grid.z * config.block.x *
                   config.block.y * config.block.z,
               0, 0);
  enqueue(config.stream, std::string("kernel ") + config.name, [config, kernel, id] {
    profile::launch_begins(config);
    if (race_check().on)
      run_checked_twice(config, *kernel, id);
    else
      run_grid(config, *kernel, nullptr);
    profile::launch_ends();
  });
}

const uint3& thread_idx() { return current_block().running->idx; }
const uint3& block_idx() { return current_block().idx; }
const dim3& block_dim() { return current_block().dim; }
const dim3& grid_dim() { return current_block().grid; }
void* dynamic_shared() { return current_block().dynamic_shared; }

void sync_threads() { current_block().wait_at_barrier(); }

std::uint64_t warp_call(WarpOp op, unsigned mask, std::uint64_t value, int arg, int width) {
  return current_block().warp_call(op, mask, value, arg, width);
}

void thread_fault(const std::string& why) { current_block().fault_running(why); }

int running_thread() {
  const Thread* t = current_block().running;
  return t == nullptr ? -1 : t->linear;
}

}  // namespace cuda_emu
