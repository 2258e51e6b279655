// The emulated CUDA target's kernel counts (emulation/cuda/src/profile.cpp, docs/cuda-emulation.md
// "Kernel counts"): planted kernels whose warp-level shared-memory wavefronts, global sectors,
// barriers and tensor-core operations are known from NVIDIA's rules: a stride-1 4-byte shared
// load is one wavefront per request, a stride of 32 words a 32-way conflict, one word read by
// every lane a broadcast; 8- and 16-byte accesses in half- and quarter-warp phases; a coalesced
// 128-byte warp load is 4 sectors, a stride-32-float load 32; requests are grouped per warp and
// synchronization epoch whatever order the threads ran in (the race check's random order, the
// fast path's one thread after another); a wmma fragment load from unpadded 128-byte rows is an
// 8-way conflict, padded rows none.
//
// In the profiling build (scripts/build-cuda-profile.sh: clang's trace-loads and trace-stores on
// this file) the kernels' plain loads and stores reach the counts through the coverage
// callbacks; in the other emulated builds (GCC has no trace-loads) read() and write() tell the
// runtime through the API its own primitives use. Either way the counting rules are what is
// tested. ctest runs it with PDTRAIN_CUDA_EMU_PROFILE set and the race check on.
#include <cuda_bf16.h>
#include <cuda_emu_ptx.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mma.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "profile.hpp"

namespace {

namespace profile = cuda_emu::profile;
namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

#ifdef PDTRAIN_CUDA_EMU_PROFILE
constexpr bool kInstrumented = true;  // the coverage callbacks see this file's loads and stores
#else
constexpr bool kInstrumented = false;
#endif

// A load or store of the kernel: a vector one announced as common.cuh's load4 / store4 do.
template <class T>
T read(const T* p) {
  if constexpr (sizeof(T) > 4)
    PDTRAIN_CUDA_EMU_VECTOR_ACCESS(p, sizeof(T), false);
  else if (!kInstrumented)
    profile::access(p, sizeof(T), false);
  return *p;
}

template <class T>
void write(T* p, T v) {
  if constexpr (sizeof(T) > 4)
    PDTRAIN_CUDA_EMU_VECTOR_ACCESS(p, sizeof(T), true);
  else if (!kInstrumented)
    profile::access(p, sizeof(T), true);
  *p = v;
}

// ---- kernels (one warp unless said)

// Lane l reads shared word l * stride (stride 0: all lanes one word) and stores it to out[l].
__global__ void shared_words(float* out, int stride) {
  __shared__ float words[32 * 32];
  const unsigned lane = threadIdx.x;
  if (stride < 0) words[lane] = 1.0f;  // never: only so that the compiler cannot fold the load
  write(&out[lane], read(&words[lane * stride]));
}

// Lane l reads the T at shared element l * stride (8 or 16 bytes: float2, float4).
template <class T>
__global__ void shared_vectors(float* out, int stride) {
  __shared__ T vectors[32 * 2];
  const unsigned lane = threadIdx.x;
  if (stride < 0) vectors[lane].x = 1.0f;  // never: only so that the compiler cannot fold the load
  write(&out[lane], read(&vectors[lane * stride]).x);
}

// Lane l reads dynamic shared word l * 2: a 2-way conflict.
__global__ void dynamic_words(float* out) {  // dynamic: the compiler cannot fold its loads
  PDTRAIN_CUDA_EMU_DYNAMIC_SHARED(float, words);
  const unsigned lane = threadIdx.x;
  write(&out[lane], read(&words[lane * 2]));
}

// Lane l reads in[l * stride] and stores it to out[l].
__global__ void global_floats(float* out, const float* in, int stride) {
  const unsigned lane = threadIdx.x;
  write(&out[lane], read(&in[lane * stride]));
}

// Two warps; each thread reads shared words before and after a barrier: 2 requests a warp.
__global__ void around_a_barrier(float* out) {
  __shared__ float words[64];
  const unsigned t = threadIdx.x;
  write(&words[t], static_cast<float>(t));
  __syncthreads();
  write(&out[t], read(&words[63 - t]));
}

// Two warps, no synchronization (the fast path from the second launch on): stride 32 words.
__global__ void conflicting_without_sync(float* out, int never) {
  __shared__ float words[64 * 32];
  const unsigned t = threadIdx.x;
  if (never != 0) words[t] = 1.0f;  // only so that the compiler cannot fold the load
  write(&out[t], read(&words[t * 32]));
}

// A matrix_a fragment loaded from a shared 16 x ldm bf16 tile, multiplied once, stored (d: 256
// floats).
template <int kLd>
__global__ void fragment_from_shared(float* d) {
  struct alignas(32) Tile {
    bf16 e[16 * kLd];
  };
  __shared__ Tile tile;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  wmma::load_matrix_sync(a, tile.e, kLd);
  wmma::load_matrix_sync(b, tile.e, kLd);
  wmma::mma_sync(acc, a, b, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// One warp: ldmatrix.x4 of four 8x8 bf16 matrices from shared rows `kPitch` bytes apart (lane l
// gives row l), a 16-byte cp.async per lane from in[] into shared memory, one m16n8k16 mma.
template <int kPitch>
__global__ void ptx_primitives(float* out, const float* in) {
  struct alignas(16) Rows {
    unsigned char bytes[32 * kPitch];
  };
  __shared__ Rows rows;
  __shared__ float4 landed[32];
  const unsigned lane = threadIdx.x;
  cuda_emu::ptx::cp_async_16(&landed[lane], &in[4 * lane], 16);
  cuda_emu::ptx::cp_async_commit_group();
  cuda_emu::ptx::cp_async_wait_group(0);
  unsigned a[4];
  cuda_emu::ptx::ldmatrix(a, 4, false, &rows.bytes[lane * kPitch]);
  const unsigned b[2] = {a[0], a[1]};
  float d[4] = {};
  cuda_emu::ptx::mma_m16n8k16_bf16(d, a, b, d);  // of rows never written: only counted
  write(&out[lane], 0.0f);
}

// ---- helpers

float* device_floats(std::size_t n) {
  float* p = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, 0, n * sizeof(float)), cudaSuccess);
  return p;
}

class KernelCounts : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(profile::on()) << "run with PDTRAIN_CUDA_EMU_PROFILE=DIR (ctest sets it)";
  }
  void SetUp() override {
    out_ = device_floats(64);
    in_ = device_floats(32 * 32);
  }
  void TearDown() override {
    cudaFree(out_);
    cudaFree(in_);
  }
  static profile::KernelCounts after_sync(const char* name) {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return profile::counted(name);
  }
  float *out_ = nullptr, *in_ = nullptr;
};

