// The emulated CUDA target's warp matrix operations (<mma.h>, emulation/cuda/src/wmma.cpp):
// a 16x16x16 bf16 mma_sync equals the product computed on the CPU the way the emulation
// documents it (exact bf16 products summed in fp32 in k order, added to c), through every
// layout and leading dimension the kernels use; fragments hold their elements in a scattered
// mapping (so code relying on one fails) that element-wise scaling survives; and the calls are
// warp-collective with uniform, aligned arguments: a divergent warp, a misaligned pointer or
// lanes passing different pointers are faults naming the kernel. Run by ctest with
// PDTRAIN_CUDA_EMU_GPUS=4 (each fault test takes a device of its own) and the race check on.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "fault_on.hpp"

namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
constexpr int kLdA = 24, kLdB = 32, kLdC = 20;  // leading dimensions past the 16 columns

// ---- kernels (one warp)

// d = c + a b with a row-major (ldm kLdA), b row-major or (kBCol) column-major (ldm kLdB), c
// loaded row-major and d stored column-major (ldm kLdC).
template <bool kBCol>
__global__ void product(float* d, const bf16* a, const bf16* b, const float* c) {
  using LayoutB = std::conditional_t<kBCol, wmma::col_major, wmma::row_major>;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LayoutB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, a, kLdA);
  wmma::load_matrix_sync(fb, b, kLdB);
  wmma::load_matrix_sync(acc, c, kLdC, wmma::mem_row_major);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, kLdC, wmma::mem_col_major);
}

// Each lane's elements of an accumulator loaded from m (m[e] = e): where lane l's x[i] came
// from, at where[l * num_elements + i]; then the fragment doubled element-wise and stored.
__global__ void mapping_and_scaling(float* where, float* doubled, const float* m) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, m, 16, wmma::mem_row_major);
  const unsigned lane = threadIdx.x % 32;
  for (int i = 0; i < acc.num_elements; ++i) {
    where[lane * acc.num_elements + i] = acc.x[i];
    acc.x[i] *= 2.0f;
  }
  wmma::store_matrix_sync(doubled, acc, 16, wmma::mem_row_major);
}

// Lanes 16..31 leave before the mma: the warp is not converged.
__global__ void divergent_mma(float* d, const bf16* a) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, a, 16);
  if (threadIdx.x >= 16) return;
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

// A pointer 16 bytes past a 256-byte boundary (WMMA needs 32-byte alignment).
__global__ void misaligned_load(float* d) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, d + 4, 16, wmma::mem_row_major);
  wmma::store_matrix_sync(d + 256, acc, 16, wmma::mem_row_major);
}

// Every lane stores to its own place: the pointer is not warp-uniform.
__global__ void lanes_store_apart(float* d) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 1.0f);
  wmma::store_matrix_sync(d + 256 * (threadIdx.x % 2), acc, 16, wmma::mem_row_major);
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

// ---- tests

TEST(EmulatedWmma, Bf16RoundingIsToNearestEven) {
  EXPECT_EQ(__float2bfloat16(1.0f).__x, 0x3f80);
  EXPECT_EQ(__float2bfloat16(__uint_as_float(0x3f808000u)).__x, 0x3f80);  // tie: to even
  EXPECT_EQ(__float2bfloat16(__uint_as_float(0x3f818000u)).__x, 0x3f82);  // tie: to even
  EXPECT_EQ(__float2bfloat16(__uint_as_float(0x3f808001u)).__x, 0x3f81);
  EXPECT_EQ(__float2bfloat16(NAN).__x, 0x7fff);
  EXPECT_EQ(__bfloat162float(__float2bfloat16(-2.5f)), -2.5f);
}

