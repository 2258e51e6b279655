#pragma once
// The sm_80+ warp primitives the FlashAttention-2-style kernels use (flash_attention.cu):
// ldmatrix, mma.sync m16n8k16 (bf16 inputs, fp32 accumulation) and 16-byte cp.async with
// commit and wait groups. Under nvcc each is one inline PTX instruction; on the emulated CUDA
// target (docs/cuda-emulation.md) a call into the emulation (<cuda_emu_ptx.h>), which
// implements the PTX ISA's fragment layouts exactly (that header states them), so a kernel
// that assumes another layout computes wrong numbers there as on a GPU.
//
// Registers are 32-bit words; a word holding two bf16 has the lower-index element in its low
// half. ldmatrix and mma are warp-collective: every lane calls them, converged.
#include <cuda_runtime.h>

#include <cstdint>

#ifdef PDTRAIN_CUDA_EMULATED
#include <cuda_emu_ptx.h>
#endif

namespace pdtrain::kernels::cuda::sm80 {

// ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16: lanes 8m..8m+7 give the 16-byte-aligned
// shared addresses of rows 0..7 of matrix m; r[m] gets this lane's two elements of matrix m
// (row lane/4, columns 2(lane%4), +1; .trans: rows 2(lane%4), +1 of column lane/4).
template <int N, bool kTrans>
__device__ __forceinline__ void ldmatrix(std::uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#ifdef PDTRAIN_CUDA_EMULATED
  cuda_emu::ptx::ldmatrix(r, N, kTrans, row);
#else
  const auto a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (N == 1 && !kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
  else if constexpr (N == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0]) : "r"(a));
  else if constexpr (N == 2 && !kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  else if constexpr (N == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  else if constexpr (!kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#endif
}

// d = a b + c on the tensor cores, m16n8k16, A row-major 16x16 (a0..a7 in 4 words), B
// column-major 16x8 (b0..b3 in 2 words), C and D 16x8 fp32 (PTX ISA: "Matrix Fragments for
// mma.m16n8k16 with floating point type"). d may be c.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                                  const std::uint32_t (&b)[2],
                                                  const float (&c)[4]) {
#ifdef PDTRAIN_CUDA_EMULATED
  cuda_emu::ptx::mma_m16n8k16_bf16(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

// cp.async.cg.shared.global: 16 bytes from global src to shared dst (both 16-byte aligned),
// of which the first src_bytes (0 or 16 here) are read and the rest zero-filled; it lands when
// a cp_async_wait covers the group it was committed in.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
#ifdef PDTRAIN_CUDA_EMULATED
  cuda_emu::ptx::cp_async_16(dst, src, src_bytes);
#else
  const auto d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(src_bytes)
               : "memory");
#endif
}

// Closes this thread's copies issued since the last commit into a group.
__device__ __forceinline__ void cp_async_commit() {
#ifdef PDTRAIN_CUDA_EMULATED
  cuda_emu::ptx::cp_async_commit_group();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's most recent groups are still in flight. Other
// threads' copies are visible only after a __syncthreads that follows their waits.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#ifdef PDTRAIN_CUDA_EMULATED
  cuda_emu::ptx::cp_async_wait_group(kPending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace pdtrain::kernels::cuda::sm80