TEST_F(KernelCounts, AStrideOneSharedLoadIsOneWavefrontPerRequest) {
  PDTRAIN_CUDA_EMU_LAUNCH_AS("stride_1", shared_words, 1, 32, 0, nullptr)(out_, 1);
  const profile::KernelCounts c = after_sync("stride_1");
  EXPECT_EQ(c.launches, 1u);
  EXPECT_EQ(c.shared_requests, 1u);
  EXPECT_EQ(c.shared_wavefronts, 1u);
  EXPECT_EQ(c.shared_ideal_wavefronts, 1u);
}

TEST_F(KernelCounts, AStrideOf32WordsIsA32WayConflict) {
  PDTRAIN_CUDA_EMU_LAUNCH_AS("stride_32", shared_words, 1, 32, 0, nullptr)(out_, 32);
  const profile::KernelCounts c = after_sync("stride_32");
  EXPECT_EQ(c.shared_requests, 1u);
  EXPECT_EQ(c.shared_wavefronts, 32u);
  EXPECT_EQ(c.shared_ideal_wavefronts, 1u);
}

TEST_F(KernelCounts, OneWordReadByEveryLaneIsABroadcast) {
  PDTRAIN_CUDA_EMU_LAUNCH_AS("broadcast", shared_words, 1, 32, 0, nullptr)(out_, 0);
  const profile::KernelCounts c = after_sync("broadcast");
  EXPECT_EQ(c.shared_requests, 1u);
  EXPECT_EQ(c.shared_wavefronts, 1u);
}

