// The emulated CUDA target's PTX primitives (src/kernels/cuda/mma_sm80.cuh over
// emulation/cuda/src/ptx.cpp): ldmatrix .x1/.x2/.x4 (.trans) gives each lane exactly the
// elements the PTX ISA's layout names; mma.sync m16n8k16 with fragments in the documented
// layout equals the product summed the emulation's documented way (exact bf16 products in fp32
// in k order, plus c) and the product in double to fp32 accuracy; ldmatrix feeding mma from
// row-major and transposed tiles gives the same product; cp.async lands only when a wait
// covers its group (read before, it is NaN) and zero-fills past src-size; a read of another
// thread's copy without __syncthreads is caught by the race check; the calls are
// warp-collective (a divergent warp, lanes with different shapes and a misaligned row are
// faults naming the kernel); dynamic shared memory above 48 KiB only after
// cudaFuncSetAttribute, up to sm_90's 227 KiB. Run by ctest with the race check on and
// PDTRAIN_CUDA_EMU_GPUS=5 (each fault takes a device of its own).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fault_on.hpp"
#include "kernels/cuda/mma_sm80.cuh"

namespace {

namespace sm80 = pdtrain::kernels::cuda::sm80;
using bf16 = __nv_bfloat16;
using u32 = std::uint32_t;

constexpr int kLd = 24;  // elements per shared row: 16 and a pad (48 bytes: 16-byte aligned)

int lane() { return static_cast<int>(threadIdx.x % 32); }

// The value of element (i, j) of 8x8 matrix m in the ldmatrix tests: 64 m + 8 i + j, exact in
// bf16; matrix m sits at rows 8 (m % 2), columns 8 (m / 2) of a 16 x 16 tile.
float code(int m, int i, int j) { return static_cast<float>(64 * m + 8 * i + j); }

// ---- kernels (one warp)

// The tile of codes into shared memory, then ldmatrix.xN (kTrans): out[lane * 4 + m] = the
// lane's register m. Lanes past the N matrices' rows pass a null address (unused by PTX).
template <int N, bool kTrans>
__global__ void load_matrices(u32* out, const bf16* tile) {
  alignas(16) __shared__ bf16 sh[16 * kLd];
  for (int i = lane(); i < 16 * kLd; i += 32) sh[i] = tile[i];
  __syncwarp();
  const int m = lane() / 8, i = lane() % 8;
  const bf16* row = m < N ? &sh[(8 * (m % 2) + i) * kLd + 8 * (m / 2)] : nullptr;
  u32 r[N];
  sm80::ldmatrix<N, kTrans>(r, row);
  for (int k = 0; k < N; ++k) out[lane() * 4 + k] = r[k];
}

u32 pack(bf16 lo, bf16 hi) { return u32{lo.__x} | u32{hi.__x} << 16; }

// d = a b + c with each lane's fragments read from global memory at the places the PTX ISA's
// layout names (a 16x16 row-major, b 16x8 given as b[k * 8 + n], c and d 16x8 row-major).
__global__ void documented_mma(float* d, const bf16* a, const bf16* b, const float* c) {
  const int g = lane() / 4, t = lane() % 4;
  u32 fa[4], fb[2];
  float fc[4];
  for (int w = 0; w < 4; ++w) {  // a_{2w}, a_{2w+1}: row g + 8 [w odd], columns 2t + 8 [w >= 2]
    const int r = g + 8 * (w % 2), k = 2 * t + 8 * (w / 2);
    fa[w] = pack(a[r * 16 + k], a[r * 16 + k + 1]);
  }
  for (int w = 0; w < 2; ++w) {  // b_{2w}, b_{2w+1}: rows 2t + 8w, +1, column g
    const int k = 2 * t + 8 * w;
    fb[w] = pack(b[k * 8 + g], b[(k + 1) * 8 + g]);
  }
  for (int i = 0; i < 4; ++i) fc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  sm80::mma_m16n8k16_bf16(fc, fa, fb, fc);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = fc[i];
}

// The same product with the operands through ldmatrix as the attention kernels load them:
// a 16x16 row-major (x4), b either as its transpose bt[n][k] (8 x 16 row-major, x2) or as
// itself b[k][n] (16 x 8 row-major, x2.trans). d 16x8 row-major.
template <bool kBTransposedInMemory>
__global__ void ldmatrix_mma(float* d, const bf16* a, const bf16* b) {
  alignas(16) __shared__ bf16 sa[16 * kLd], sb[16 * kLd];
  for (int i = lane(); i < 16 * kLd; i += 32) sa[i] = a[i], sb[i] = b[i];
  __syncwarp();
  const int m = lane() / 8, i = lane() % 8;
  u32 fa[4], fb[2];
  sm80::ldmatrix<4, false>(fa, &sa[(8 * (m % 2) + i) * kLd + 8 * (m / 2)]);
  if constexpr (kBTransposedInMemory)  // matrices: (n 0-7, k 0-7), (n 0-7, k 8-15)
    sm80::ldmatrix<2, false>(fb, &sb[i * kLd + 8 * (m % 2)]);
  else  // matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), transposed
    sm80::ldmatrix<2, true>(fb, &sb[(8 * (m % 2) + i) * kLd]);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  sm80::mma_m16n8k16_bf16(acc, fa, fb, acc);
  const int g = lane() / 4, t = lane() % 4;
  for (int k = 0; k < 4; ++k) d[(g + 8 * (k / 2)) * 8 + 2 * t + k % 2] = acc[k];
}

// 32 threads, two groups of copies of 16 bytes each per thread (src 64 floats): group 0 the
// thread's first 4 floats, group 1 the next (src-size 0 for odd threads: zero-filled). out:
// 4 snapshots of the thread's 8 shared floats: after issuing, after wait_group 1, after
// wait_group 0, and thread's neighbour's first 4 after __syncthreads.
__global__ void async_copies(float* out, const float* src) {
  alignas(16) __shared__ float sh[32 * 8];
  const int t = static_cast<int>(threadIdx.x);
  float* mine = &sh[t * 8];
  sm80::cp_async_16(mine, src + t * 8, 16);
  sm80::cp_async_commit();
  sm80::cp_async_16(mine + 4, src + t * 8 + 4, t % 2 == 0 ? 16 : 0);
  sm80::cp_async_commit();
  for (int k = 0; k < 8; ++k) out[0 * 256 + t * 8 + k] = mine[k];
  sm80::cp_async_wait<1>();
  for (int k = 0; k < 8; ++k) out[1 * 256 + t * 8 + k] = mine[k];
  sm80::cp_async_wait<0>();
  for (int k = 0; k < 8; ++k) out[2 * 256 + t * 8 + k] = mine[k];
  __syncthreads();
  for (int k = 0; k < 8; ++k) out[3 * 256 + t * 8 + k] = sh[(t + 1) % 32 * 8 + k];
}

// Reads the neighbour's copy after its own wait but without the __syncthreads that orders it
// after the neighbour's wait: what it reads depends on the order the threads ran in.
__global__ void read_neighbour_without_barrier(float* out, const float* src) {
  alignas(16) __shared__ float sh[32 * 4];
  const int t = static_cast<int>(threadIdx.x);
  sm80::cp_async_16(&sh[t * 4], src + t * 4, 16);
  sm80::cp_async_commit();
  sm80::cp_async_wait<0>();
  out[t] = sh[(t + 1) % 32 * 4];
  __syncthreads();
}

// Lanes 16..31 leave before the ldmatrix: the warp is not converged.
__global__ void divergent_ldmatrix(u32* out) {
  alignas(16) __shared__ bf16 sh[8 * 8];
  if (lane() >= 16) return;
  u32 r[1];
  sm80::ldmatrix<1, false>(r, &sh[(lane() % 8) * 8]);
  out[lane()] = r[0];
}

// Lanes 0..15 load four matrices, lanes 16..31 two: not the same instruction.
__global__ void mixed_ldmatrix(u32* out) {
  alignas(16) __shared__ bf16 sh[32 * 8];
  for (int i = lane(); i < 32 * 8; i += 32) sh[i] = __float2bfloat16(1.0f);
  __syncwarp();
  u32 r[4] = {};
  if (lane() < 16)
    sm80::ldmatrix<4, false>(r, &sh[lane() * 8]);
  else
    sm80::ldmatrix<2, false>(reinterpret_cast<u32(&)[2]>(r), &sh[lane() % 16 * 8]);
  out[lane()] = r[0];
}

// Rows 8 bytes past 16-byte alignment.
__global__ void misaligned_ldmatrix(u32* out) {
  alignas(16) __shared__ bf16 sh[8 * 16];
  u32 r[1];
  sm80::ldmatrix<1, false>(r, &sh[(lane() % 8) * 16 + 4]);
  out[lane()] = r[0];
}

// Writes and reads back all of its dynamic shared memory (n floats).
__global__ void fill_dynamic_shared(float* out, int n) {
  PDTRAIN_CUDA_EMU_DYNAMIC_SHARED(float, sh);
  for (int i = static_cast<int>(threadIdx.x); i < n; i += 32) sh[i] = static_cast<float>(i);
  __syncthreads();
  float sum = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += 32) sum += sh[i] - static_cast<float>(i);
  out[threadIdx.x] = sum;
}

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

