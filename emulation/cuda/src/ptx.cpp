// The PTX primitives of <cuda_emu_ptx.h> (ldmatrix, mma.sync m16n8k16, cp.async with commit
// and wait groups) on the emulated CUDA target, to the fragment layouts the PTX ISA documents
// (the header cites them). Every memory access they make goes through one function per kind:
// shared_read (ldmatrix's rows), global_read (cp.async's source) and shared_write (cp.async's
// landing); every tensor-core operation through mma_m16n8k16_bf16. The kernel counts
// (profile.hpp) see what a GPU's memory pipelines see, at the instruction's issue: ldmatrix's
// one 16-byte row per lane that gives an address, cp.async's 16-byte global read and shared
// write per lane, one m16n8k16 tensor operation per warp.
//
// Warp-collective calls publish what the other lanes need in a per-thread table and meet in
// warp_call (kernels.cpp checks the warp converged and that the lanes made the same call with
// the same shape). ldmatrix meets twice, as WMMA's mma does: the lanes read the rows after the
// first meeting and none goes on before all have read (so no lane's later store can reach
// another lane's load, as on a GPU where the warp's load is one instruction). mma copies its
// operands into the table at the call, in one of two tables by the lane's call parity: a lane
// can reuse a table only after its next mma, which waits for every lane of the warp to arrive.
#include <cuda_emu_ptx.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "emulator.hpp"
#include "profile.hpp"
#include "tensor_core.hpp"

namespace cuda_emu::ptx {
namespace {

constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kLanes = 32, kMaxThreads = 1024;

int linear_thread() {
  const uint3& t = thread_idx();
  const dim3& d = block_dim();
  return static_cast<int>((t.z * d.y + t.y) * d.x + t.x);
}

std::string address(const void* p) {
  char t[32];
  std::snprintf(t, sizeof t, "%p", p);
  return t;
}

void check_aligned16(const char* call, const char* what, const void* p) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
    thread_fault(std::string(call) + ": the " + what + " address " + address(p) +
                 " is not 16-byte aligned (PTX requires it)");
}

// Shared memory here is the block's static or dynamic shared memory, never a tracked
// allocation: device or pinned memory given as a shared address is the kernel's mistake.
void check_shared(const char* call, const void* p) {
  if (const auto r = find_region(p))
    thread_fault(std::string(call) + ": the shared-memory address " + address(p) + " is in " +
                 kind_name(r->kind) + " (a .shared operand must point into shared memory)");
}

// ---- the one place of each kind of memory access

void shared_read(void* to, const void* shared, std::size_t bytes) {
  std::memcpy(to, shared, bytes);
}
void global_read(void* to, const void* global, std::size_t bytes) {
  std::memcpy(to, global, bytes);
}
void shared_write(void* shared, const void* from, std::size_t bytes) {
  std::memcpy(shared, from, bytes);
}

// ---- ldmatrix

thread_local std::array<const unsigned char*, kMaxThreads> tl_rows{};

unsigned read_b16(const unsigned char* row, int column) {
  std::uint16_t h = 0;
  shared_read(&h, row + 2 * column, sizeof h);
  return h;
}

// ---- mma

struct MmaOperands {
  unsigned a[4], b[2];
};
thread_local std::array<std::array<MmaOperands, kMaxThreads>, 2> tl_mma{};
thread_local std::array<unsigned char, kMaxThreads> tl_mma_parity{};

float bf16_at(unsigned word, int half) {
  return __builtin_bit_cast(float, (half ? word >> 16 : word & 0xffffu) << 16);
}

// ---- cp.async

struct Copy {
  unsigned char* dst;
  const unsigned char* src;
  int src_bytes;
};
struct AsyncCopies {
  uint3 block{};
  const void* shared = nullptr;  // the block's dynamic shared memory when the copies were made
  std::vector<Copy> uncommitted;
  std::deque<std::vector<Copy>> groups;
};
thread_local std::vector<AsyncCopies> tl_async(kMaxThreads);

// The running thread's copies. A thread that exited with copies outstanding leaves them to the
// next block that runs the same thread index: they are dropped there (a GPU lands them in the
// exited block's shared memory, which nothing reads any more).
AsyncCopies& my_copies() {
  AsyncCopies& c = tl_async[static_cast<std::size_t>(linear_thread())];
  const uint3 b = block_idx();
  if (c.block.x != b.x || c.block.y != b.y || c.block.z != b.z || c.shared != dynamic_shared()) {
    c.uncommitted.clear();
    c.groups.clear();
    c.block = b;
    c.shared = dynamic_shared();
  }
  return c;
}

void land(const Copy& c) {
  unsigned char bytes[16] = {};
  if (c.src_bytes > 0) global_read(bytes, c.src, static_cast<std::size_t>(c.src_bytes));
  shared_write(c.dst, bytes, sizeof bytes);
}

}  // namespace

