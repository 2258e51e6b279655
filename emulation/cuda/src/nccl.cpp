// The emulated NCCL (include/nccl.h): communicators over MPI_COMM_WORLD, collectives and
// point-to-point operations queued in stream order on the emulated device memory (host memory
// that memory.cpp tracks), run by MPI on the stream's worker thread (MPI_THREAD_MULTIPLE).
//
// Communicator set-up. ncclGetUniqueId writes an id naming the creating process (its rank in
// MPI_COMM_WORLD) and a per-process sequence number, behind a magic that tells garbage ids
// apart. ncclCommInitRank meets the other members point to point on MPI_COMM_WORLD: every
// member sends a hello (its rank, nranks, world rank, GPU) to the id's creator, which must be a
// member; the creator checks them (nranks mismatch, duplicate ranks or GPUs) and answers each
// with the roster (every rank's world rank) or the error; then the members alone call
// MPI_Comm_create_group, which is collective over the group only (holders and other processes
// of the job never take part). The communicator's messages all travel on that new MPI
// communicator, a context of its own.
//
// Tags. The set-up's messages use tags 32256..32767 of MPI_COMM_WORLD (kTagHello, kTagRoster,
// and kTagCreateGroup + 0..255 for MPI_Comm_create_group). They cannot be taken by pdtrain's
// receives: pdtrain's own point-to-point messages (wire::Tag 101..108, the fixed-order
// reducer's 1 and 2, ...) all travel on private duplicates of the job communicator
// (Layout::world(), MpiCollectives, FixedOrderReducer: MPI_Comm_dup), whose messages never match
// a receive on MPI_COMM_WORLD and the other way round, whatever their tags; its only MPI_ANY_TAG
// receive (HolderServer's MPI_Iprobe) is on Layout::world(). What pdtrain does on MPI_COMM_WORLD
// itself is collective (MPI_Bcast, MPI_Allreduce, MPI_Comm_split_type), which never matches
// point-to-point traffic; the tests' own messages on it use small tags (7, 8). 32767 is the
// least MPI_TAG_UB the MPI standard allows, so the range is valid under every MPI. (The tag of
// MPI_Comm_create_group only tells concurrent creations apart and, by the standard, never
// conflicts with point-to-point tags; it stays in the range all the same.) The set-up waits for
// the other members as long as the communicator's timeout (below), but at least a minute.
//
// Order and tags on a communicator. All ranks issue a communicator's collectives in the same
// order (NCCL requires it): the k-th gets tag k (mod half of MPI_TAG_UB), so collectives queued
// on different streams never take each other's messages. The k-th send from rank a to rank b
// pairs with b's k-th receive from a, as in NCCL: they get tags from per-peer counters in the
// upper half of the tag space. Messages over 1 GiB travel in pieces, in order (MPI's
// non-overtaking rule).
//
// Sums. Contributions are gathered (to the root, or to each segment's owner) and combined in
// rank order 0, 1, 2, ... in the element type: ((x0 + x1) + x2) + ... in float for ncclFloat,
// wrapping for integers; ncclFloat16 and ncclBfloat16 are widened to float, combined in rank
// order in float and rounded to nearest even once, at the end. ncclAvg is the sum divided by
// the rank count (in float for the 16-bit types, integer division for integers; NCCL itself
// pre-multiplies floating contributions by 1/nranks, so its last bits can differ). Max and min
// are exact. ncclAllReduce is a reduce to rank 0 then a broadcast from it, so every rank gets
// the same bits, run after run.
//
// Groups (per host thread, nesting counted): calls between ncclGroupStart and the outermost
// ncclGroupEnd are checked when made and queued at ncclGroupEnd as one unit per stream, which
// posts all its sends and receives first (MPI_Isend/MPI_Irecv), then runs its collectives one
// after the other in the order issued, then waits for the sends and receives: a group of sends
// and receives between two ranks cannot deadlock. A call refused inside a group makes
// ncclGroupEnd return its error and queue nothing.
//
// Failure. Queued work polls its MPI requests (MPI_Testsome with a short back-off sleep) and
// gives up when its communicator is aborted (ncclCommAbort) or when no message has moved for
// the communicator's timeout (PDTRAIN_CUDA_EMU_NCCL_TIMEOUT seconds when it was made, default
// 600, 0 for never): it cancels what it had posted, records the error on every communicator of
// the unit (ncclCommGetAsyncError: ncclRemoteError after a timeout, ncclSystemError after an
// abort) and faults its stream's device (cuda_emu::fault, cudaErrorLaunchFailure) with a
// message naming the NCCL call and the peers it was waiting for. Later calls on a broken
// communicator are refused with its error. ncclCommDestroy waits for the communicator's queued
// work, then frees its MPI communicator (a broken or aborted one keeps it: peers may still post
// to it); ncclCommAbort makes the queued work end at once.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "emulator.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Set-up tags on MPI_COMM_WORLD (see the top of this file for why they cannot collide).
constexpr int kTagHello = 32256;
constexpr int kTagRoster = 32257;
constexpr int kTagCreateGroup = 32512;  // + 0..255
constexpr std::size_t kMaxPiece = std::size_t{1} << 30;
constexpr std::uint64_t kIdMagic = 0x6c63636e75647470ULL;  // "ptdunccl"

// ---------------------------------------------------------------------------------------------
// Errors.
std::mutex g_last_error_mutex;
std::string g_last_error;

int world_rank_or_minus_one() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void set_last_error(const std::string& message) {
  std::lock_guard<std::mutex> lock(g_last_error_mutex);
  g_last_error = message;
}

// Records "<call>: <why>" as the last error, prints it and returns rc.
ncclResult_t fail(ncclResult_t rc, const std::string& call, const std::string& why) {
  const std::string message = call + ": " + why;
  set_last_error(message);
  std::fprintf(stderr, "nccl emulation (world rank %d): %s\n", world_rank_or_minus_one(),
               message.c_str());
  return rc;
}

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return "ncclInt8";
    case ncclUint8:
      return "ncclUint8";
    case ncclInt32:
      return "ncclInt32";
    case ncclUint32:
      return "ncclUint32";
    case ncclInt64:
      return "ncclInt64";
    case ncclUint64:
      return "ncclUint64";
    case ncclFloat16:
      return "ncclFloat16";
    case ncclFloat32:
      return "ncclFloat32";
    case ncclFloat64:
      return "ncclFloat64";
    case ncclBfloat16:
      return "ncclBfloat16";
    case ncclFloat8e4m3:
      return "ncclFloat8e4m3";
    case ncclFloat8e5m2:
      return "ncclFloat8e5m2";
    default:
      return "an unknown ncclDataType_t";
  }
}

const char* op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum:
      return "ncclSum";
    case ncclProd:
      return "ncclProd";
    case ncclMax:
      return "ncclMax";
    case ncclMin:
      return "ncclMin";
    case ncclAvg:
      return "ncclAvg";
    default:
      return "an unknown ncclRedOp_t";
  }
}

// Bytes per element; 0 for a type the emulation refuses.
std::size_t element_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

