// gemm(): every transpose combination against a naive product, with padded leading dimensions
// (submatrices of wider buffers) so a confused lda/ldb/ldc shows up.
#include <gtest/gtest.h>

#include <vector>

#include "pdtrain/kernels/gemm.hpp"

namespace pdtrain::kernels {
namespace {

// Element (r, c) of a row-major matrix with row stride ld, seen through an optional transpose.
template <class Real>
Real at(const std::vector<Real>& m, int ld, bool trans, int r, int c) {
  return trans ? m[c * ld + r] : m[r * ld + c];
}

template <class Real>
void check_gemm(bool trans_a, bool trans_b) {
  constexpr int M = 5, N = 7, K = 3, pad = 2;
  // Stored shapes: A is MxK (KxM when transposed), B is KxN (NxK when transposed).
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  std::vector<Real> A(a_rows * lda), Bm(b_rows * ldb), Cm(M * ldc);
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = Real(int(i % 7) - 3) / 4;
  for (std::size_t i = 0; i < Bm.size(); ++i) Bm[i] = Real(int(i % 5) - 2) / 2;
  for (std::size_t i = 0; i < Cm.size(); ++i) Cm[i] = Real(int(i % 3));
  const std::vector<Real> C0 = Cm;
  const Real alpha = 1.5, beta = 0.5;

  gemm(trans_a, trans_b, M, N, K, alpha, A.data(), lda, Bm.data(), ldb, beta, Cm.data(), ldc);

  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < ldc; ++j) {
      if (j >= N) {  // padding columns are not part of C and must stay untouched
        EXPECT_EQ(Cm[i * ldc + j], C0[i * ldc + j]);
        continue;
      }
      Real s = 0;
      for (int k = 0; k < K; ++k) s += at(A, lda, trans_a, i, k) * at(Bm, ldb, trans_b, k, j);
      // Inputs are small dyadic rationals: the products are exact in either precision.
      EXPECT_EQ(Cm[i * ldc + j], alpha * s + beta * C0[i * ldc + j])
          << "trans_a=" << trans_a << " trans_b=" << trans_b << " at " << i << "," << j;
    }
  }
}

TEST(Gemm, FloatAllTransposes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_gemm<float>(ta, tb);
}

TEST(Gemm, DoubleAllTransposes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_gemm<double>(ta, tb);
}

}  // namespace
}  // namespace pdtrain::kernels