// Values of a few bits each, some negative, some not representable in bf16 before rounding.
std::vector<float> values(std::size_t n, int seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(static_cast<int>((i * 7919 + seed * 104729) % 97) - 48) / 7.0f;
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = __float2bfloat16(v[i]);
  return h;
}

float lo(u32 w) { return __bfloat162float(bf16{static_cast<std::uint16_t>(w & 0xffffu)}); }
float hi(u32 w) { return __bfloat162float(bf16{static_cast<std::uint16_t>(w >> 16)}); }

template <int N, bool kTrans>
void expect_ldmatrix_layout() {
  std::vector<bf16> tile(16 * kLd, __float2bfloat16(-1.0f));
  for (int m = 0; m < 4; ++m)
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j)
        tile[(8 * (m % 2) + i) * kLd + 8 * (m / 2) + j] = __float2bfloat16(code(m, i, j));
  bf16* dt = device_copy(tile);
  u32* dout = device_copy(std::vector<u32>(128, 0));
  PDTRAIN_CUDA_EMU_LAUNCH((load_matrices<N, kTrans>), 1, 32, 0, nullptr)(dout, dt);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<u32> out = host_copy(dout, 128);
  for (int l = 0; l < 32; ++l)
    for (int m = 0; m < N; ++m) {
      const u32 r = out[static_cast<std::size_t>(l * 4 + m)];
      // PTX ISA, ldmatrix: lane l holds row l/4, columns 2(l%4), +1; .trans the transpose.
      const float want_lo = kTrans ? code(m, 2 * (l % 4), l / 4) : code(m, l / 4, 2 * (l % 4));
      const float want_hi =
          kTrans ? code(m, 2 * (l % 4) + 1, l / 4) : code(m, l / 4, 2 * (l % 4) + 1);
      EXPECT_EQ(lo(r), want_lo) << "x" << N << (kTrans ? ".trans" : "") << " lane " << l
                                << " register " << m;
      EXPECT_EQ(hi(r), want_hi) << "x" << N << (kTrans ? ".trans" : "") << " lane " << l
                                << " register " << m;
    }
  cudaFree(dt), cudaFree(dout);
}