void ldmatrix(unsigned* regs, int matrices, bool trans, const void* row) {
  const char* call = "ldmatrix.sync.aligned.m8n8.shared.b16";
  const int me = linear_thread(), lane = me % kLanes, first = me - lane;
  if (lane < 8 * matrices) {  // lanes past the matrices' rows give no address
    check_aligned16(call, "row", row);
    check_shared(call, row);
    profile::access(row, 16, false);  // each row is one 16-byte shared read
  }
  tl_rows[static_cast<std::size_t>(me)] = static_cast<const unsigned char*>(row);
  warp_call(WarpOp::ldmatrix, kFullWarp, 0, matrices * 2 + trans, kLanes);
  const int group = lane / 4, pair = lane % 4;
  for (int m = 0; m < matrices; ++m) {
    const unsigned char* const* rows = &tl_rows[static_cast<std::size_t>(first + 8 * m)];
    unsigned lo, hi;
    if (trans) {  // elements (2 pair, group) and (2 pair + 1, group)
      lo = read_b16(rows[2 * pair], group);
      hi = read_b16(rows[2 * pair + 1], group);
    } else {  // elements (group, 2 pair) and (group, 2 pair + 1)
      lo = read_b16(rows[group], 2 * pair);
      hi = read_b16(rows[group], 2 * pair + 1);
    }
    regs[m] = lo | hi << 16;
  }
  warp_call(WarpOp::ldmatrix, kFullWarp, 0, matrices * 2 + trans, kLanes);  // all lanes read
}

void mma_m16n8k16_bf16(float* d, const unsigned* a, const unsigned* b, const float* c) {
  const int me = linear_thread(), lane = me % kLanes, first = me - lane;
  const int parity = tl_mma_parity[static_cast<std::size_t>(me)] ^= 1;
  auto& table = tl_mma[static_cast<std::size_t>(parity)];
  MmaOperands& mine = table[static_cast<std::size_t>(me)];
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  warp_call(WarpOp::mma_sync, kFullWarp, 0, 0, kLanes);
  if (lane == 0) profile::tensor_op("m16n8k16.bf16", 2 * 16 * 8 * 16);
  // A(r, k): lane (r % 8) * 4 + (k % 8) / 2, element i = 2 [r >= 8] + 4 [k >= 8] + k % 2.
  const auto a_at = [&](int r, int k) {
    const int i = 2 * (r / 8) + 4 * (k / 8) + k % 2;
    const MmaOperands& o = table[static_cast<std::size_t>(first + (r % 8) * 4 + (k % 8) / 2)];
    return bf16_at(o.a[i / 2], i % 2);
  };
  // B(k, n): lane n * 4 + (k % 8) / 2, element i = 2 [k >= 8] + k % 2.
  const auto b_at = [&](int k, int n) {
    const int i = 2 * (k / 8) + k % 2;
    const MmaOperands& o = table[static_cast<std::size_t>(first + n * 4 + (k % 8) / 2)];
    return bf16_at(o.b[i / 2], i % 2);
  };
  const int group = lane / 4, pair = lane % 4;
  float result[4];
  for (int i = 0; i < 4; ++i) {  // D(groupID + 8 [i >= 2], 2 tig + i % 2)
    const int r = group + 8 * (i / 2), n = 2 * pair + i % 2;
    result[i] = tensor_core_dot(c[i], 16, [&](int k) { return a_at(r, k); },
                                [&](int k) { return b_at(k, n); });
  }
  std::memcpy(d, result, sizeof result);
}

void cp_async_16(void* dst_shared, const void* src_global, int src_bytes) {
  const char* call = "cp.async.cg.shared.global";
  check_aligned16(call, "shared destination", dst_shared);
  check_aligned16(call, "global source", src_global);
  check_shared(call, dst_shared);
  if (src_bytes < 0 || src_bytes > 16)
    thread_fault(std::string(call) + " with src-size " + std::to_string(src_bytes) +
                 " (0 to the copy's 16 bytes)");
  if (src_bytes > 0) {
    const auto r = find_region(src_global);
    if (!r || r->kind != MemoryKind::device ||
        static_cast<const char*>(src_global) + src_bytes > r->base + r->bytes)
      thread_fault(std::string(call) + ": the global source " + address(src_global) +
                   " is not " + std::to_string(src_bytes) + " bytes of device memory");
  }
  // The GPU's accesses, at issue: the source's bytes read (none for a zero-fill), 16 bytes
  // written into shared memory when the copy lands.
  unsigned read = 16;  // the access width that covers src_bytes (1, 2, 4, 8 or 16)
  while (read / 2 >= static_cast<unsigned>(std::max(src_bytes, 1))) read /= 2;
  if (src_bytes > 0) profile::access(src_global, read, false);
  profile::access(dst_shared, 16, true);
  AsyncCopies& mine = my_copies();
  auto* dst = static_cast<unsigned char*>(dst_shared);
  std::memset(dst, 0xff, 16);  // undefined until a wait covers the copy: NaN here
  mine.uncommitted.push_back({dst, static_cast<const unsigned char*>(src_global), src_bytes});
}

void cp_async_commit_group() {
  AsyncCopies& mine = my_copies();
  mine.groups.push_back(std::move(mine.uncommitted));
  mine.uncommitted.clear();
}

void cp_async_wait_group(int pending) {
  AsyncCopies& mine = my_copies();
  while (static_cast<int>(mine.groups.size()) > pending) {
    for (const Copy& c : mine.groups.front()) land(c);
    mine.groups.pop_front();
  }
}

}  // namespace cuda_emu::ptx
