// The emulated CUDA target's runtime (emulation/cuda): that it runs kernels as a GPU would
// (barriers, shuffles, blocks), refuses what a GPU refuses, reports what a GPU would hang on or
// leave undefined as a fault naming the kernel, orders streams only through events, and checks
// copies and memory kinds. Run by ctest with PDTRAIN_CUDA_EMU_GPUS=8 (a fault is sticky on its
// device, so each fault test takes a device of its own), PDTRAIN_CUDA_EMU_MEMORY=1G and the race
// check on.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "fault_on.hpp"

namespace {

// ---- kernels

// out[block] = sum of in[block * blockDim.x + t] over the block's threads: warp butterflies,
// then warp 0 adds the warps' sums (the pattern of src/kernels/cuda/common.cuh).
__global__ void block_sums(float* out, const float* in) {
  __shared__ float warps[32];
  const unsigned t = threadIdx.x;
  float v = in[blockIdx.x * blockDim.x + t];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (t % 32 == 0) warps[t / 32] = v;
  __syncthreads();
  if (t < 32) {
    float w = t < blockDim.x / 32 ? warps[t] : 0.0f;
    for (int o = 16; o > 0; o /= 2) w += __shfl_down_sync(0xffffffffu, w, o);
    if (t == 0) out[blockIdx.x] = w;
  }
}

// Each thread writes its index into shared memory and reads its neighbour's: with the barrier
// the neighbour has written; without it (a planted bug) it depends on the order threads ran in.
template <bool kBarrier>
__global__ void neighbour(int* out) {
  __shared__ int slots[256];
  const unsigned t = threadIdx.x;
  slots[t] = static_cast<int>(t) * 3 + 1;
  if (kBarrier) __syncthreads();
  out[t] = slots[(t + 1) % blockDim.x];
}

__global__ void early_exit_before_barrier(int* out) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_outside_mask(int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, static_cast<int>(threadIdx.x), 20);
}

__global__ void mask_without_caller(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000fffeu, 1, 1);
}

__global__ void ballot_and_grid(unsigned* out) {
  const unsigned b = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0);
  if (threadIdx.x == 0)
    out[blockIdx.y * gridDim.x + blockIdx.x] = b ^ (blockIdx.x * 100 + blockIdx.y);
}

__global__ void read_value(int* out, const int* in) { *out = *in; }

__global__ void never_runs(int* out) { *out = 1; }

// ---- helpers

template <class T>
T* device_copy(const std::vector<T>& h) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(p);
}

template <class T>
std::vector<T> host_copy(const T* p, std::size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

bool race_check_on() {
  const char* v = std::getenv("PDTRAIN_CUDA_EMU_RACECHECK");
  return v != nullptr && std::string(v) == "1";
}

// ---- tests

TEST(EmulatedKernels, BarriersAndShufflesGiveTheBlockSums) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const int blocks = 5, threads = 256;
  std::vector<float> in(blocks * threads);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 97) - 40.0f;
  float* d_in = device_copy(in);
  float* d_out = device_copy(std::vector<float>(blocks, 0.0f));
  PDTRAIN_CUDA_EMU_LAUNCH(block_sums, blocks, threads, 0, nullptr)(d_out, d_in);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> out = host_copy(d_out, blocks);
  for (int b = 0; b < blocks; ++b) {
    double sum = 0;
    for (int t = 0; t < threads; ++t) sum += in[b * threads + t];
    EXPECT_EQ(out[b], static_cast<float>(sum)) << "block " << b;  // small integers: exact
  }
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST(EmulatedKernels, BallotAndTwoDimensionalGrids) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  unsigned* out = device_copy(std::vector<unsigned>(6, 0));
  PDTRAIN_CUDA_EMU_LAUNCH(ballot_and_grid, dim3(3, 2), 32, 0, nullptr)(out);
  const std::vector<unsigned> got = host_copy(out, 6);
  unsigned every_third = 0;
  for (int lane = 0; lane < 32; lane += 3) every_third |= 1u << lane;
  for (unsigned y = 0; y < 2; ++y)
    for (unsigned x = 0; x < 3; ++x) EXPECT_EQ(got[y * 3 + x], every_third ^ (x * 100 + y));
  cudaFree(out);
}

