#pragma once
// Kernel counts of the emulated CUDA target (PDTRAIN_CUDA_EMU_PROFILE=DIR; profile.cpp,
// docs/cuda-emulation.md "Kernel counts"): per kernel, the warp-level shared-memory requests and
// wavefronts, global requests and 32-byte sectors, the distinct device bytes each launch
// touched, tensor-core operations by shape and barriers: what a GPU's memory pipelines would
// see of the kernel's accesses.
//
// Where the accesses come from: kernel code's own loads and stores reach access() through
// clang's -fsanitize-coverage=trace-loads,trace-stores callbacks in the profiling build
// (scripts/build-cuda-profile.sh); memory primitives the runtime implements (nvcuda::wmma's
// load_matrix_sync / store_matrix_sync, and any later one: ldmatrix, cp.async) are not
// instrumented, so they call access() themselves, once per lane, with the accesses a GPU makes,
// and tensor_op() once per warp for each tensor-core operation.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace cuda_emu {
struct LaunchConfig;
}

namespace cuda_emu::profile {

// Whether kernel counts are being collected (PDTRAIN_CUDA_EMU_PROFILE names a directory).
bool on();

// What a kernel's launches counted (one row of the table, summed over its launches).
struct KernelCounts {
  std::uint64_t launches = 0, threads = 0;
  std::uint64_t shared_requests = 0, shared_wavefronts = 0, shared_ideal_wavefronts = 0;
  std::uint64_t global_requests = 0, global_sectors = 0, global_ideal_sectors = 0;
  std::uint64_t dram_bytes = 0;  // per launch: its distinct device sectors x 32 bytes
  std::uint64_t barriers = 0;    // __syncthreads passed, once per block
  std::uint64_t tensor_flops = 0;
  std::map<std::string, std::uint64_t> tensor_ops;  // by shape
};
// The counts so far of the kernel launched as `name` (all block sizes), for tests.
KernelCounts counted(const std::string& name);

// ---- The API for runtime-implemented primitives (called from the running kernel thread).
// One access of the running lane: `bytes` (1, 2, 4, 8 or 16) at `address`, a store or a load.
// Classified by address: the running block's shared memory (static __shared__ and dynamic),
// device (or pinned) allocations (global), or anything else (the thread's stack, the kernel's
// arguments), which is not counted. The k-th shared (or global) access of each lane between two
// synchronization points of its warp (__syncthreads, a warp call) is one warp-level request.
void access(const void* address, unsigned bytes, bool is_store);
// One 8- or 16-byte access of a vector whose components the CPU compiler loads or stores one
// by one (cuda_emu::vector_access, which kernel code calls through common.cuh's loads and
// stores): counted as one access; the component accesses that follow are absorbed.
void vector_access(const void* address, unsigned bytes, bool is_store);
// One tensor-core operation of the running warp (call it from one lane only), e.g.
// tensor_op("m16n16k16.bf16", 2 * 16 * 16 * 16).
void tensor_op(const char* shape, std::uint64_t flops);

// ---- The scheduler's hooks (kernels.cpp): the worker thread that runs a launch calls these.
void launch_begins(const LaunchConfig& config);
// The launch's counts are complete (a no-op when none is being counted: the race check's second
// run of a launch is not counted, as PDTRAIN_CUDA_EMU_COUNTS does not count it).
void launch_ends();
// A block begins: its thread count, its dynamic shared memory (the launch's shared_bytes), and
// the scheduler's own thread-local record, which kernel code reads (blockIdx, blockDim) but
// which is no shared memory although it lies among the static __shared__ variables.
void block_begins(int threads, const void* dynamic_shared, const void* runtime_record,
                  std::size_t runtime_record_bytes);
void block_ends();
// The running thread `linear` passed a synchronization point (a __syncthreads when `barrier`,
// else a warp call) or ended.
void thread_synchronized(int linear, bool barrier);
void thread_ended(int linear);

}  // namespace cuda_emu::profile