// The product the emulation documents: exact bf16 products summed in fp32 in k order, plus c.
float documented_dot(const std::vector<bf16>& a, const std::vector<bf16>& b, float c, int r,
                     int n, bool b_transposed) {
  float dot = 0.0f;
  for (int k = 0; k < 16; ++k)
    dot += __bfloat162float(a[r * kLd + k]) *
           __bfloat162float(b_transposed ? b[n * kLd + k] : b[k * kLd + n]);
  return c + dot;
}

// ---- tests

TEST(EmulatedPtx, LdmatrixGivesEachLaneThePtxLayout) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  expect_ldmatrix_layout<1, false>();
  expect_ldmatrix_layout<2, false>();
  expect_ldmatrix_layout<4, false>();
  expect_ldmatrix_layout<1, true>();
  expect_ldmatrix_layout<2, true>();
  expect_ldmatrix_layout<4, true>();
}

TEST(EmulatedPtx, MmaOfDocumentedFragmentsEqualsTheProduct) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const std::vector<bf16> a = to_bf16(values(256, 1)), b = to_bf16(values(128, 2));
  const std::vector<float> c = values(128, 3);
  bf16 *da = device_copy(a), *db = device_copy(b);
  float *dc = device_copy(c), *dd = device_copy(std::vector<float>(128, -1.0f));
  PDTRAIN_CUDA_EMU_LAUNCH(documented_mma, 1, 32, 0, nullptr)(dd, da, db, dc);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> d = host_copy(dd, 128);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      float dot = 0.0f;
      double exact = c[r * 8 + n];
      for (int k = 0; k < 16; ++k) {
        const float p = __bfloat162float(a[r * 16 + k]) * __bfloat162float(b[k * 8 + n]);
        dot += p;
        exact += static_cast<double>(p);
      }
      EXPECT_EQ(d[r * 8 + n], c[r * 8 + n] + dot) << "d(" << r << "," << n << ")";
      EXPECT_NEAR(d[r * 8 + n], exact, 1e-5 * (1.0 + std::fabs(exact))) << "d(" << r << "," << n
                                                                          << ")";
    }
  cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
}

