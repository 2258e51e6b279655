#include "pdtrain/kernels/gemm.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cblas.h>
#include <string>
#include <vector>

#include "gemm_backend.hpp"
#include "pdtrain/kernels/blas_runtime.hpp"

namespace pdtrain::kernels {

namespace {
CBLAS_TRANSPOSE op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

// A Kokkos profiling region around each GEMM, so that a tool (or perf/bench_single_rank
// --profile) sees BLAS time next to the Kokkos kernels. Costs one flag test without a tool.
class GemmRegion {
 public:
  GemmRegion(const char* kind, bool ta, bool tb, int M, int N, int K)
      : on_(Kokkos::Profiling::profileLibraryLoaded()) {
    if (on_)
      Kokkos::Profiling::pushRegion(std::string(kind) + (ta ? 'T' : 'N') + (tb ? 'T' : 'N') + " " +
                                    std::to_string(M) + "x" + std::to_string(N) + "x" +
                                    std::to_string(K));
  }
  ~GemmRegion() {
    if (on_) Kokkos::Profiling::popRegion();
  }
  GemmRegion(const GemmRegion&) = delete;
  GemmRegion& operator=(const GemmRegion&) = delete;

 private:
  bool on_;
};

// The fp32 product on the selected backend (M, N > 0).
void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
#ifdef PDTRAIN_GEMM_ONEDNN
  if (K == 0) {  // C = beta * C, as BLAS defines it (oneDNN has no empty reductions)
    for (int i = 0; i < M; ++i)
      for (float* c = C + std::int64_t(i) * ldc; c != C + std::int64_t(i) * ldc + N; ++c)
        *c = beta == 0 ? 0.0f : beta * *c;
    return;
  }
  detail::onednn_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
  cblas_sgemm(CblasRowMajor, op(trans_a), op(trans_b), M, N, K, alpha, A, lda, B, ldb, beta, C,
              ldc);
#endif
}

// The stored rows x cols block of X (row stride ld) widened to dense fp32 (row stride cols)
// in scratch, which is reused from call to call (hence not thread-safe). Padding is not read.
void widen(const bf16* X, int rows, int cols, int ld, std::vector<float>& scratch) {
  scratch.resize(std::size_t(rows) * cols + 1);  // + 1: never empty, so data() is not null
  for (int r = 0; r < rows; ++r)
    to_float(X + std::int64_t(r) * ld, scratch.data() + std::int64_t(r) * cols, cols);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;  // CBLAS rejects the degenerate leading dimensions
  GemmRegion region("pdtrain::gemm_", trans_a, trans_b, M, N, K);
  sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  if (M == 0 || N == 0) return;
  GemmRegion region("pdtrain::gemm_", trans_a, trans_b, M, N, K);
  cblas_dgemm(CblasRowMajor, op(trans_a), op(trans_b), M, N, K, alpha, A, lda, B, ldb, beta, C,
              ldc);
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
          const bf16* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  GemmRegion region("pdtrain::gemm_bf16_", trans_a, trans_b, M, N, K);
#ifdef PDTRAIN_GEMM_ONEDNN
  if (K > 0 &&
      detail::onednn_gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
    return;
#endif
  // No native bf16 kernel: widen (exactly) and multiply in fp32.
  static std::vector<float> a32, b32;
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  widen(A, a_rows, a_cols, lda, a32);
  widen(B, b_rows, b_cols, ldb, b32);
  // max(1, ...): CBLAS rejects zero leading dimensions even when K = 0.
  sgemm(trans_a, trans_b, M, N, K, alpha, a32.data(), std::max(1, a_cols), b32.data(),
        std::max(1, b_cols), beta, C, ldc);
}

bool gemm_bf16_native() {
#ifdef PDTRAIN_GEMM_ONEDNN
  return detail::onednn_bf16_native();
#else
  return false;
#endif
}

std::string gemm_backend_description() {
#ifdef PDTRAIN_GEMM_ONEDNN
  return detail::onednn_description();
#else
  const std::string core = blas_corename();
  return core.empty() ? "CBLAS" : "CBLAS (OpenBLAS " + core + ")";
#endif
}

}  // namespace pdtrain::kernels