TEST_F(KernelCounts, DynamicSharedMemoryIsSharedMemory) {
  PDTRAIN_CUDA_EMU_LAUNCH(dynamic_words, 1, 32, 256 * sizeof(float), nullptr)(out_);
  const profile::KernelCounts c = after_sync("dynamic_words");
  EXPECT_EQ(c.shared_requests, 1u);
  EXPECT_EQ(c.shared_wavefronts, 2u);
  EXPECT_EQ(c.global_requests, 1u);  // the store to out
}

TEST_F(KernelCounts, EightAndSixteenByteAccessesGoInHalfAndQuarterWarpPhases) {
  PDTRAIN_CUDA_EMU_LAUNCH_AS("float2_stride_1", shared_vectors<float2>, 1, 32, 0, nullptr)(out_, 1);
  PDTRAIN_CUDA_EMU_LAUNCH_AS("float4_stride_1", shared_vectors<float4>, 1, 32, 0, nullptr)(out_, 1);
  PDTRAIN_CUDA_EMU_LAUNCH_AS("float4_stride_2", shared_vectors<float4>, 1, 32, 0, nullptr)(out_, 2);
  const profile::KernelCounts f2 = after_sync("float2_stride_1");
  EXPECT_EQ(f2.shared_wavefronts, 2u);
  EXPECT_EQ(f2.shared_ideal_wavefronts, 2u);
  const profile::KernelCounts f4 = profile::counted("float4_stride_1");
  EXPECT_EQ(f4.shared_wavefronts, 4u);
  EXPECT_EQ(f4.shared_ideal_wavefronts, 4u);
  const profile::KernelCounts f4s2 = profile::counted("float4_stride_2");
  EXPECT_EQ(f4s2.shared_requests, 1u);
  EXPECT_EQ(f4s2.shared_wavefronts, 8u);  // 8 lanes x 32 bytes a phase: each bank twice
  EXPECT_EQ(f4s2.shared_ideal_wavefronts, 4u);
}

TEST_F(KernelCounts, ACoalescedWarpLoadIsFourSectorsAStridedOne32) {
  PDTRAIN_CUDA_EMU_LAUNCH_AS("coalesced", global_floats, 1, 32, 0, nullptr)(out_, in_, 1);
  PDTRAIN_CUDA_EMU_LAUNCH_AS("strided", global_floats, 1, 32, 0, nullptr)(out_, in_, 32);
  const profile::KernelCounts c = after_sync("coalesced");
  EXPECT_EQ(c.global_requests, 2u);  // the load and the store
  EXPECT_EQ(c.global_sectors, 4u + 4u);
  EXPECT_EQ(c.global_ideal_sectors, 4u + 4u);
  EXPECT_EQ(c.dram_bytes, 128u + 128u);
  EXPECT_EQ(c.shared_requests, 0u);  // nothing of the stack or the arguments counted
  const profile::KernelCounts s = profile::counted("strided");
  EXPECT_EQ(s.global_requests, 2u);
  EXPECT_EQ(s.global_sectors, 32u + 4u);
  EXPECT_EQ(s.global_ideal_sectors, 4u + 4u);
  EXPECT_EQ(s.dram_bytes, 32u * 32u + 128u);
}

TEST_F(KernelCounts, RequestsArePerWarpAndBarrierEpoch) {
  PDTRAIN_CUDA_EMU_LAUNCH(around_a_barrier, 1, 64, 0, nullptr)(out_);
  const profile::KernelCounts c = after_sync("around_a_barrier");
  EXPECT_EQ(c.barriers, 1u);
  EXPECT_EQ(c.shared_requests, 2u * 2u);    // a store and a load per warp
  EXPECT_EQ(c.shared_wavefronts, 2u * 2u);  // conflict-free (63 - t reversed within 32 words)
  EXPECT_EQ(c.global_requests, 2u);
  EXPECT_EQ(c.global_sectors, 8u);
}