std::string hex(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

double timeout_from_environment() {
  const char* text = std::getenv("PDTRAIN_CUDA_EMU_NCCL_TIMEOUT");
  if (text == nullptr || *text == '\0') return 600.0;
  char* end = nullptr;
  const double s = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(s >= 0)) {
    std::fprintf(stderr,
                 "nccl emulation: PDTRAIN_CUDA_EMU_NCCL_TIMEOUT=\"%s\" is not a number of "
                 "seconds >= 0: 600 s used\n",
                 text);
    return 600.0;
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// 16-bit floating types.
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

float bf16_to_float(std::uint16_t b) { return float_of(std::uint32_t{b} << 16); }

std::uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays a (quiet) NaN
  std::uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return float_of(sign | 0x7f800000u | (mantissa << 13));
  return float_of(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

std::uint16_t float_to_half(float f) {  // round to nearest even
  const std::uint32_t x = bits_of(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (ax < 0x38800000u) {  // below 2^-14: a subnormal (or the least normal after rounding)
    const float scaled = float_of(ax) * 16777216.0f;  // * 2^24: exact
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t mantissa = ax & 0x7fffffu;
  std::uint32_t h = (((ax >> 23) - 112) << 10) | (mantissa >> 13);
  const std::uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
  return static_cast<std::uint16_t>(sign | h);
}

// ---------------------------------------------------------------------------------------------
// Reductions in rank order: out = op(...op(op(in[0], in[1]), in[2])..., in[n-1]), elementwise.
template <class T>
T load(const void* p, std::size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void store(void* p, std::size_t i, T v) {
  std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T));
}

template <class A>
A combine(ncclRedOp_t op, A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case ncclSum:
      case ncclAvg:
        return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case ncclProd:
        return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case ncclMax:
        return a < b ? b : a;
      default:
        return b < a ? b : a;
    }
  } else {
    switch (op) {
      case ncclSum:
      case ncclAvg:
        return a + b;
      case ncclProd:
        return a * b;
      case ncclMax:
        return a < b ? b : a;
      default:
        return b < a ? b : a;
    }
  }
}

// T: the stored type; A: the type combined in; widen/narrow between them.
template <class T, class A, class Widen, class Narrow>
void reduce_typed(ncclRedOp_t op, const std::vector<const void*>& in, void* out, std::size_t count,
                  Widen widen, Narrow narrow) {
  std::vector<A> acc(count);
  for (std::size_t i = 0; i < count; ++i) acc[i] = widen(load<T>(in[0], i));
  for (std::size_t r = 1; r < in.size(); ++r)
    for (std::size_t i = 0; i < count; ++i)
      acc[i] = combine<A>(op, acc[i], widen(load<T>(in[r], i)));
  if (op == ncclAvg) {
    const A n = static_cast<A>(in.size());
    for (std::size_t i = 0; i < count; ++i) acc[i] = acc[i] / n;
  }
  for (std::size_t i = 0; i < count; ++i) store<T>(out, i, narrow(acc[i]));
}

template <class T>
void reduce_plain(ncclRedOp_t op, const std::vector<const void*>& in, void* out,
                  std::size_t count) {
  const auto same = [](T v) { return v; };
  reduce_typed<T, T>(op, in, out, count, same, same);
}

void reduce_in_rank_order(ncclDataType_t type, ncclRedOp_t op, const std::vector<const void*>& in,
                          void* out, std::size_t count) {
  switch (type) {
    case ncclInt8:
      return reduce_plain<std::int8_t>(op, in, out, count);
    case ncclUint8:
      return reduce_plain<std::uint8_t>(op, in, out, count);
    case ncclInt32:
      return reduce_plain<std::int32_t>(op, in, out, count);
    case ncclUint32:
      return reduce_plain<std::uint32_t>(op, in, out, count);
    case ncclInt64:
      return reduce_plain<std::int64_t>(op, in, out, count);
    case ncclUint64:
      return reduce_plain<std::uint64_t>(op, in, out, count);
    case ncclFloat32:
      return reduce_plain<float>(op, in, out, count);
    case ncclFloat64:
      return reduce_plain<double>(op, in, out, count);
    case ncclFloat16:
      return reduce_typed<std::uint16_t, float>(op, in, out, count, half_to_float, float_to_half);
    case ncclBfloat16:
      return reduce_typed<std::uint16_t, float>(op, in, out, count, bf16_to_float, float_to_bf16);
    default:
      return;  // refused when the call was made
  }
}

// ---------------------------------------------------------------------------------------------
// Communicators.
struct CommState {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, nranks = 1, device = 0;
  std::vector<int> world_ranks;
  double timeout_s = 600.0;
  int coll_tags = 1, p2p_tag_base = 1, p2p_tags = 1;
  std::atomic<bool> aborted{false};

  std::mutex mutex;
  std::condition_variable idle;
  int pending = 0;  // queued units that still hold the communicator
  ncclResult_t async_error = ncclSuccess;
  std::string async_message;
  // Issue-time counters (under mutex): the tags of the next collective and point-to-point ops.
  std::uint64_t next_coll = 0;
  std::vector<std::uint64_t> next_send, next_recv;

  std::string describe() const {
    std::string s =
        "rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " (world ranks";
    for (int w : world_ranks) s += " " + std::to_string(w);
    return s + ")";
  }
  std::string peer(int r) const {
    return "rank " + std::to_string(r) + " (world rank " + std::to_string(world_ranks[r]) + ")";
  }
  ncclResult_t error() {
    std::lock_guard<std::mutex> lock(mutex);
    return async_error;
  }
  std::string error_message() {
    std::lock_guard<std::mutex> lock(mutex);
    return async_message;
  }
  // The first error sticks.
  void break_with(ncclResult_t rc, const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex);
    if (async_error != ncclSuccess) return;
    async_error = rc;
    async_message = message;
  }
};

}  // namespace

struct ncclComm {
  std::shared_ptr<CommState> state;
};

namespace {

// A queued unit's hold on a communicator: ncclCommDestroy waits until none is left. Released
// when the unit has run, or when the runtime drops the unit without running it (its device
// faulted, or it could not be queued).
class Hold {
 public:
  explicit Hold(std::shared_ptr<CommState> comm) : comm_(std::move(comm)) {
    std::lock_guard<std::mutex> lock(comm_->mutex);
    ++comm_->pending;
  }
  ~Hold() { release(); }
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;
  void release() {
    if (released_) return;
    released_ = true;
    std::lock_guard<std::mutex> lock(comm_->mutex);
    if (--comm_->pending == 0) comm_->idle.notify_all();
  }

 private:
  std::shared_ptr<CommState> comm_;
  bool released_ = false;
};

// Waits until the communicator has no queued work, or until its device faulted (work then never
// runs; the runtime may keep it queued), or (limit_s > 0) until limit_s seconds have passed.
// True when no work is left.
bool wait_idle(CommState& c, double limit_s) {
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(c.mutex);
  while (c.pending > 0) {
    c.idle.wait_for(lock, std::chrono::milliseconds(50));
    if (c.pending == 0) break;
    lock.unlock();
    const bool dead = cuda_emu::sticky_error(c.device) != cudaSuccess;
    lock.lock();
    if (dead) return c.pending == 0;
    if (limit_s > 0 && std::chrono::duration<double>(Clock::now() - start).count() > limit_s)
      return c.pending == 0;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// MPI requests of queued work, polled so that an abort or a silent peer never hangs the stream.
class Waiter {
 public:
  Waiter() = default;
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;
  ~Waiter() { cancel(); }

  bool isend(CommState& c, const void* p, std::size_t bytes, int peer, int tag, std::string* why) {
    return post(c, const_cast<void*>(p), bytes, peer, tag, true, why);
  }
  bool irecv(CommState& c, void* p, std::size_t bytes, int peer, int tag, std::string* why) {
    return post(c, p, bytes, peer, tag, false, why);
  }

  // Waits for every request. On failure: *why says what was still awaited, *rc the error.
  bool wait(ncclResult_t* rc, std::string* why) {
    auto last_progress = Clock::now();
    int sleep_us = 0;
    std::vector<int> done(requests_.size());
    for (;;) {
      int n_done = 0;
      const int err = MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &n_done,
                                   done.data(), MPI_STATUSES_IGNORE);
      if (err != MPI_SUCCESS) {
        *rc = ncclSystemError;
        *why = "MPI_Testsome failed (MPI error " + std::to_string(err) + ") " + awaited();
        cancel();
        return false;
      }
      if (n_done == MPI_UNDEFINED) {  // nothing left
        requests_.clear();
        items_.clear();
        return true;
      }
      if (n_done > 0) {
        last_progress = Clock::now();
        sleep_us = 0;
        continue;
      }
      const double idle_s = std::chrono::duration<double>(Clock::now() - last_progress).count();
      for (std::size_t i = 0; i < requests_.size(); ++i) {
        if (requests_[i] == MPI_REQUEST_NULL) continue;
        CommState& c = *items_[i].comm;
        if (c.aborted.load()) {
          *rc = ncclSystemError;
          *why = "the communicator (" + c.describe() + ") was aborted (ncclCommAbort) " + awaited();
          cancel();
          return false;
        }
        if (c.timeout_s > 0 && idle_s > c.timeout_s) {
          *rc = ncclRemoteError;
          *why = "no message moved for " + std::to_string(static_cast<long>(c.timeout_s)) +
                 " s (PDTRAIN_CUDA_EMU_NCCL_TIMEOUT) " + awaited();
          cancel();
          return false;
        }
      }
      sleep_us = std::min(std::max(2 * sleep_us, 20), 1000);
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
  }

  // Cancels what is still posted (a cancelled receive completes at once; a send that MPI
  // cannot cancel is freed and completes on its own).
  void cancel() {
    bool any = false;
    for (MPI_Request& r : requests_)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        any = true;
      }
    if (any) {
      const auto until = Clock::now() + std::chrono::milliseconds(200);
      for (;;) {
        int flag = 0;
        MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                    MPI_STATUSES_IGNORE);
        if (flag || Clock::now() > until) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      for (MPI_Request& r : requests_)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    requests_.clear();
    items_.clear();
  }

 private:
  struct Item {
    CommState* comm;
    int peer;
    bool send;
    std::size_t bytes;
  };

  bool post(CommState& c, void* p, std::size_t bytes, int peer, int tag, bool send,
            std::string* why) {
    std::size_t offset = 0;
    do {  // a zero-byte message still travels, so that the pairs match
      const std::size_t piece = std::min(bytes - offset, kMaxPiece);
      MPI_Request r = MPI_REQUEST_NULL;
      char* at = static_cast<char*>(p) + offset;
      const int err = send ? MPI_Isend(at, static_cast<int>(piece), MPI_BYTE, peer, tag, c.mpi, &r)
                           : MPI_Irecv(at, static_cast<int>(piece), MPI_BYTE, peer, tag, c.mpi, &r);
      if (err != MPI_SUCCESS) {
        *why = std::string(send ? "MPI_Isend to " : "MPI_Irecv from ") + c.peer(peer) +
               " failed (MPI error " + std::to_string(err) + ")";
        return false;
      }
      requests_.push_back(r);
      items_.push_back({&c, peer, send, piece});
      offset += piece;
    } while (offset < bytes);
    return true;
  }

  // "while waiting to receive 4096 bytes from rank 1 (world rank 1), ..."
  std::string awaited() const {
    std::string s;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      const Item& it = items_[i];
      s += std::string(s.empty() ? "while waiting to " : ", to ") +
           (it.send ? "send " : "receive ") + std::to_string(it.bytes) + " bytes " +
           (it.send ? "to " : "from ") + it.comm->peer(it.peer);
    }
    return s;
  }

  std::vector<MPI_Request> requests_;
  std::vector<Item> items_;
};

// ---------------------------------------------------------------------------------------------
// Operations.
enum class Kind { reduce, broadcast, all_reduce, reduce_scatter, all_gather, send, recv };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::reduce:
      return "ncclReduce";
    case Kind::broadcast:
      return "ncclBroadcast";
    case Kind::all_reduce:
      return "ncclAllReduce";
    case Kind::reduce_scatter:
      return "ncclReduceScatter";
    case Kind::all_gather:
      return "ncclAllGather";
    case Kind::send:
      return "ncclSend";
    default:
      return "ncclRecv";
  }
}

struct Op {
  Kind kind = Kind::all_reduce;
  std::shared_ptr<CommState> comm;
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t red = ncclSum;
  int root = 0;  // the root, or the peer of a send or receive
  int tag = 0;
  cudaStream_t stream = nullptr;
  int device = 0;

  bool p2p() const { return kind == Kind::send || kind == Kind::recv; }
  std::size_t bytes() const { return count * element_size(type); }
  std::string describe() const {
    std::string s =
        std::string(kind_name(kind)) + "(" + std::to_string(count) + " x " + type_name(type);
    switch (kind) {
      case Kind::reduce:
        s += std::string(", ") + op_name(red) + ", root " + std::to_string(root);
        break;
      case Kind::broadcast:
        s += ", root " + std::to_string(root);
        break;
      case Kind::all_reduce:
      case Kind::reduce_scatter:
        s += std::string(", ") + op_name(red);
        break;
      case Kind::send:
        s += ", to rank " + std::to_string(root);
        break;
      case Kind::recv:
        s += ", from rank " + std::to_string(root);
        break;
      default:
        break;
    }
    return s + ") on " + comm->describe();
  }
};

struct Unit {
  std::vector<Op> ops;
  std::vector<std::unique_ptr<Hold>> holds;
  std::string what;
};

std::unique_ptr<char[]> scratch(std::size_t bytes) {
  return std::unique_ptr<char[]>(new char[std::max<std::size_t>(bytes, 1)]);
}

// Rank order: gathers every contribution at `root` and combines them there into recv.
bool reduce_to(const Op& op, int root, const void* send, void* recv, ncclResult_t* rc,
               std::string* why) {
  CommState& c = *op.comm;
  const std::size_t bytes = op.bytes();
  const int n = c.nranks, me = c.rank;
  *rc = ncclSystemError;
  Waiter w;
  if (me != root) return w.isend(c, send, bytes, root, op.tag, why) && w.wait(rc, why);
  std::unique_ptr<char[]> received = scratch(bytes * static_cast<std::size_t>(n));
  for (int k = 1; k < n; ++k) {
    const int r = (me + k) % n;
    if (!w.irecv(c, received.get() + static_cast<std::size_t>(r) * bytes, bytes, r, op.tag, why))
      return false;
  }
  if (!w.wait(rc, why)) return false;
  std::vector<const void*> in(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    in[static_cast<std::size_t>(r)] =
        r == me ? send : received.get() + static_cast<std::size_t>(r) * bytes;
  reduce_in_rank_order(op.type, op.red, in, recv, op.count);
  return true;
}

// Copies root's src to every rank's dst.
bool broadcast_from(const Op& op, int root, const void* src, void* dst, ncclResult_t* rc,
                    std::string* why) {
  CommState& c = *op.comm;
  const std::size_t bytes = op.bytes();
  const int n = c.nranks, me = c.rank;
  *rc = ncclSystemError;
  Waiter w;
  if (me != root) return w.irecv(c, dst, bytes, root, op.tag, why) && w.wait(rc, why);
  for (int k = 1; k < n; ++k)
    if (!w.isend(c, src, bytes, (me + k) % n, op.tag, why)) return false;
  if (!w.wait(rc, why)) return false;
  if (src != dst) std::memmove(dst, src, bytes);
  return true;
}

bool reduce_scatter(const Op& op, ncclResult_t* rc, std::string* why) {
  CommState& c = *op.comm;
  const std::size_t bytes = op.bytes();  // one segment
  const int n = c.nranks, me = c.rank;
  const char* send = static_cast<const char*>(op.send);
  *rc = ncclSystemError;
  std::unique_ptr<char[]> received = scratch(bytes * static_cast<std::size_t>(n));
  Waiter w;
  for (int k = 1; k < n; ++k) {
    const int r = (me + k) % n;
    if (!w.irecv(c, received.get() + static_cast<std::size_t>(r) * bytes, bytes, r, op.tag, why))
      return false;
  }
  for (int k = 1; k < n; ++k) {
    const int r = (me + k) % n;
    if (!w.isend(c, send + static_cast<std::size_t>(r) * bytes, bytes, r, op.tag, why))
      return false;
  }
  if (!w.wait(rc, why)) return false;
  std::vector<const void*> in(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    in[static_cast<std::size_t>(r)] = r == me
                                          ? send + static_cast<std::size_t>(me) * bytes
                                          : received.get() + static_cast<std::size_t>(r) * bytes;
  reduce_in_rank_order(op.type, op.red, in, op.recv, op.count);
  return true;
}

bool all_gather(const Op& op, ncclResult_t* rc, std::string* why) {
  CommState& c = *op.comm;
  const std::size_t bytes = op.bytes();  // one segment
  const int n = c.nranks, me = c.rank;
  char* recv = static_cast<char*>(op.recv);
  *rc = ncclSystemError;
  Waiter w;
  for (int k = 1; k < n; ++k) {
    const int r = (me + k) % n;
    if (!w.irecv(c, recv + static_cast<std::size_t>(r) * bytes, bytes, r, op.tag, why))
      return false;
  }
  for (int k = 1; k < n; ++k)
    if (!w.isend(c, op.send, bytes, (me + k) % n, op.tag, why)) return false;
  if (!w.wait(rc, why)) return false;
  char* mine = recv + static_cast<std::size_t>(me) * bytes;
  if (mine != op.send) std::memmove(mine, op.send, bytes);
  return true;
}

bool run_collective(const Op& op, ncclResult_t* rc, std::string* why) {
  switch (op.kind) {
    case Kind::reduce:
      return reduce_to(op, op.root, op.send, op.recv, rc, why);
    case Kind::broadcast:
      return broadcast_from(op, op.root, op.send, op.recv, rc, why);
    case Kind::all_reduce:
      return reduce_to(op, 0, op.send, op.recv, rc, why) &&
             broadcast_from(op, 0, op.recv, op.recv, rc, why);
    case Kind::reduce_scatter:
      return reduce_scatter(op, rc, why);
    case Kind::all_gather:
      return all_gather(op, rc, why);
    default:
      return true;
  }
}

// The unit failed: every communicator it used is broken (its peers wait for what this unit
// did not do), the stream's device faults.
void fail_unit(Unit& u, ncclResult_t rc, const std::string& why) {
  const std::string message = u.what + ": " + why;
  set_last_error(message);
  for (const Op& op : u.ops) op.comm->break_with(rc, message);
  cuda_emu::fault(u.ops.front().device, cudaErrorLaunchFailure, "nccl emulation: " + message);
}

// Runs a unit on its stream's worker thread: the point-to-point operations are all posted
// first, then the collectives run one after the other in the order issued (every rank issues
// them in the same order), then the point-to-point operations are waited for.
void run_unit(Unit& u) {
  ncclResult_t rc = ncclSuccess;
  std::string why;
  bool ok = true;
  for (const Op& op : u.ops) {
    CommState& c = *op.comm;
    if (c.aborted.load()) {
      rc = ncclSystemError;
      why = "the communicator (" + c.describe() + ") was aborted (ncclCommAbort) before it ran";
      ok = false;
      break;
    }
    if (c.error() != ncclSuccess) {
      rc = c.error();
      why = "the communicator (" + c.describe() + ") is broken: " + c.error_message();
      ok = false;
      break;
    }
  }
  Waiter p2p;
  for (std::size_t i = 0; ok && i < u.ops.size(); ++i) {
    const Op& op = u.ops[i];
    if (op.kind == Kind::send) ok = p2p.isend(*op.comm, op.send, op.bytes(), op.root, op.tag, &why);
    if (op.kind == Kind::recv) ok = p2p.irecv(*op.comm, op.recv, op.bytes(), op.root, op.tag, &why);
    if (!ok) rc = ncclSystemError;
  }
  for (std::size_t i = 0; ok && i < u.ops.size(); ++i) {
    const Op& op = u.ops[i];
    if (op.p2p()) continue;
    if (!run_collective(op, &rc, &why)) {
      why = op.describe() + ": " + why;
      ok = false;
    }
  }
  if (ok) ok = p2p.wait(&rc, &why);
  p2p.cancel();
  if (!ok) fail_unit(u, rc, why);
  for (auto& h : u.holds) h->release();
}

// Queues ops, one unit per stream (in the order the streams first appear).
ncclResult_t launch(std::vector<Op> ops, const std::string& call) {
  std::vector<cudaStream_t> streams;
  for (const Op& op : ops)
    if (std::find(streams.begin(), streams.end(), op.stream) == streams.end())
      streams.push_back(op.stream);
  ncclResult_t rc = ncclSuccess;
  for (cudaStream_t s : streams) {
    auto unit = std::make_shared<Unit>();
    std::vector<CommState*> comms;
    for (const Op& op : ops) {
      if (op.stream != s) continue;
      unit->ops.push_back(op);
      if (std::find(comms.begin(), comms.end(), op.comm.get()) == comms.end()) {
        comms.push_back(op.comm.get());
        unit->holds.push_back(std::make_unique<Hold>(op.comm));
      }
    }
    if (unit->ops.size() == 1) {
      unit->what = unit->ops.front().describe();
    } else {
      unit->what = "NCCL group of " + std::to_string(unit->ops.size()) + " operations (";
      for (std::size_t i = 0; i < unit->ops.size(); ++i)
        unit->what += std::string(i ? ", " : "") + unit->ops[i].describe();
      unit->what += ")";
    }
    const std::string what = unit->what;
    const cudaError_t e = cuda_emu::enqueue(s, what, [unit] { run_unit(*unit); });
    if (e != cudaSuccess && rc == ncclSuccess)
      rc = fail(ncclUnhandledCudaError, call,
                "could not queue " + what + " on its stream: " + cudaGetErrorString(e));
  }
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Groups (per host thread).
thread_local int t_group_depth = 0;
thread_local std::vector<Op> t_group_ops;
thread_local ncclResult_t t_group_error = ncclSuccess;

ncclResult_t refuse(ncclResult_t rc, const std::string& call, const std::string& why) {
  if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = rc;
  return fail(rc, call, why);
}

ncclResult_t issue(Op op, const std::string& call) {
  if (t_group_depth > 0) {
    t_group_ops.push_back(std::move(op));
    return ncclSuccess;
  }
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  return launch(std::move(ops), call);
}

// A buffer of `bytes` the operation reads or writes: device memory of the communicator's GPU,
// or pinned host memory (which the GPU can reach), holding the whole extent.
ncclResult_t check_buffer(const std::string& call, const char* name, const void* p,
                          std::size_t bytes, const CommState& c) {
  if (p == nullptr) return refuse(ncclInvalidArgument, call, std::string(name) + " is NULL");
  const std::optional<cuda_emu::Region> region = cuda_emu::find_region(p);
  if (!region)
    return refuse(ncclInvalidArgument, call,
                  std::string(name) + " " + hex(p) +
                      " is pageable host memory: NCCL moves device memory (cudaMalloc) only");
  if (region->kind == cuda_emu::MemoryKind::device && region->device != c.device)
    return refuse(ncclInvalidArgument, call,
                  std::string(name) + " " + hex(p) + " is device memory of GPU " +
                      std::to_string(region->device) + ", but the communicator's GPU is " +
                      std::to_string(c.device));
  const std::size_t offset = static_cast<std::size_t>(static_cast<const char*>(p) - region->base);
  if (bytes > region->bytes - offset)
    return refuse(ncclInvalidArgument, call,
                  std::string(name) + " " + hex(p) + ": " + std::to_string(bytes) +
                      " bytes run past the end of its allocation (" +
                      std::to_string(region->bytes) + " bytes of " +
                      cuda_emu::kind_name(region->kind) + " at " + hex(region->base) + ")");
  return ncclSuccess;
}

ncclResult_t check_comm(const std::string& call, ncclComm_t comm) {
  if (comm == nullptr || !comm->state) return refuse(ncclInvalidArgument, call, "comm is NULL");
  CommState& c = *comm->state;
  const ncclResult_t e = c.error();
  if (e != ncclSuccess)
    return refuse(e, call,
                  "the communicator (" + c.describe() + ") is broken: " + c.error_message());
  return ncclSuccess;
}

ncclResult_t check_type(const std::string& call, ncclDataType_t type) {
  if (type == ncclFloat8e4m3 || type == ncclFloat8e5m2)
    return refuse(ncclInvalidArgument, call,
                  std::string(type_name(type)) + " is not supported by the NCCL emulation");
  if (element_size(type) == 0)
    return refuse(
        ncclInvalidArgument, call,
        "datatype " + std::to_string(static_cast<int>(type)) + " is not an ncclDataType_t");
  return ncclSuccess;
}

ncclResult_t check_rank(const std::string& call, const char* name, int r, const CommState& c) {
  if (r < 0 || r >= c.nranks)
    return refuse(ncclInvalidArgument, call,
                  std::string(name) + " " + std::to_string(r) +
                      " is not a rank of the communicator (0.." + std::to_string(c.nranks - 1) +
                      ")");
  return ncclSuccess;
}

// The checks and the queueing of a collective. Where a buffer is unused on this rank (a
// non-root's recvbuff of ncclReduce, sendbuff of ncclBroadcast), it is not checked, as NCCL
// lets it be NULL.
ncclResult_t collective(Kind kind, const void* send, void* recv, std::size_t count,
                        ncclDataType_t type, ncclRedOp_t red, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  const std::string call = kind_name(kind);
  ncclResult_t rc = check_comm(call, comm);
  if (rc != ncclSuccess) return rc;
  if ((rc = check_type(call, type)) != ncclSuccess) return rc;
  CommState& c = *comm->state;
  const bool reduces =
      kind == Kind::reduce || kind == Kind::all_reduce || kind == Kind::reduce_scatter;
  if (reduces && (static_cast<int>(red) < 0 || red >= ncclNumOps))
    return refuse(ncclInvalidArgument, call,
                  "op " + std::to_string(static_cast<int>(red)) +
                      " is not a built-in ncclRedOp_t (ncclRedOpCreatePreMulSum is not emulated)");
  const bool rooted = kind == Kind::reduce || kind == Kind::broadcast;
  if (rooted && (rc = check_rank(call, "root", root, c)) != ncclSuccess) return rc;
  const std::size_t es = element_size(type), n = static_cast<std::size_t>(c.nranks);
  if (count > SIZE_MAX / es / n)
    return refuse(ncclInvalidArgument, call, "count " + std::to_string(count) + " is too large");
  if (count == 0) return ncclSuccess;  // nothing moves on any rank
  const std::size_t bytes = count * es;
  const bool root_here = rooted && root == c.rank;
  switch (kind) {
    case Kind::reduce:
      rc = check_buffer(call, "sendbuff", send, bytes, c);
      if (rc == ncclSuccess && root_here) rc = check_buffer(call, "recvbuff", recv, bytes, c);
      break;
    case Kind::broadcast:
      if (root_here) rc = check_buffer(call, "sendbuff", send, bytes, c);
      if (rc == ncclSuccess) rc = check_buffer(call, "recvbuff", recv, bytes, c);
      break;
    case Kind::all_reduce:
      rc = check_buffer(call, "sendbuff", send, bytes, c);
      if (rc == ncclSuccess) rc = check_buffer(call, "recvbuff", recv, bytes, c);
      break;
    case Kind::reduce_scatter:
      rc = check_buffer(call, "sendbuff", send, bytes * n, c);
      if (rc == ncclSuccess) rc = check_buffer(call, "recvbuff", recv, bytes, c);
      break;
    case Kind::all_gather:
      rc = check_buffer(call, "sendbuff", send, bytes, c);
      if (rc == ncclSuccess) rc = check_buffer(call, "recvbuff", recv, bytes * n, c);
      break;
    default:
      break;
  }
  if (rc != ncclSuccess) return rc;
  Op op;
  op.kind = kind;
  op.comm = comm->state;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.type = type;
  op.red = red;
  op.root = root;
  op.stream = stream;
  op.device = cuda_emu::device_of(stream);
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    op.tag = static_cast<int>(c.next_coll++ % static_cast<std::uint64_t>(c.coll_tags));
  }
  return issue(std::move(op), call);
}

ncclResult_t point_to_point(Kind kind, const void* buff, std::size_t count, ncclDataType_t type,
                            int peer, ncclComm_t comm, cudaStream_t stream) {
  const std::string call = kind_name(kind);
  ncclResult_t rc = check_comm(call, comm);
  if (rc != ncclSuccess) return rc;
  if ((rc = check_type(call, type)) != ncclSuccess) return rc;
  CommState& c = *comm->state;
  if ((rc = check_rank(call, "peer", peer, c)) != ncclSuccess) return rc;
  const std::size_t es = element_size(type);
  if (count > SIZE_MAX / es)
    return refuse(ncclInvalidArgument, call, "count " + std::to_string(count) + " is too large");
  if (count == 0) return ncclSuccess;  // NCCL moves nothing, on either side
  rc = check_buffer(call, kind == Kind::send ? "sendbuff" : "recvbuff", buff, count * es, c);
  if (rc != ncclSuccess) return rc;
  Op op;
  op.kind = kind;
  op.comm = comm->state;
  op.send = kind == Kind::send ? buff : nullptr;
  op.recv = kind == Kind::recv ? const_cast<void*>(buff) : nullptr;
  op.count = count;
  op.type = type;
  op.root = peer;
  op.stream = stream;
  op.device = cuda_emu::device_of(stream);
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    std::uint64_t& k =
        (kind == Kind::send ? c.next_send : c.next_recv)[static_cast<std::size_t>(peer)];
    op.tag = c.p2p_tag_base + static_cast<int>(k++ % static_cast<std::uint64_t>(c.p2p_tags));
  }
  return issue(std::move(op), call);
}

// ---------------------------------------------------------------------------------------------
// Ids and the set-up rendezvous.
std::atomic<std::uint64_t> g_next_id{1};

struct IdWire {
  std::uint64_t magic;
  std::int32_t creator;  // world rank of the process that made the id
  std::int32_t reserved;
  std::uint64_t seq;  // its sequence number in that process
};
static_assert(sizeof(IdWire) <= NCCL_UNIQUE_ID_BYTES);
static_assert(offsetof(IdWire, seq) == 16,
              "tests/emulation/test_nccl.cpp forges an id's number there");

struct Hello {
  std::uint64_t seq;
  std::int32_t nranks, rank, world_rank, device;
  char uuid[16];
};

struct RosterHead {
  std::uint64_t seq;
  std::int32_t status, nranks;
  char message[768];
};

struct Letter {
  int tag = 0, source = -1;
  std::vector<char> bytes;
};

// Set-up letters received but not yet wanted (another communicator's, made by another thread).
std::mutex g_mail_mutex;
std::vector<Letter> g_mail;

using Deadline = std::optional<Clock::time_point>;

Deadline deadline_after(double s) {
  if (s <= 0) return std::nullopt;
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

template <class Want>
std::optional<Letter> fetch(int tag, int source, Want want, Deadline deadline) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(g_mail_mutex);
      for (auto it = g_mail.begin(); it != g_mail.end(); ++it)
        if (it->tag == tag && (source < 0 || it->source == source) && want(*it)) {
          Letter l = std::move(*it);
          g_mail.erase(it);
          return l;
        }
      bool got = false;
      for (int t : {kTagHello, kTagRoster}) {
        for (;;) {
          int flag = 0;
          MPI_Message m;
          MPI_Status st;
          if (MPI_Improbe(MPI_ANY_SOURCE, t, MPI_COMM_WORLD, &flag, &m, &st) != MPI_SUCCESS ||
              !flag)
            break;
          int n = 0;
          MPI_Get_count(&st, MPI_BYTE, &n);
          Letter l;
          l.tag = t;
          l.source = st.MPI_SOURCE;
          l.bytes.resize(static_cast<std::size_t>(n));
          MPI_Mrecv(l.bytes.data(), n, MPI_BYTE, &m, MPI_STATUS_IGNORE);
          g_mail.push_back(std::move(l));
          got = true;
        }
      }
      if (got) continue;
    }
    if (deadline && Clock::now() > *deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

// Sends on MPI_COMM_WORLD and waits (polling) until the send completed.
bool post_letter(const void* p, std::size_t bytes, int dest, int tag, Deadline deadline) {
  MPI_Request r;
  if (MPI_Isend(p, static_cast<int>(bytes), MPI_BYTE, dest, tag, MPI_COMM_WORLD, &r) != MPI_SUCCESS)
    return false;
  for (;;) {
    int flag = 0;
    MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
    if (flag) return true;
    if (deadline && Clock::now() > *deadline) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::string seconds(double s) { return std::to_string(static_cast<long>(s)) + " s"; }

std::string uuid_text(const char* u) {
  char text[48];
  std::snprintf(text, sizeof text,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                u[0] & 0xff, u[1] & 0xff, u[2] & 0xff, u[3] & 0xff, u[4] & 0xff, u[5] & 0xff,
                u[6] & 0xff, u[7] & 0xff, u[8] & 0xff, u[9] & 0xff, u[10] & 0xff, u[11] & 0xff,
                u[12] & 0xff, u[13] & 0xff, u[14] & 0xff, u[15] & 0xff);
  return text;
}

std::string member(const Hello& h) {
  return "rank " + std::to_string(h.rank) + " (world rank " + std::to_string(h.world_rank) + ")";
}

// The creator's side: collects the members' hellos, judges them, answers every member.
ncclResult_t gather_members(const Hello& mine, double timeout_s, int world_size,
                            std::vector<int>* world_ranks, std::string* why) {
  std::vector<Hello> got{mine};
  int expected = mine.nranks;
  bool mismatch = false;
  const auto same_id = [&](const Letter& l) {
    Hello h;
    if (l.bytes.size() != sizeof h) return false;
    std::memcpy(&h, l.bytes.data(), sizeof h);
    return h.seq == mine.seq;
  };
  while (static_cast<int>(got.size()) < expected) {
    // Once nranks disagree the set-up fails: wait a second for the stragglers, to tell them.
    const std::optional<Letter> l =
        fetch(kTagHello, -1, same_id, deadline_after(mismatch ? 1.0 : timeout_s));
    if (!l) break;
    Hello h;
    std::memcpy(&h, l->bytes.data(), sizeof h);
    got.push_back(h);
    if (h.nranks != mine.nranks) {
      mismatch = true;
      expected = std::max(expected, std::min(h.nranks, world_size));
    }
  }
  ncclResult_t rc = ncclSuccess;
  std::string message;
  for (std::size_t i = 1; i < got.size() && rc == ncclSuccess; ++i)
    if (got[i].nranks != mine.nranks) {
      rc = ncclInvalidArgument;
      message = "nranks mismatch: " + member(mine) +
                " passed nranks=" + std::to_string(mine.nranks) + ", " + member(got[i]) +
                " passed nranks=" + std::to_string(got[i].nranks);
    }
  for (std::size_t i = 0; i < got.size() && rc == ncclSuccess; ++i)
    for (std::size_t j = i + 1; j < got.size() && rc == ncclSuccess; ++j) {
      if (got[i].rank == got[j].rank) {
        rc = ncclInvalidArgument;
        message = "rank " + std::to_string(got[i].rank) + " is claimed by world rank " +
                  std::to_string(got[i].world_rank) + " and by world rank " +
                  std::to_string(got[j].world_rank);
      } else if (got[i].world_rank == got[j].world_rank) {
        rc = ncclInvalidUsage;
        message = "world rank " + std::to_string(got[i].world_rank) + " joined as rank " +
                  std::to_string(got[i].rank) + " and as rank " + std::to_string(got[j].rank) +
                  ": the emulation has one rank per process and communicator";
      } else if (std::memcmp(got[i].uuid, got[j].uuid, sizeof got[i].uuid) == 0) {
        rc = ncclInvalidUsage;
        message = "Duplicate GPU detected: " + member(got[i]) + " and " + member(got[j]) +
                  " both on CUDA device " + std::to_string(got[i].device) + " (" +
                  uuid_text(got[i].uuid) + ")";
      }
    }
  if (rc == ncclSuccess && static_cast<int>(got.size()) < expected) {
    rc = ncclSystemError;
    std::vector<bool> seen(static_cast<std::size_t>(expected), false);
    for (const Hello& h : got)
      if (h.rank >= 0 && h.rank < expected) seen[static_cast<std::size_t>(h.rank)] = true;
    std::string missing;
    for (int r = 0; r < expected; ++r)
      if (!seen[static_cast<std::size_t>(r)])
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    message = "only " + std::to_string(got.size()) + " of " + std::to_string(expected) +
              " ranks joined within " + seconds(timeout_s) +
              " (PDTRAIN_CUDA_EMU_NCCL_TIMEOUT); missing ranks: " + missing;
  }
  if (rc == ncclSuccess) {
    world_ranks->assign(static_cast<std::size_t>(mine.nranks), -1);
    for (const Hello& h : got) (*world_ranks)[static_cast<std::size_t>(h.rank)] = h.world_rank;
  }
  // The answer: the head, then (on success) every rank's world rank.
  std::vector<char> answer(sizeof(RosterHead) +
                           (rc == ncclSuccess ? world_ranks->size() * sizeof(std::int32_t) : 0));
  RosterHead head{};
  head.seq = mine.seq;
  head.status = rc;
  head.nranks = mine.nranks;
  std::snprintf(head.message, sizeof head.message, "%s", message.c_str());
  std::memcpy(answer.data(), &head, sizeof head);
  if (rc == ncclSuccess)
    for (std::size_t r = 0; r < world_ranks->size(); ++r) {
      const std::int32_t w = (*world_ranks)[r];
      std::memcpy(answer.data() + sizeof head + r * sizeof w, &w, sizeof w);
    }
  for (std::size_t i = 1; i < got.size(); ++i)
    if (!post_letter(answer.data(), answer.size(), got[i].world_rank, kTagRoster,
                     deadline_after(timeout_s)) &&
        rc == ncclSuccess) {
      rc = ncclSystemError;
      message = "could not answer " + member(got[i]);
    }
  *why = message;
  return rc;
}

// A member's side: says hello to the creator, waits for the roster.
ncclResult_t join_creator(const Hello& mine, int creator, double timeout_s,
                          std::vector<int>* world_ranks, std::string* why) {
  if (!post_letter(&mine, sizeof mine, creator, kTagHello, deadline_after(timeout_s))) {
    *why = "could not reach world rank " + std::to_string(creator) + ", which made the id";
    return ncclSystemError;
  }
  const auto same_id = [&](const Letter& l) {
    RosterHead h;
    if (l.bytes.size() < sizeof h) return false;
    std::memcpy(&h, l.bytes.data(), sizeof h);
    return h.seq == mine.seq;
  };
  const std::optional<Letter> l = fetch(kTagRoster, creator, same_id, deadline_after(timeout_s));
  if (!l) {
    *why = "no answer within " + seconds(timeout_s) +
           " (PDTRAIN_CUDA_EMU_NCCL_TIMEOUT) from world rank " + std::to_string(creator) +
           ", which made the id (in this emulation the process that calls ncclGetUniqueId "
           "must be a member of the communicator)";
    return ncclSystemError;
  }
  RosterHead head;
  std::memcpy(&head, l->bytes.data(), sizeof head);
  head.message[sizeof head.message - 1] = '\0';
  if (head.status != ncclSuccess) {
    *why = head.message;
    return static_cast<ncclResult_t>(head.status);
  }
  world_ranks->resize(static_cast<std::size_t>(head.nranks));
  if (l->bytes.size() != sizeof head + world_ranks->size() * sizeof(std::int32_t)) {
    *why = "a malformed answer from world rank " + std::to_string(creator);
    return ncclInternalError;
  }
  for (std::size_t r = 0; r < world_ranks->size(); ++r) {
    std::int32_t w;
    std::memcpy(&w, l->bytes.data() + sizeof head + r * sizeof w, sizeof w);
    (*world_ranks)[r] = w;
  }
  return ncclSuccess;
}

}  // namespace

// =============================================================================================
extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion", "version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {  // NCCL's own strings
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) {
  thread_local std::string copy;
  std::lock_guard<std::mutex> lock(g_last_error_mutex);
  copy = g_last_error;
  return copy.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  const char* call = "ncclGetUniqueId";
  if (uniqueId == nullptr) return fail(ncclInvalidArgument, call, "uniqueId is NULL");
  const int me = world_rank_or_minus_one();
  if (me < 0)
    return fail(ncclSystemError, call, "MPI is not initialized (the emulation runs over MPI)");
  IdWire w{};
  w.magic = kIdMagic;
  w.creator = me;
  w.seq = g_next_id.fetch_add(1);
  std::memset(uniqueId->internal, 0, sizeof uniqueId->internal);
  std::memcpy(uniqueId->internal, &w, sizeof w);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  const std::string call = "ncclCommInitRank";
  if (comm == nullptr) return fail(ncclInvalidArgument, call, "comm is NULL");
  *comm = nullptr;
  if (t_group_depth > 0)
    return fail(ncclInvalidUsage, call,
                "inside ncclGroupStart/ncclGroupEnd: not supported by the emulation");
  const int me = world_rank_or_minus_one();
  if (me < 0)
    return fail(ncclSystemError, call, "MPI is not initialized (the emulation runs over MPI)");
  int provided = MPI_THREAD_SINGLE, world_size = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE)
    return fail(ncclSystemError, call,
                "MPI was not initialized with MPI_THREAD_MULTIPLE: the emulation calls MPI from "
                "the streams' worker threads");
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (nranks < 1 || nranks > world_size)
    return fail(ncclInvalidArgument, call,
                "nranks " + std::to_string(nranks) + ": must be 1.." + std::to_string(world_size) +
                    " (one rank per process of MPI_COMM_WORLD)");
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, call,
                "rank " + std::to_string(rank) + " is not in 0.." + std::to_string(nranks - 1));
  IdWire w;
  std::memcpy(&w, commId.internal, sizeof w);
  bool rest_zero = true;
  for (std::size_t i = sizeof w; i < sizeof commId.internal; ++i)
    rest_zero = rest_zero && commId.internal[i] == 0;
  if (w.magic != kIdMagic || !rest_zero || w.reserved != 0) {
    bool all_zero = rest_zero && w.magic == 0 && w.creator == 0 && w.reserved == 0 && w.seq == 0;
    return fail(
        ncclInvalidArgument, call,
        all_zero ? "commId is all zeros: was the id from ncclGetUniqueId broadcast to every rank?"
                 : "commId was not made by ncclGetUniqueId (garbage or corrupted id)");
  }
  if (w.creator < 0 || w.creator >= world_size || w.seq == 0 ||
      (w.creator == me && w.seq >= g_next_id.load()))
    return fail(ncclInvalidArgument, call,
                "commId names world rank " + std::to_string(w.creator) + " and id " +
                    std::to_string(w.seq) + ", which ncclGetUniqueId never made");
  if (cuda_emu::visible_device_count() == 0)
    return fail(ncclUnhandledCudaError, call, "no CUDA device is visible");
  const int device = cuda_emu::current_device();
  if (cuda_emu::sticky_error(device) != cudaSuccess)
    return fail(ncclUnhandledCudaError, call,
                "CUDA device " + std::to_string(device) +
                    " has faulted: " + cudaGetErrorString(cuda_emu::sticky_error(device)));
  cudaDeviceProp prop{};
  const cudaError_t pe = cudaGetDeviceProperties(&prop, device);
  if (pe != cudaSuccess)
    return fail(ncclUnhandledCudaError, call,
                std::string("cudaGetDeviceProperties failed: ") + cudaGetErrorString(pe));

  Hello mine{};
  mine.seq = w.seq;
  mine.nranks = nranks;
  mine.rank = rank;
  mine.world_rank = me;
  mine.device = device;
  std::memcpy(mine.uuid, prop.uuid.bytes, sizeof mine.uuid);
  // The set-up waits at least a minute for the other members (0: for ever), whatever the
  // timeout of the communicator's work, so that a short one for a test does not fail the set-up.
  const double timeout_s = timeout_from_environment();
  const double setup_s = timeout_s > 0 ? std::max(timeout_s, 60.0) : 0.0;
  std::vector<int> world_ranks;
  std::string why;
  const ncclResult_t rc = w.creator == me
                              ? gather_members(mine, setup_s, world_size, &world_ranks, &why)
                              : join_creator(mine, w.creator, setup_s, &world_ranks, &why);
  if (rc != ncclSuccess) return fail(rc, call, why);

  // The members alone make the communicator's MPI communicator.
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm mpi = MPI_COMM_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, world_ranks.data(), &group);
  const int tag = kTagCreateGroup +
                  static_cast<int>((w.seq * 31 + static_cast<std::uint64_t>(w.creator)) % 256);
  const int err = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &mpi);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (err != MPI_SUCCESS || mpi == MPI_COMM_NULL)
    return fail(ncclSystemError, call,
                "MPI_Comm_create_group failed (MPI error " + std::to_string(err) + ")");
  MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
  int got_rank = -1;
  MPI_Comm_rank(mpi, &got_rank);
  if (got_rank != rank) {
    MPI_Comm_free(&mpi);
    return fail(ncclInternalError, call,
                "MPI_Comm_create_group ranked this process " + std::to_string(got_rank));
  }

  auto state = std::make_shared<CommState>();
  state->mpi = mpi;
  state->rank = rank;
  state->nranks = nranks;
  state->device = device;
  state->world_ranks = world_ranks;
  state->timeout_s = timeout_s;
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  const int tag_ub = flag && ub ? *ub : 32767;
  state->coll_tags = tag_ub / 2;
  state->p2p_tag_base = tag_ub / 2;
  state->p2p_tags = tag_ub - tag_ub / 2 + 1;
  state->next_send.assign(static_cast<std::size_t>(nranks), 0);
  state->next_recv.assign(static_cast<std::size_t>(nranks), 0);
  *comm = new ncclComm{std::move(state)};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommDestroy", "comm is NULL");
  CommState& c = *comm->state;
  const bool idle = wait_idle(c, 0);
  // A broken communicator keeps its MPI communicator: its peers may still be posting to it.
  if (idle && c.error() == ncclSuccess && c.mpi != MPI_COMM_NULL) MPI_Comm_free(&c.mpi);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  CommState& c = *comm->state;
  c.aborted.store(true);
  // Running work notices within a millisecond; work still queued behind other work fails when
  // it runs (it holds the state). Never frees the MPI communicator: peers may still use it.
  wait_idle(c, 5.0);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommGetAsyncError", "comm is NULL");
  if (asyncError == nullptr)
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError", "asyncError is NULL");
  *asyncError = comm->state->error();
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr)
    return fail(ncclInvalidArgument, "ncclCommCount", comm ? "count is NULL" : "comm is NULL");
  *count = comm->state->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr)
    return fail(ncclInvalidArgument, "ncclCommCuDevice", comm ? "device is NULL" : "comm is NULL");
  *device = comm->state->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr)
    return fail(ncclInvalidArgument, "ncclCommUserRank", comm ? "rank is NULL" : "comm is NULL");
  *rank = comm->state->rank;
  return ncclSuccess;
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(Kind::broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm,
                    stream);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(Kind::all_reduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return collective(Kind::reduce_scatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm,
                    stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return collective(Kind::all_gather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm,
                    stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(Kind::send, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(Kind::recv, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  if (t_group_depth++ == 0) {
    t_group_ops.clear();
    t_group_error = ncclSuccess;
  }
  return ncclSuccess;
}

// The outermost ncclGroupEnd queues what the group collected, one unit per stream; when a call
// inside the group was refused, nothing is queued and the group ends with that call's error.
ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd", "no ncclGroupStart to end");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Op> ops = std::move(t_group_ops);
  t_group_ops.clear();
  const ncclResult_t refused = t_group_error;
  t_group_error = ncclSuccess;
  if (refused != ncclSuccess) return refused;  // the refused call printed why
  if (ops.empty()) return ncclSuccess;
  return launch(std::move(ops), "ncclGroupEnd");
}

}  // extern "C"
