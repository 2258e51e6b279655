#include "pdtrain/kernels/gemm.hpp"

#include <cblas.h>

namespace pdtrain::kernels {

namespace {
CBLAS_TRANSPOSE op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }
}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;  // CBLAS rejects the degenerate leading dimensions
  cblas_sgemm(CblasRowMajor, op(trans_a), op(trans_b), M, N, K, alpha, A, lda, B, ldb, beta, C,
              ldc);
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, op(trans_a), op(trans_b), M, N, K, alpha, A, lda, B, ldb, beta, C,
              ldc);
}

}  // namespace pdtrain::kernels
