#pragma once
// The emulated CUDA target's device side (a test tool: never in the production pdtrain): what
// a .cu file of pdtrain needs, compiled by the host compiler as C++. Each block of a launch
// runs its threads as fibers on the stream's worker thread (emulation/cuda/src/kernels.cpp),
// switching at every __syncthreads and warp-level call, which the emulation checks as a GPU
// would require them to be used: a barrier some threads never reach, a warp call whose mask
// does not hold the calling lane or names a lane that never joins, a shuffle reading a lane
// outside its mask: each is a fault naming the kernel, sticky on the device as on a GPU.
//
// Launches: the sources write PDTRAIN_LAUNCH(kernel, grid, block, shared_bytes, stream)(args)
// (src/kernels/cuda/common.cuh), which is kernel<<<...>>>(args) under nvcc and
// PDTRAIN_CUDA_EMU_LAUNCH here. The launch is checked as a GPU checks it (at most 1024
// threads, block z <= 64, grid y and z <= 65535, dynamic shared memory <= 48 KiB or the kernel's
// cudaFuncAttributeMaxDynamicSharedMemorySize): a launch a
// GPU refuses sets cudaErrorInvalidConfiguration / cudaErrorInvalidValue and runs nothing.
//
// Shared memory: `__shared__` is a static thread_local: a worker thread runs one block at a
// time, so a block's threads (fibers of that thread) share it and no other running block does.
// Its 48 KiB static limit is nvcc's to check (the real CUDA build, build.cuda_backend).
#include <cuda_runtime_api.h>
#include <math.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static thread_local

constexpr int warpSize = 32;

namespace cuda_emu {

// ---------------------------------------------------------------------------------------------
// Launches.

// One launch's kernel with its arguments (copied at the launch, as a GPU copies them to the
// parameter space); every thread runs run_thread() on its own copy of them.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run_thread() const = 0;
  // The arguments' bytes: the race check scans them for pointers into device memory (the
  // allocations a kernel may write).
  virtual std::span<const std::byte> argument_bytes() const = 0;
};

struct LaunchConfig {
  const char* name;
  dim3 grid, block;
  std::size_t shared_bytes;
  cudaStream_t stream;
  const void* func = nullptr;  // the kernel function (its cudaFuncSetAttribute limits)
};

// A kernel's address as cudaFuncSetAttribute names it (a function, or a pointer to one).
template <class F>
const void* kernel_address(F* f) {
  return reinterpret_cast<const void*>(f);
}

// Checks the configuration and queues the kernel on the stream (emulation/cuda/src/kernels.cpp).
void launch(const LaunchConfig& config, std::shared_ptr<const Kernel> kernel);

template <class Body, class Args>
class BoundKernel final : public Kernel {
 public:
  BoundKernel(Body body, Args args) : body_(body), args_(std::move(args)) {}
  void run_thread() const override { std::apply(body_, args_); }
  std::span<const std::byte> argument_bytes() const override {
    return {reinterpret_cast<const std::byte*>(&args_), sizeof args_};
  }

 private:
  Body body_;
  Args args_;
};

template <class Body>
struct Launcher {
  LaunchConfig config;
  Body body;
  template <class... A>
  void operator()(A&&... a) const {
    auto args = std::make_tuple(std::decay_t<A>(std::forward<A>(a))...);
    launch(config, std::make_shared<BoundKernel<Body, decltype(args)>>(body, std::move(args)));
  }
};
template <class Body>
Launcher(LaunchConfig, Body) -> Launcher<Body>;

// ---------------------------------------------------------------------------------------------
// The running thread's coordinates and its block's synchronization (kernels.cpp).
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void* dynamic_shared();  // the block's dynamic shared memory (the launch's shared_bytes)

void sync_threads();

// One 8- or 16-byte access of a vector (float4, uint2, ...) by the running thread, as a GPU makes
// it (LDG.128, STS.64, ...), for the kernel counts (profile.cpp): the CPU compiler splits a
// vector copy into its components, whose coverage callbacks this access then absorbs.
void vector_access(const void* p, unsigned bytes, bool is_store);

enum class WarpOp { shfl_idx, shfl_xor, shfl_down, shfl_up, ballot, sync, wmma_load, wmma_store,
                    wmma_mma, ldmatrix, mma_sync };
