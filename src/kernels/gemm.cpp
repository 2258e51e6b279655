#include "pdtrain/kernels/gemm.hpp"

#include <Kokkos_Core.hpp>
#include <cblas.h>
#include <string>

namespace pdtrain::kernels {

namespace {
CBLAS_TRANSPOSE op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

// A Kokkos profiling region around each GEMM, so that a tool (or perf/bench_single_rank
// --profile) sees BLAS time next to the Kokkos kernels. Costs one flag test without a tool.
class GemmRegion {
 public:
  GemmRegion(bool ta, bool tb, int M, int N, int K)
      : on_(Kokkos::Profiling::profileLibraryLoaded()) {
    if (on_)
      Kokkos::Profiling::pushRegion(std::string("pdtrain::gemm_") + (ta ? 'T' : 'N') +
                                    (tb ? 'T' : 'N') + " " + std::to_string(M) + "x" +
                                    std::to_string(N) + "x" + std::to_string(K));
  }
  ~GemmRegion() {
    if (on_) Kokkos::Profiling::popRegion();
  }
  GemmRegion(const GemmRegion&) = delete;
  GemmRegion& operator=(const GemmRegion&) = delete;

 private:
  bool on_;
};
}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;  // CBLAS rejects the degenerate leading dimensions
  GemmRegion region(trans_a, trans_b, M, N, K);
  cblas_sgemm(CblasRowMajor, op(trans_a), op(trans_b), M, N, K, alpha, A, lda, B, ldb, beta, C,
              ldc);
}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A, int lda,
          const double* B, int ldb, double beta, double* C, int ldc) {
  if (M == 0 || N == 0) return;
  GemmRegion region(trans_a, trans_b, M, N, K);
  cblas_dgemm(CblasRowMajor, op(trans_a), op(trans_b), M, N, K, alpha, A, lda, B, ldb, beta, C,
              ldc);
}

}  // namespace pdtrain::kernels