TEST(EmulatedKernels, ALaunchAGpuRefusesRunsNothing) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* out = device_copy(std::vector<int>{0});
  testing::internal::CaptureStderr();
  PDTRAIN_CUDA_EMU_LAUNCH(never_runs, 1, 1025, 0, nullptr)(out);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  PDTRAIN_CUDA_EMU_LAUNCH(never_runs, dim3(1, 65536), 32, 0, nullptr)(out);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  PDTRAIN_CUDA_EMU_LAUNCH(never_runs, 1, dim3(1, 1, 65), 0, nullptr)(out);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  PDTRAIN_CUDA_EMU_LAUNCH(never_runs, 1, 32, 48 * 1024 + 1, nullptr)(out);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("launch of never_runs"), std::string::npos) << printed;
  EXPECT_EQ(host_copy(out, 1)[0], 0) << "a refused launch ran";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "launch errors are not sticky";
  cudaFree(out);
}

TEST(EmulatedKernels, ABarrierSomeThreadsNeverReachIsAFaultNamingTheKernel) {
  cudaError_t error = cudaSuccess;
  const std::string printed = fault_on<int>(1, [](int* out) {
    PDTRAIN_CUDA_EMU_LAUNCH(early_exit_before_barrier, 2, 64, 0, nullptr)(out);
  }, &error);
  EXPECT_EQ(error, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel early_exit_before_barrier"), std::string::npos) << printed;
  EXPECT_NE(printed.find("63 of its 64 threads wait at __syncthreads, 1 exited"),
            std::string::npos) << printed;
}

TEST(EmulatedKernels, AShuffleReadingALaneOutsideItsMaskIsAFault) {
  cudaError_t error = cudaSuccess;
  const std::string printed = fault_on<int>(2, [](int* out) {
    PDTRAIN_CUDA_EMU_LAUNCH(shuffle_outside_mask, 1, 32, 0, nullptr)(out);
  }, &error);
  EXPECT_NE(error, cudaSuccess);
  EXPECT_NE(printed.find("kernel shuffle_outside_mask"), std::string::npos) << printed;
  EXPECT_NE(printed.find("reads lane 20, outside the mask 0x0000ffff"), std::string::npos)
      << printed;
}

TEST(EmulatedKernels, AWarpCallWhoseMaskLacksTheCallerIsAFault) {
  cudaError_t error = cudaSuccess;
  const std::string printed = fault_on<int>(3, [](int* out) {
    PDTRAIN_CUDA_EMU_LAUNCH(mask_without_caller, 1, 32, 0, nullptr)(out);
  }, &error);
  EXPECT_NE(error, cudaSuccess);
  EXPECT_NE(printed.find("which does not hold the calling lane"), std::string::npos) << printed;
}

// The race check: with the barrier the result is the same in every order; without it (the
// planted missing __syncthreads) the two runs of the launch differ and the device faults.
TEST(EmulatedKernels, TheRaceCheckFindsAMissingSyncthreads) {
  ASSERT_TRUE(race_check_on()) << "run with PDTRAIN_CUDA_EMU_RACECHECK=1 (ctest does)";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* out = device_copy(std::vector<int>(256, 0));
  PDTRAIN_CUDA_EMU_LAUNCH(neighbour<true>, 1, 256, 0, nullptr)(out);
  const std::vector<int> got = host_copy(out, 256);
  for (int t = 0; t < 256; ++t) EXPECT_EQ(got[t], ((t + 1) % 256) * 3 + 1);
  cudaFree(out);

  cudaError_t error = cudaSuccess;
  const std::string printed = fault_on<int>(4, [](int* o) {
    PDTRAIN_CUDA_EMU_LAUNCH(neighbour<false>, 1, 256, 0, nullptr)(o);
  }, &error);
  EXPECT_EQ(error, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel neighbour<false>: two runs in different orders"),
            std::string::npos)
      << printed;
}

// Streams run at the same time: work on one stream sees another stream's copy only when an
// event orders it after that copy.
TEST(EmulatedStreams, OnlyAnEventOrdersOneStreamAfterAnother) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t copy = nullptr, compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  int* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(int)), cudaSuccess);
  *pinned = 7;
  int* value = device_copy(std::vector<int>{0});
  int* seen = device_copy(std::vector<int>{-1});
  static std::atomic<bool> release{false};
  const auto hold = [](void*) {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  };

  for (bool with_event : {false, true}) {
    release = false;
    ASSERT_EQ(cudaMemset(value, 0, sizeof(int)), cudaSuccess);
    ASSERT_EQ(cudaLaunchHostFunc(copy, hold, nullptr), cudaSuccess);  // the copy stream is busy
    ASSERT_EQ(cudaMemcpyAsync(value, pinned, sizeof(int), cudaMemcpyHostToDevice, copy),
              cudaSuccess);
    cudaEvent_t copied = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(copied, copy), cudaSuccess);
    if (with_event) {
      ASSERT_EQ(cudaStreamWaitEvent(compute, copied, 0), cudaSuccess);
    }
    PDTRAIN_CUDA_EMU_LAUNCH(read_value, 1, 1, 0, compute)(seen, value);
    if (!with_event) {
      ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    }
    EXPECT_EQ(cudaEventQuery(copied), cudaErrorNotReady);
    release = true;
    ASSERT_EQ(cudaEventSynchronize(copied), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    EXPECT_EQ(host_copy(seen, 1)[0], with_event ? 7 : 0)
        << (with_event ? "the wait did not order the read after the copy"
                       : "the streams did not run independently");
    cudaEventDestroy(copied);
  }
  cudaFree(value);
  cudaFree(seen);
  cudaFreeHost(pinned);
  cudaStreamDestroy(copy);
  cudaStreamDestroy(compute);
}

