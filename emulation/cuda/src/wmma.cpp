// The warp matrix operations of <mma.h> (nvcuda::wmma) on the emulated CUDA target.
//
// A fragment is a warp's 16x16 matrix spread over its 32 lanes, kElementsPerLane elements each.
// Which element a lane holds is unspecified on a GPU; here it is a fixed pseudo-random
// permutation per fragment kind (matrix_a, matrix_b, accumulator), so a kernel relying on any
// mapping gets wrong numbers. Loads and stores move each lane's own elements after the whole
// warp arrived (warp_call checks convergence and that the arguments are uniform); mma_sync
// needs the other lanes' elements: every lane publishes where its fragments are, the warp
// meets, each lane computes its own elements of d into a temporary, the warp meets again (so
// no lane changes a fragment another lane still reads), and each lane writes its d.
#include <mma.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emulator.hpp"
#include "profile.hpp"
#include "tensor_core.hpp"

namespace cuda_emu::wmma {
namespace {

constexpr int kDim = 16, kLanes = 32, kSlots = kLanes * kElementsPerLane;  // 256 = kDim * kDim
constexpr unsigned kFullWarp = 0xffffffffu;

// Where each element of a fragment kind lives: element e = r*16 + c (row and column of the
// matrix as used: a is M x K, b is K x N, the accumulator M x N) is x[slot % 8] of lane
// slot / 8, with slot = slot_of[e]; element_of is the inverse.
struct Mapping {
  std::array<int, kSlots> element_of{}, slot_of{};
};

Mapping make_mapping(unsigned seed) {
  Mapping m;
  for (int s = 0; s < kSlots; ++s) m.element_of[static_cast<std::size_t>(s)] = s;
  std::mt19937 rng(seed);
  std::shuffle(m.element_of.begin(), m.element_of.end(), rng);
  for (int s = 0; s < kSlots; ++s)
    m.slot_of[static_cast<std::size_t>(m.element_of[static_cast<std::size_t>(s)])] = s;
  return m;
}

const Mapping& mapping(Use use) {
  static const std::array<Mapping, 3> maps = {make_mapping(0x5eed0a), make_mapping(0x5eed0b),
                                              make_mapping(0x5eed0c)};
  return maps[static_cast<std::size_t>(use)];
}

const char* use_name(Use use) {
  switch (use) {
    case Use::matrix_a: return "matrix_a";
    case Use::matrix_b: return "matrix_b";
    case Use::accumulator: return "accumulator";
  }
  return "fragment";
}

int linear_thread() {
  const uint3& t = thread_idx();
  const dim3& d = block_dim();
  return static_cast<int>((t.z * d.y + t.y) * d.x + t.x);
}

// CUDA: "mptr must be a 256-bit aligned pointer", "ldm must be a multiple of 8 for __half
// element type or multiple of 4 for float element type" (16 bytes either way).
void check_arguments(const char* call, Use use, const void* ptr, unsigned ldm,
                     std::size_t element_bytes) {
  if (reinterpret_cast<std::uintptr_t>(ptr) % 32 != 0) {
    char p[32];
    std::snprintf(p, sizeof p, "%p", ptr);
    thread_fault(std::string(call) + " of the " + use_name(use) + " fragment at " + p +
                 ", which is not 256-bit (32-byte) aligned (a GPU requires it)");
  }
  if (ldm * element_bytes % 16 != 0 || ldm < kDim)
    thread_fault(std::string(call) + " of the " + use_name(use) + " fragment with ldm " +
                 std::to_string(ldm) + " (a GPU requires a multiple of 16 bytes, at least 16 " +
                 "elements)");
}

// The warp-uniform arguments of a load or store as warp_call's value and arg.
std::uint64_t pointer_bits(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
int layout_arg(unsigned ldm, bool col_major) { return static_cast<int>(ldm * 2 + col_major); }

std::size_t offset(int element, unsigned ldm, bool col_major) {
  const std::size_t r = static_cast<std::size_t>(element / kDim);
  const std::size_t c = static_cast<std::size_t>(element % kDim);
  return col_major ? c * ldm + r : r * ldm + c;
}

// The kernel counts (profile.hpp) of a load or store: the accesses a GPU makes, not the
// emulation's. sm_80 and later build a 16x16x16 bf16 fragment from the mma.m16n8k16 fragments
// the PTX ISA documents ("Matrix Fragments for mma.m16n8k16": lane = 4 * group + t; a and the
// accumulator hold rows group and group + 8, columns 2t, 2t + 1 and those + 8; b holds rows
// 2t, 2t + 1 and those + 8, columns group and group + 8), register by register, a 32-bit access
// per register (nvcc's generic LD/ST for wmma, as its SASS shows): two bf16 of a row (or of a
// column-major b's column) that are adjacent in memory are one 4-byte access, otherwise two
// 2-byte ones; an fp32 element is one 4-byte access.
void count_fragment_accesses(Use use, const void* ptr, unsigned ldm, bool col_major,
                             bool is_store) {
  if (!profile::on()) return;
  const int lane = linear_thread() % kLanes, group = lane / 4, t = lane % 4;
  const std::size_t bytes = use == Use::accumulator ? sizeof(float) : sizeof(__nv_bfloat16);
  const auto address = [&](int i) {  // element i of the lane's fragment (register i / 2 or i)
    const int along = 2 * t + (i & 1) + 8 * (i >> 1 & 1), across = group + 8 * (i >> 2);
    const bool b = use == Use::matrix_b;
    const int row = b ? along : group + 8 * (i >> 1 & 1);
    const int col = b ? across : 2 * t + (i & 1) + 8 * (i >> 2);
    return static_cast<const char*>(ptr) + offset(row * kDim + col, ldm, col_major) * bytes;
  };
  for (int i = 0; i < kElementsPerLane; ++i) {
    const char* p = address(i);
    const bool pair = bytes == sizeof(__nv_bfloat16) && (i & 1) == 0 &&
                      address(i + 1) == p + bytes && reinterpret_cast<std::uintptr_t>(p) % 4 == 0;
    profile::access(p, pair ? 4 : static_cast<unsigned>(bytes), is_store);
    if (pair) ++i;
  }
}

// Where each lane of the running block put its mma operands (published before the warp meets).
struct Operands {
  const __nv_bfloat16* a = nullptr;
  const __nv_bfloat16* b = nullptr;
};
thread_local std::vector<Operands> tl_operands(1024);

}  // namespace

void load(Use use, void* x, const void* ptr, unsigned ldm, bool col_major) {
  const std::size_t bytes = use == Use::accumulator ? sizeof(float) : sizeof(__nv_bfloat16);
  check_arguments("nvcuda::wmma::load_matrix_sync", use, ptr, ldm, bytes);
  warp_call(WarpOp::wmma_load, kFullWarp, pointer_bits(ptr), layout_arg(ldm, col_major), kLanes);
  count_fragment_accesses(use, ptr, ldm, col_major, false);
  const int lane = linear_thread() % kLanes;
  const Mapping& m = mapping(use);
  for (int i = 0; i < kElementsPerLane; ++i) {
    const int e = m.element_of[static_cast<std::size_t>(lane * kElementsPerLane + i)];
    std::memcpy(static_cast<char*>(x) + i * bytes,
                static_cast<const char*>(ptr) + offset(e, ldm, col_major) * bytes, bytes);
  }
}

void store(float* ptr, const float* x, unsigned ldm, bool col_major) {
  check_arguments("nvcuda::wmma::store_matrix_sync", Use::accumulator, ptr, ldm, sizeof(float));
  warp_call(WarpOp::wmma_store, kFullWarp, pointer_bits(ptr), layout_arg(ldm, col_major),
            kLanes);
  count_fragment_accesses(Use::accumulator, ptr, ldm, col_major, true);
  const int lane = linear_thread() % kLanes;
  const Mapping& m = mapping(Use::accumulator);
  for (int i = 0; i < kElementsPerLane; ++i) {
    const int e = m.element_of[static_cast<std::size_t>(lane * kElementsPerLane + i)];
    ptr[offset(e, ldm, col_major)] = x[i];
  }
}

void mma(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c) {
  const int me = linear_thread(), lane = me % kLanes, first = me - lane;
  tl_operands[static_cast<std::size_t>(me)] = {a, b};
  warp_call(WarpOp::wmma_mma, kFullWarp, 0, 0, kLanes);  // every lane published its operands
  if (lane == 0) profile::tensor_op("m16n16k16.bf16", 2 * kDim * kDim * kDim);
  const Mapping &ma = mapping(Use::matrix_a), &mb = mapping(Use::matrix_b),
                &mc = mapping(Use::accumulator);
  const auto element = [&](const Mapping& m, bool is_a, int r, int col) {
    const int s = m.slot_of[static_cast<std::size_t>(r * kDim + col)];
    const Operands& o = tl_operands[static_cast<std::size_t>(first + s / kElementsPerLane)];
    return __bfloat162float((is_a ? o.a : o.b)[s % kElementsPerLane]);
  };
  float result[kElementsPerLane];
  for (int i = 0; i < kElementsPerLane; ++i) {
    const int e = mc.element_of[static_cast<std::size_t>(lane * kElementsPerLane + i)];
    const int r = e / kDim, col = e % kDim;
    result[i] = tensor_core_dot(c[i], kDim, [&](int k) { return element(ma, true, r, k); },
                                [&](int k) { return element(mb, false, k, col); });
  }
  warp_call(WarpOp::wmma_mma, kFullWarp, 0, 0, kLanes);  // every lane read every operand
  std::memcpy(d, result, sizeof result);
}

}  // namespace cuda_emu::wmma
