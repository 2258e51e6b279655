// gemm(): every transpose combination against a naive product, with padded leading dimensions
// (submatrices of wider buffers) so a confused lda/ldb/ldc shows up; the bf16 GEMM and the
// fp32 one on random data against a double reference; the primitive cache, alpha/beta and
// empty shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
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

// ---------------------------------------------------------------------------------------------
// Random operands, fp32 or bf16 inputs, against a double-precision reference computed from
// the same (bf16-rounded) inputs, so the only error is the fp32 accumulation: a sum of K
// products, each exact in double, accumulated in fp32 in any order, has
// |err| <= K * 2^-24 * sum_k |a_ik| |b_kj| (to first order); alpha and beta * C add one
// rounding each of their own results.

float value(float x) { return x; }
float value(bf16 x) { return to_float(x); }
template <class In>
In input(float x) {
  if constexpr (std::is_same_v<In, bf16>)
    return to_bf16(x);
  else
    return x;
}

template <class In>
struct RandomGemm {
  bool trans_a, trans_b;
  int M, N, K, pad;
  int a_rows, a_cols, b_rows, b_cols, lda, ldb, ldc;
  std::vector<In> A, B;
  std::vector<float> C;

  RandomGemm(bool ta, bool tb, int m, int n, int k, int pad_, unsigned seed)
      : trans_a(ta), trans_b(tb), M(m), N(n), K(k), pad(pad_) {
    a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
    lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    // Padding holds NaN: a GEMM that reads it poisons C.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    A.assign(std::size_t(a_rows) * lda, input<In>(nan));
    B.assign(std::size_t(b_rows) * ldb, input<In>(nan));
    for (int r = 0; r < a_rows; ++r)
      for (int c = 0; c < a_cols; ++c) A[std::size_t(r) * lda + c] = input<In>(dist(gen));
    for (int r = 0; r < b_rows; ++r)
      for (int c = 0; c < b_cols; ++c) B[std::size_t(r) * ldb + c] = input<In>(dist(gen));
    C.assign(std::size_t(M) * ldc, 0.0f);
    for (float& c : C) c = dist(gen);
  }

  // Runs C = alpha A B + beta C and checks every element (padding included) against the
  // double reference computed from the C before the call.
  void run_and_check(float alpha, float beta, const char* what) {
    const std::vector<float> C0 = C;
    gemm(trans_a, trans_b, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < ldc; ++j) {
        const std::size_t ij = std::size_t(i) * ldc + j;
        if (j >= N) {  // padding columns are not part of C and must stay untouched
          ASSERT_TRUE(std::memcmp(&C[ij], &C0[ij], sizeof(float)) == 0) << what;
          continue;
        }
        double s = 0, s_abs = 0;
        for (int k = 0; k < K; ++k) {
          const double a =
              value(trans_a ? A[std::size_t(k) * lda + i] : A[std::size_t(i) * lda + k]);
          const double b =
              value(trans_b ? B[std::size_t(j) * ldb + k] : B[std::size_t(k) * ldb + j]);
          s += a * b;
          s_abs += std::abs(a * b);
        }
        const double c0 = beta == 0 ? 0.0 : double(C0[ij]);  // beta = 0 never reads C
        const double ref = alpha * s + beta * c0;
        const double tol = (K + 2) * 0x1p-24 * std::abs(alpha) * s_abs +
                           2 * 0x1p-24 * (std::abs(alpha * s) + std::abs(beta * c0)) + 1e-30;
        ASSERT_LE(std::abs(C[ij] - ref), tol)
            << what << " trans_a=" << trans_a << " trans_b=" << trans_b << " alpha=" << alpha
            << " beta=" << beta << " at " << i << "," << j << ": " << C[ij] << " vs " << ref;
      }
  }
};

template <class In>
void check_random_all_transposes(const char* what) {
  unsigned seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      RandomGemm<In> g(ta, tb, 37, 29, 300, 5, seed++);
      g.run_and_check(1.0f, 0.0f, what);
      g.run_and_check(0.75f, 0.5f, what);
    }
}

TEST(Gemm, Fp32RandomAllTransposesWithinAccumulationBound) {
  check_random_all_transposes<float>("fp32");
}

TEST(Gemm, Bf16AllTransposesWithinAccumulationBound) { check_random_all_transposes<bf16>("bf16"); }

// The same shape again and again (one cached primitive per shape and alpha/beta) with the
// alpha/beta combinations the model uses (beta 0 overwrite, beta 1 accumulate) and others.
template <class In>
void check_repeated_calls(const char* what) {
  RandomGemm<In> g(false, true, 64, 48, 96, 3, 42);
  for (int rep = 0; rep < 3; ++rep) {
    std::fill(g.C.begin(), g.C.end(), std::numeric_limits<float>::quiet_NaN());
    g.run_and_check(1.0f, 0.0f, what);  // beta = 0 ignores the NaN in C
    g.run_and_check(1.0f, 1.0f, what);
    g.run_and_check(0.125f, 0.0f, what);
    g.run_and_check(-2.0f, 1.0f, what);
    g.run_and_check(1.5f, -0.25f, what);
  }
}

TEST(Gemm, Fp32RepeatedShapesAndAlphaBeta) { check_repeated_calls<float>("fp32"); }
TEST(Gemm, Bf16RepeatedShapesAndAlphaBeta) { check_repeated_calls<bf16>("bf16"); }

TEST(Gemm, EmptyShapes) {
  std::vector<float> C(12, 3.0f);
  const std::vector<float> C0 = C;
  // M or N = 0: nothing to compute, nothing touched (not even the pointers).
  gemm(false, false, 0, 4, 5, 1.0f, static_cast<const float*>(nullptr), 5, nullptr, 4, 0.0f,
       C.data(), 4);
  gemm(true, true, 3, 0, 5, 1.0f, static_cast<const bf16*>(nullptr), 3, nullptr, 5, 0.0f, C.data(),
       4);
  EXPECT_EQ(C, C0);
  // K = 0: C = beta * C.
  const float a = 1, b = 1;
  gemm(false, false, 3, 4, 0, 1.0f, &a, 1, &b, 4, 0.5f, C.data(), 4);
  for (float c : C) EXPECT_EQ(c, 1.5f);
  const bf16 ah = to_bf16(1), bh = to_bf16(1);
  gemm(false, false, 3, 4, 0, 1.0f, &ah, 1, &bh, 4, 0.0f, C.data(), 4);
  for (float c : C) EXPECT_EQ(c, 0.0f);
}

TEST(Gemm, BackendDescribesItself) {
  const std::string d = gemm_backend_description();
  EXPECT_FALSE(d.empty());
  std::printf("gemm backend: %s; bf16 native: %s\n", d.c_str(), gemm_bf16_native() ? "yes" : "no");
}

}  // namespace
}  // namespace pdtrain::kernels