TEST(EmulatedPtx, LdmatrixFeedsMmaFromRowMajorAndTransposedTiles) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const std::vector<bf16> a = to_bf16(values(16 * kLd, 4)), b = to_bf16(values(16 * kLd, 5));
  bf16 *da = device_copy(a), *db = device_copy(b);
  for (const bool b_transposed : {true, false}) {
    float* dd = device_copy(std::vector<float>(128, -1.0f));
    if (b_transposed)
      PDTRAIN_CUDA_EMU_LAUNCH(ldmatrix_mma<true>, 1, 32, 0, nullptr)(dd, da, db);
    else
      PDTRAIN_CUDA_EMU_LAUNCH(ldmatrix_mma<false>, 1, 32, 0, nullptr)(dd, da, db);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> d = host_copy(dd, 128);
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n)
        EXPECT_EQ(d[r * 8 + n], documented_dot(a, b, 0.0f, r, n, b_transposed))
            << "d(" << r << "," << n << "), b stored transposed " << b_transposed;
    cudaFree(dd);
  }
  cudaFree(da), cudaFree(db);
}

TEST(EmulatedPtx, AsyncCopiesLandWhenAWaitCoversTheirGroup) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::vector<float> src(256);
  for (int i = 0; i < 256; ++i) src[i] = static_cast<float>(i + 1);
  float *dsrc = device_copy(src), *dout = device_copy(std::vector<float>(4 * 256, -1.0f));
  PDTRAIN_CUDA_EMU_LAUNCH(async_copies, 1, 32, 0, nullptr)(dout, dsrc);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> out = host_copy(dout, 4 * 256);
  for (int t = 0; t < 32; ++t)
    for (int k = 0; k < 8; ++k) {
      const float copied = k < 4 || t % 2 == 0 ? src[t * 8 + k] : 0.0f;  // odd: zero-filled
      EXPECT_TRUE(std::isnan(out[t * 8 + k])) << "read before any wait, thread " << t;
      if (k < 4)
        EXPECT_EQ(out[256 + t * 8 + k], copied) << "group 0 after wait_group 1, thread " << t;
      else
        EXPECT_TRUE(std::isnan(out[256 + t * 8 + k])) << "group 1 before its wait, thread " << t;
      EXPECT_EQ(out[512 + t * 8 + k], copied) << "after wait_group 0, thread " << t;
      const int u = (t + 1) % 32;
      EXPECT_EQ(out[768 + t * 8 + k], k < 4 || u % 2 == 0 ? src[u * 8 + k] : 0.0f)
          << "the neighbour's copy after __syncthreads, thread " << t;
    }
  cudaFree(dsrc), cudaFree(dout);
}

