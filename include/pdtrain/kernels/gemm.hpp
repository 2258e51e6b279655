#pragma once
// The one place dense matrix products go through: today CBLAS on the host, later the plug-in
// point for a oneDNN or cuBLAS backend. Row-major, like every tensor in pdtrain.

namespace pdtrain::kernels {

// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, op(X) = X^T when trans_x is set.
// lda/ldb/ldc are the row strides of A, B and C as stored (before op).
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc);

}  // namespace pdtrain::kernels
