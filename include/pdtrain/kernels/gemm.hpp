#pragma once
// The one place dense matrix products go through. Row-major, like every tensor in pdtrain.
// Backend chosen at build time (CMake PDTRAIN_GEMM_BACKEND): oneDNN matmul or CBLAS for fp32
// and bf16; fp64 always goes to CBLAS.
//
// Using it:
// - Not thread-safe: the oneDNN primitive cache and the bf16 conversion scratch are
//   process-wide and unlocked. Call from one thread at a time (pdtrain: one per rank).
// - Threads: both backends use the BLAS thread count (kernels::set_blas_threads,
//   OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS; OpenBLAS's default is all cores). The oneDNN
//   backend sets OpenMP's thread count to it around each call, so one rank per core with one
//   BLAS thread each (scripts/mpirun-local, app's choose_blas_threads) does not oversubscribe.
// - No alignment requirements; any leading dimension >= the stored row length works. The
//   oneDNN backend caches one primitive per (precision, transposes, M, N, K, lda, ldb, ldc,
//   alpha, beta, threads): keep these few and fixed (the model's shapes are), or the cache grows.

#include <string>

#include "pdtrain/kernels/bf16.hpp"

namespace pdtrain::kernels {

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, op(X) = X^T when trans_x is set.
// lda/ldb/ldc are the row strides of A, B and C as stored (before op). M or N = 0 is a no-op;
// beta = 0 never reads C (so C may hold NaN or garbage).
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc);
// bf16 inputs, fp32 accumulation and output. Without a native bf16 kernel (see below) A and
// B are widened to fp32 (exact) in reusable scratch and multiplied by the fp32 path: the
// same result as gemm() on the widened inputs.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc);

// Whether bf16 GEMMs run in a bf16 kernel (oneDNN on AVX512-BF16 / AMX CPUs) rather than
// being converted to fp32; probed once, at the first call, on a 256x256x256 product.
bool gemm_bf16_native();

// E.g. "oneDNN 2.6.3 (fp32: gemm:jit, bf16: converted to fp32; fp64: CBLAS)" or
// "CBLAS (OpenBLAS Zen)".
std::string gemm_backend_description();

}  // namespace pdtrain::kernels