TEST(EmulatedPtx, ReadingAnotherThreadsCopyWithoutABarrierIsCaught) {
  ASSERT_NE(std::getenv("PDTRAIN_CUDA_EMU_RACECHECK"), nullptr)
      << "run with PDTRAIN_CUDA_EMU_RACECHECK=1 (as ctest does)";
  cudaError_t error = cudaSuccess;
  const std::string printed = fault_on<float>(1, [](float* out) {
    std::vector<float> src(128);
    for (int i = 0; i < 128; ++i) src[i] = static_cast<float>(i);
    PDTRAIN_CUDA_EMU_LAUNCH(read_neighbour_without_barrier, 1, 32, 0, nullptr)(
        out, device_copy(src));
  }, &error);
  EXPECT_EQ(error, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel read_neighbour_without_barrier"), std::string::npos) << printed;
  EXPECT_NE(printed.find("race check"), std::string::npos) << printed;
}

TEST(EmulatedPtx, ADivergentOrMixedLdmatrixIsAFaultNamingTheKernel) {
  cudaError_t error = cudaSuccess;
  std::string printed = fault_on<u32>(2, [](u32* out) {
    PDTRAIN_CUDA_EMU_LAUNCH(divergent_ldmatrix, 1, 32, 0, nullptr)(out);
  }, &error);
  EXPECT_EQ(error, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel divergent_ldmatrix"), std::string::npos) << printed;
  EXPECT_NE(printed.find("lanes 0x0000ffff of warp 0 wait in ldmatrix.sync.aligned.m8n8"),
            std::string::npos) << printed;
  printed = fault_on<u32>(3, [](u32* out) {
    PDTRAIN_CUDA_EMU_LAUNCH(mixed_ldmatrix, 1, 32, 0, nullptr)(out);
  }, &error);
  EXPECT_EQ(error, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel mixed_ldmatrix"), std::string::npos) << printed;
  EXPECT_NE(printed.find("ldmatrix.sync.aligned.m8n8 with arguments that differ"),
            std::string::npos) << printed;
}

TEST(EmulatedPtx, AMisalignedLdmatrixRowIsAFault) {
  cudaError_t error = cudaSuccess;
  const std::string printed = fault_on<u32>(4, [](u32* out) {
    PDTRAIN_CUDA_EMU_LAUNCH(misaligned_ldmatrix, 1, 32, 0, nullptr)(out);
  }, &error);
  EXPECT_EQ(error, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel misaligned_ldmatrix"), std::string::npos) << printed;
  EXPECT_NE(printed.find("is not 16-byte aligned"), std::string::npos) << printed;
}

TEST(EmulatedPtx, DynamicSharedMemoryAbove48KibNeedsTheAttribute) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  float* out = device_copy(std::vector<float>(32, -1.0f));
  const int n = 100 * 1024 / 4;  // 100 KiB
  cudaGetLastError();
  PDTRAIN_CUDA_EMU_LAUNCH_FUNC(fill_dynamic_shared, 1, 32, std::size_t(n) * 4, nullptr)(out, n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "above 48 KiB without the attribute";
  EXPECT_EQ(cudaFuncSetAttribute(fill_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 232448 + 1),
            cudaErrorInvalidValue) << "above sm_90's 227 KiB";
  cudaGetLastError();
  ASSERT_EQ(cudaFuncSetAttribute(fill_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 n * 4),
            cudaSuccess);
  PDTRAIN_CUDA_EMU_LAUNCH_FUNC(fill_dynamic_shared, 1, 32, std::size_t(n) * 4, nullptr)(out, n);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (float s : host_copy(out, 32)) EXPECT_EQ(s, 0.0f);
  PDTRAIN_CUDA_EMU_LAUNCH_FUNC(fill_dynamic_shared, 1, 32, std::size_t(n) * 4 + 16, nullptr)(
      out, n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "above the kernel's own limit";
  cudaFree(out);
}

}  // namespace