// A warp-level call of the running lane: waits until every lane of `mask` made the same call,
// then returns this lane's result (the value read for shuffles, the ballot's bits). The wmma
// calls (<mma.h>, emulation/cuda/src/wmma.cpp) and the PTX ones (ldmatrix, mma.sync:
// <cuda_emu_ptx.h>, emulation/cuda/src/ptx.cpp) pass their warp-uniform arguments as `value`
// and `arg`: lanes that pass different ones are a fault.
std::uint64_t warp_call(WarpOp op, unsigned mask, std::uint64_t value, int arg, int width);

template <class T>
T shuffle(WarpOp op, unsigned mask, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  bits = warp_call(op, mask, bits, arg, width);
  T r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

}  // namespace cuda_emu

#define PDTRAIN_CUDA_EMU_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  PDTRAIN_CUDA_EMU_LAUNCH_AS(#kernel, kernel, grid, block, shared_bytes, stream)
// The same launch called `name` (a string that outlives the launch, e.g. a literal).
#define PDTRAIN_CUDA_EMU_LAUNCH_AS(name, kernel, grid, block, shared_bytes, stream)          \
  PDTRAIN_CUDA_EMU_LAUNCH_CONFIG(                                                          \
      (::cuda_emu::LaunchConfig{(name), dim3(grid), dim3(block), (shared_bytes), (stream)}), \
      kernel)
// A launch of `kernel` naming one function (a complete template-id: its address is taken), so
// that the launch check finds the limit cudaFuncSetAttribute gave it: the launch of a kernel
// with more than 48 KiB of dynamic shared memory (which a launch without it is refused).
#define PDTRAIN_CUDA_EMU_LAUNCH_FUNC(kernel, grid, block, shared_bytes, stream)               \
  PDTRAIN_CUDA_EMU_LAUNCH_CONFIG((::cuda_emu::LaunchConfig{#kernel, dim3(grid), dim3(block),  \
                                                           (shared_bytes), (stream),         \
                                                           ::cuda_emu::kernel_address(kernel)}), \
                                 kernel)
#define PDTRAIN_CUDA_EMU_LAUNCH_CONFIG(config, kernel) \
  ::cuda_emu::Launcher {                               \
    config, [=](auto... pdtrain_emu_args_) { kernel(pdtrain_emu_args_...); } \
  }

// cudaFuncSetAttribute on a kernel function itself, as CUDA's C++ overload takes it.
template <class T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

// The block's dynamic shared memory as `type* name` (extern __shared__ type name[] under nvcc).
#define PDTRAIN_CUDA_EMU_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::cuda_emu::dynamic_shared())

// Kernel code (src/kernels/cuda/common.cuh's loads and stores) names its vector accesses.
#define PDTRAIN_CUDA_EMU_VECTOR_ACCESS(p, bytes, is_store) \
  ::cuda_emu::vector_access((p), (bytes), (is_store))

#define threadIdx (::cuda_emu::thread_idx())
#define blockIdx (::cuda_emu::block_idx())
#define blockDim (::cuda_emu::block_dim())
#define gridDim (::cuda_emu::grid_dim())

// ---------------------------------------------------------------------------------------------
// Device intrinsics. Arithmetic is the host's IEEE arithmetic (the project builds with
// -ffp-contract=off): the _rn intrinsics are exact equivalents; expf, logf and the like are
// the host C library's, not CUDA's (which differ by up to 2 ulp: docs/cuda-emulation.md).
inline void __syncthreads() { cuda_emu::sync_threads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  cuda_emu::warp_call(cuda_emu::WarpOp::sync, mask, 0, 0, warpSize);
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) {
  return cuda_emu::shuffle(cuda_emu::WarpOp::shfl_idx, mask, v, src_lane, width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  return cuda_emu::shuffle(cuda_emu::WarpOp::shfl_xor, mask, v, lane_mask, width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return cuda_emu::shuffle(cuda_emu::WarpOp::shfl_down, mask, v, static_cast<int>(delta), width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return cuda_emu::shuffle(cuda_emu::WarpOp::shfl_up, mask, v, static_cast<int>(delta), width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(
      cuda_emu::warp_call(cuda_emu::WarpOp::ballot, mask, predicate != 0, 0, warpSize));
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) == mask;
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __expf(float a) { return expf(a); }
inline float __logf(float a) { return logf(a); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
inline unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }
inline float __uint_as_float(unsigned x) { return __builtin_bit_cast(float, x); }
inline int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
inline float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
template <class T>
T __ldg(const T* p) {
  return *p;
}