TEST(EmulatedMemory, KindsAreWhatCudaReports) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void *dev = nullptr, *pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 64), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  std::vector<char> pageable(64);
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(dev) + 10), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 0);
  ASSERT_EQ(cudaPointerGetAttributes(&a, pinned), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&a, pageable.data()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(dev) % 256, 0u) << "cudaMalloc aligns to 256 bytes";
  cudaFree(dev);
  cudaFreeHost(pinned);
}

TEST(EmulatedMemory, CopiesAreCheckedForDirectionAndBounds) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 64), cudaSuccess);
  std::vector<char> host(128);
  testing::internal::CaptureStderr();
  EXPECT_EQ(cudaMemcpy(host.data(), dev, 64, cudaMemcpyHostToDevice),
            cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 64, cudaMemcpyDeviceToHost),
            cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaMemcpy(dev, host.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(static_cast<char*>(dev) + 8, host.data(), 57, cudaMemcpyDefault),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemsetAsync(host.data(), 0, 8, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("cudaMemcpyHostToDevice from"), std::string::npos) << printed;
  EXPECT_NE(printed.find("run past the allocation's end"), std::string::npos) << printed;
  EXPECT_EQ(cudaMemcpy(static_cast<char*>(dev) + 8, host.data(), 56, cudaMemcpyDefault),
            cudaSuccess);
  cudaGetLastError();
  cudaFree(dev);
}

TEST(EmulatedMemory, TheDeviceHasTheMemoryItWasGiven) {
  ASSERT_EQ(cudaSetDevice(5), cudaSuccess);
  std::size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(total, std::size_t{1} << 30);  // PDTRAIN_CUDA_EMU_MEMORY=1G
  void* big = nullptr;
  ASSERT_EQ(cudaMalloc(&big, 700u << 20), cudaSuccess);
  void* more = nullptr;
  EXPECT_EQ(cudaMalloc(&more, 400u << 20), cudaErrorMemoryAllocation);
  EXPECT_EQ(more, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "an allocation failure is not sticky";
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(free_bytes, total - (700u << 20));
  cudaFree(big);
  cudaSetDevice(0);
}

TEST(EmulatedDevices, TheNodeHasTheGpusItWasGiven) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_EQ(n, 8);  // PDTRAIN_CUDA_EMU_GPUS=8
  cudaDeviceProp a{}, b{};
  ASSERT_EQ(cudaGetDeviceProperties(&a, 0), cudaSuccess);
  ASSERT_EQ(cudaGetDeviceProperties(&b, 1), cudaSuccess);
  EXPECT_NE(std::string(a.name).find("emulated"), std::string::npos) << a.name;
  EXPECT_NE(std::memcmp(a.uuid.bytes, b.uuid.bytes, 16), 0) << "two GPUs, one UUID";
  EXPECT_EQ(cudaSetDevice(8), cudaErrorInvalidDevice);
  cudaGetLastError();
}

}  // namespace