TEST_F(KernelCounts, TheFastPathGroupsAccessesAsTheFibersDo) {
  // The first launch runs on fibers; it makes no synchronization, so the second runs its threads
  // one after another: its counts must be the first's.
  PDTRAIN_CUDA_EMU_LAUNCH(conflicting_without_sync, 1, 64, 0, nullptr)(out_, 0);
  const profile::KernelCounts first = after_sync("conflicting_without_sync");
  EXPECT_EQ(first.shared_requests, 2u);
  EXPECT_EQ(first.shared_wavefronts, 2u * 32u);
  PDTRAIN_CUDA_EMU_LAUNCH(conflicting_without_sync, 1, 64, 0, nullptr)(out_, 0);
  const profile::KernelCounts both = after_sync("conflicting_without_sync");
  EXPECT_EQ(both.launches, 2u);
  EXPECT_EQ(both.shared_requests, 2u * first.shared_requests);
  EXPECT_EQ(both.shared_wavefronts, 2u * first.shared_wavefronts);
  EXPECT_EQ(both.global_sectors, 2u * first.global_sectors);
}

TEST_F(KernelCounts, AFragmentFromUnpaddedRowsIsAnEightWayConflict) {
  PDTRAIN_CUDA_EMU_LAUNCH_AS("rows_of_128_bytes", fragment_from_shared<64>, 1, 32, 0, nullptr)(in_);
  PDTRAIN_CUDA_EMU_LAUNCH_AS("rows_of_144_bytes", fragment_from_shared<72>, 1, 32, 0, nullptr)(in_);
  const profile::KernelCounts unpadded = after_sync("rows_of_128_bytes");
  // matrix_a row-major: 4 registers of two adjacent bf16 (4 requests, rows group and group + 8
  // at 128-byte pitch: 8 rows on 4 banks); the column-major b alike.
  EXPECT_EQ(unpadded.shared_requests, 4u + 4u);
  EXPECT_EQ(unpadded.shared_wavefronts, 8u * (4u + 4u));
  EXPECT_EQ(unpadded.tensor_ops.at("m16n16k16.bf16"), 1u);
  EXPECT_EQ(unpadded.tensor_flops, 2u * 16u * 16u * 16u);
  EXPECT_EQ(unpadded.global_requests, 8u);  // the accumulator stored: 8 fp32 a lane
  const profile::KernelCounts padded = profile::counted("rows_of_144_bytes");
  EXPECT_EQ(padded.shared_requests, 4u + 4u);
  EXPECT_EQ(padded.shared_wavefronts, 4u + 4u);
}

// ldmatrix: each lane's 16-byte row is one access, in quarter-warp phases (a matrix's 8 rows);
// rows 128 bytes apart all start on bank 0 (8 rows on 4 banks: 8-way), 144 bytes apart cover
// the 32 banks once. cp.async: a 16-byte global read (4 sectors for 8 lanes, 16 for the warp)
// and a 16-byte shared write per lane. mma: one m16n8k16 operation per warp.
TEST_F(KernelCounts, PtxPrimitivesCountWhatTheGpusPipelinesSee) {
  PDTRAIN_CUDA_EMU_LAUNCH_AS("ptx_128", ptx_primitives<128>, 1, 32, 0, nullptr)(out_, in_);
  PDTRAIN_CUDA_EMU_LAUNCH_AS("ptx_144", ptx_primitives<144>, 1, 32, 0, nullptr)(out_, in_);
  const profile::KernelCounts unpadded = after_sync("ptx_128");
  const profile::KernelCounts padded = profile::counted("ptx_144");
  // One request each: cp.async's shared write (4 phases, no conflict) and ldmatrix's rows.
  EXPECT_EQ(unpadded.shared_requests, 2u);
  EXPECT_EQ(unpadded.shared_wavefronts, 4u + 4u * 8u);
  EXPECT_EQ(padded.shared_requests, 2u);
  EXPECT_EQ(padded.shared_wavefronts, 4u + 4u);
  EXPECT_EQ(padded.shared_ideal_wavefronts, 8u);
  // cp.async's global read (512 contiguous bytes: 16 sectors) and the result's store (4).
  EXPECT_EQ(padded.global_requests, 2u);
  EXPECT_EQ(padded.global_sectors, 16u + 4u);
  EXPECT_EQ(padded.tensor_ops.at("m16n8k16.bf16"), 1u);
  EXPECT_EQ(padded.tensor_flops, 2u * 16u * 8u * 16u);
}

}  // namespace

int main(int argc, char** argv) {
  // The counts must be on before the first launch; ctest sets the directory, a direct run gets
  // the working directory's.
  setenv("PDTRAIN_CUDA_EMU_PROFILE", ".", 0);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
