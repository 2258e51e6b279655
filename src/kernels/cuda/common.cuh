#pragma once
// Device helpers shared by the CUDA kernels (device code only: included by the .cu files).
//
// Reductions here are deterministic: a warp sums in a fixed butterfly, a block adds its warps'
// sums in a fixed butterfly, so the result depends on the block size and the data only (never
// on timing), and every thread of the warp / block gets the same bits.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "cuda_check.hpp"
#include "pdtrain/core/bf16.hpp"

namespace pdtrain::kernels::cuda {

using Index = std::int64_t;

// A kernel launch: kernel<<<grid, block, shared_bytes, stream>>> under nvcc; on the emulated
// CUDA target (emulation/cuda) the same launch queued for the CPU's fibers.
// PDTRAIN_LAUNCH_AS names the launch (for the emulation's fault messages and work counts) where
// `kernel` is a variable, e.g. a function pointer handed to a launcher.
// PDTRAIN_LAUNCH_FUNC is the launch of a kernel whose dynamic shared memory may pass 48 KiB
// (after cudaFuncSetAttribute): `kernel` names one function, whose limit the emulation checks.
#ifdef PDTRAIN_CUDA_EMULATED
#define PDTRAIN_LAUNCH_FUNC(kernel, grid, block, shared_bytes, stream) \
  PDTRAIN_CUDA_EMU_LAUNCH_FUNC(kernel, grid, block, shared_bytes, stream)
#define PDTRAIN_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  PDTRAIN_CUDA_EMU_LAUNCH_AS(#kernel, kernel, grid, block, shared_bytes, stream)
#define PDTRAIN_LAUNCH_AS(name, kernel, grid, block, shared_bytes, stream) \
  PDTRAIN_CUDA_EMU_LAUNCH_AS(name, kernel, grid, block, shared_bytes, stream)
#else
#define PDTRAIN_LAUNCH_FUNC(kernel, grid, block, shared_bytes, stream) \
  kernel<<<grid, block, shared_bytes, stream>>>
#define PDTRAIN_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  kernel<<<grid, block, shared_bytes, stream>>>
#define PDTRAIN_LAUNCH_AS(name, kernel, grid, block, shared_bytes, stream) \
  kernel<<<grid, block, shared_bytes, stream>>>
#endif
// One 8- or 16-byte access of the vector at p, as a GPU makes it: the emulation's kernel counts
// take it whole, which the CPU compiler splits into its components (docs/cuda-emulation.md).
#ifndef PDTRAIN_CUDA_EMU_VECTOR_ACCESS
#define PDTRAIN_CUDA_EMU_VECTOR_ACCESS(p, bytes, is_store)
#endif

// The block's dynamic shared memory (the launch's shared_bytes) as `type* name`, 16-byte
// aligned.
#ifdef PDTRAIN_CUDA_EMULATED
#define PDTRAIN_DYNAMIC_SHARED(type, name) PDTRAIN_CUDA_EMU_DYNAMIC_SHARED(type, name)
#else
#define PDTRAIN_DYNAMIC_SHARED(type, name)                                  \
  extern __shared__ __align__(16) unsigned char pdtrain_dynamic_shared_[]; \
  type* name = reinterpret_cast<type*>(pdtrain_dynamic_shared_)
#endif

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kBlock = 256;       // threads per block of the grid-stride and row kernels
constexpr Index kMaxGrid = 4096;  // blocks of a grid-stride loop (enough to fill an H200)

inline Index ceil_div(Index a, Index b) { return (a + b - 1) / b; }

// Blocks of `block` threads for a grid-stride loop over `work` items (work > 0).
inline unsigned grid_for(Index work, int block = kBlock) {
  const Index blocks = ceil_div(work, block);
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

// Whether p is aligned to `bytes` (vector loads and stores need 16 or 8).
inline bool aligned(const void* p, unsigned bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

__device__ __forceinline__ Index global_thread() {
  return Index(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ Index grid_threads() { return Index(gridDim.x) * blockDim.x; }

// Sum over the 32 lanes of a warp (all lanes active): a butterfly, then lane 0's value for
// every lane, so all lanes hold the same bits.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return __shfl_sync(kFullMask, v, 0);
}

// Max over the 32 lanes of a warp (exact in any order).
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return __shfl_sync(kFullMask, v, 0);
}

// Sum over the threads of a block (blockDim.x a multiple of 32, at most 1024; every thread
// calls it). `shared` holds kWarp floats. Each warp sums its lanes, then every warp sums the
// warps' sums in the same order, so every thread returns the same bits.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by the previous block reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? shared[lane] : 0.0f);
}

// Max over the threads of a block, as block_sum (-FLT_MAX for lanes without a warp: the CPU
// kernels' max starts from the lowest float too).
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? shared[lane] : -FLT_MAX);
}