TEST(EmulatedWmma, AProductEqualsTheCpusInEveryLayout) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const std::vector<bf16> a = to_bf16(values(16 * kLdA, 1)), b = to_bf16(values(16 * kLdB, 2));
  const std::vector<float> c = values(16 * kLdC, 3);
  bf16 *da = device_copy(a), *db = device_copy(b);
  float* dc = device_copy(c);
  for (const bool b_col : {false, true}) {
    float* dd = device_copy(std::vector<float>(16 * kLdC, -1.0f));
    if (b_col)
      PDTRAIN_CUDA_EMU_LAUNCH(product<true>, 1, 32, 0, nullptr)(dd, da, db, dc);
    else
      PDTRAIN_CUDA_EMU_LAUNCH(product<false>, 1, 32, 0, nullptr)(dd, da, db, dc);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> d = host_copy(dd, 16 * kLdC);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) {
        float dot = 0.0f;
        for (int k = 0; k < 16; ++k)
          dot += __bfloat162float(a[i * kLdA + k]) *
                 __bfloat162float(b_col ? b[j * kLdB + k] : b[k * kLdB + j]);
        const float want = c[i * kLdC + j] + dot;
        EXPECT_EQ(d[j * kLdC + i], want) << "d(" << i << "," << j << "), b col-major " << b_col;
      }
    for (int j = 0; j < 16; ++j)  // the store wrote the 16 rows of each column, nothing past
      for (int i = 16; i < kLdC; ++i) EXPECT_EQ(d[j * kLdC + i], -1.0f);
    cudaFree(dd);
  }
  cudaFree(da), cudaFree(db), cudaFree(dc);
}

TEST(EmulatedWmma, FragmentsScatterTheirElementsAndScaleElementWise) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::vector<float> m(256);
  std::iota(m.begin(), m.end(), 0.0f);
  float *dm = device_copy(m), *where = device_copy(std::vector<float>(256, -1.0f)),
        *doubled = device_copy(std::vector<float>(256, -1.0f));
  PDTRAIN_CUDA_EMU_LAUNCH(mapping_and_scaling, 1, 32, 0, nullptr)(where, doubled, dm);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> w = host_copy(where, 256);
  const std::vector<float> d = host_copy(doubled, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(d[e], 2.0f * e);
  // Lane l does not hold row l/2 (nor elements 8l..8l+7) as a naive mapping would.
  int in_place = 0;
  for (int s = 0; s < 256; ++s) in_place += w[s] == static_cast<float>(s);
  EXPECT_LT(in_place, 16) << "the accumulator's mapping is (nearly) the row-major one";
  std::sort(w.begin(), w.end());
  for (int e = 0; e < 256; ++e) ASSERT_EQ(w[e], static_cast<float>(e)) << "not a permutation";
  cudaFree(dm), cudaFree(where), cudaFree(doubled);
}

TEST(EmulatedWmma, ADivergentWarpIsAFaultNamingTheKernel) {
  cudaError_t error = cudaSuccess;
  const std::string printed = fault_on<float>(1, [](float* out) {
    bf16* a = device_copy(to_bf16(values(256, 4)));
    PDTRAIN_CUDA_EMU_LAUNCH(divergent_mma, 1, 32, 0, nullptr)(out, a);
  }, &error);
  EXPECT_EQ(error, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel divergent_mma"), std::string::npos) << printed;
  EXPECT_NE(printed.find("lanes 0x0000ffff of warp 0 wait in nvcuda::wmma::mma_sync"),
            std::string::npos) << printed;
}

TEST(EmulatedWmma, AMisalignedPointerIsAFault) {
  cudaError_t error = cudaSuccess;
  const std::string printed = fault_on<float>(2, [](float* out) {
    PDTRAIN_CUDA_EMU_LAUNCH(misaligned_load, 1, 32, 0, nullptr)(out);
  }, &error);
  EXPECT_EQ(error, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel misaligned_load"), std::string::npos) << printed;
  EXPECT_NE(printed.find("not 256-bit (32-byte) aligned"), std::string::npos) << printed;
}

TEST(EmulatedWmma, LanesPassingDifferentPointersAreAFault) {
  cudaError_t error = cudaSuccess;
  const std::string printed = fault_on<float>(3, [](float* out) {
    PDTRAIN_CUDA_EMU_LAUNCH(lanes_store_apart, 1, 32, 0, nullptr)(out);
  }, &error);
  EXPECT_EQ(error, cudaErrorLaunchFailure);
  EXPECT_NE(printed.find("kernel lanes_store_apart"), std::string::npos) << printed;
  EXPECT_NE(printed.find("nvcuda::wmma::store_matrix_sync with arguments that differ"),
            std::string::npos) << printed;
}

}  // namespace