// Four floats rounded to bf16 (core/bf16.hpp's rounding) as the 8 bytes they occupy in memory,
// the first at the lowest address: one 8-byte store.
__device__ __forceinline__ uint2 pack_bf16x4(float4 v) {
  const auto bits = [](float x) { return static_cast<unsigned>(pdtrain::to_bf16(x).bits); };
  return make_uint2(bits(v.x) | bits(v.y) << 16, bits(v.z) | bits(v.w) << 16);
}

// Loads and stores of fp32 or bf16 arrays in fp32 registers, four elements (at index 4i .. 4i+3:
// one 16- or 8-byte access, the caller checked the alignment) or one at a time, so one kernel
// template serves either element type; stores round with core/bf16.hpp's rounding.
__device__ __forceinline__ float4 load4(const float* p, Index i) {
  PDTRAIN_CUDA_EMU_VECTOR_ACCESS(reinterpret_cast<const float4*>(p) + i, sizeof(float4), false);
  return reinterpret_cast<const float4*>(p)[i];
}
__device__ __forceinline__ float4 load4(const bf16* p, Index i) {
  PDTRAIN_CUDA_EMU_VECTOR_ACCESS(reinterpret_cast<const uint2*>(p) + i, sizeof(uint2), false);
  const uint2 u = reinterpret_cast<const uint2*>(p)[i];
  const auto f = [](unsigned bits) { return __uint_as_float(bits << 16); };
  return make_float4(f(u.x & 0xffffu), f(u.x >> 16), f(u.y & 0xffffu), f(u.y >> 16));
}
__device__ __forceinline__ float load1(const float* p, Index i) { return p[i]; }
__device__ __forceinline__ float load1(const bf16* p, Index i) { return pdtrain::to_float(p[i]); }
__device__ __forceinline__ void store4(float* p, Index i, float4 v) {
  PDTRAIN_CUDA_EMU_VECTOR_ACCESS(reinterpret_cast<float4*>(p) + i, sizeof(float4), true);
  reinterpret_cast<float4*>(p)[i] = v;
}
__device__ __forceinline__ void store4(bf16* p, Index i, float4 v) {
  const uint2 packed = pack_bf16x4(v);
  PDTRAIN_CUDA_EMU_VECTOR_ACCESS(reinterpret_cast<uint2*>(p) + i, sizeof(uint2), true);
  reinterpret_cast<uint2*>(p)[i] = packed;
}
__device__ __forceinline__ void store1(float* p, Index i, float v) { p[i] = v; }
__device__ __forceinline__ void store1(bf16* p, Index i, float v) { p[i] = pdtrain::to_bf16(v); }
// The alignment four elements of T at a time need (16 bytes of fp32, 8 of bf16).
template <class T>
bool vector_aligned(const T* p) {
  return aligned(p, 4 * sizeof(T));
}

// Element-wise work over [0, n) in a grid-stride loop: with kVec, four elements at a time
// (vec4(i) handles elements 4i .. 4i+3; the caller checked the alignment its vector loads and
// stores need), then the tail one at a time (one(i)); without kVec, one at a time throughout.
template <bool kVec, class Vec4, class One>
__device__ __forceinline__ void for_each_element(Index n, Vec4 vec4, One one) {
  const Index start = global_thread(), stride = grid_threads();
  const Index n4 = kVec ? n / 4 : 0;
  for (Index i = start; i < n4; i += stride) vec4(i);
  for (Index i = 4 * n4 + start; i < n; i += stride) one(i);
}

// Launches the element-wise kernel `name` over n elements (nothing when n = 0): vec (the
// kVec = true instantiation, four elements at a time) when the pointers' alignment allows
// vector access, else scalar (kVec = false); args are the kernel's arguments.
template <class... Params, class... Args>
void launch_elementwise(const char* name, cudaStream_t stream, Index n, bool vector_ok,
                        void (*vec)(Params...), void (*scalar)(Params...), Args... args) {
  (void)name;  // under nvcc the launch has no name
  if (n <= 0) return;
  if (vector_ok)
    PDTRAIN_LAUNCH_AS(name, vec, grid_for(ceil_div(n, 4)), kBlock, 0, stream)(args...);
  else
    PDTRAIN_LAUNCH_AS(name, scalar, grid_for(n), kBlock, 0, stream)(args...);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pdtrain::kernels::cuda
