// GEMM speed of kernels::gemm at the GPT-2 124M shapes (perf/matmul_ceiling.hpp), fp32 and
// bf16 inputs (fp32 accumulation), with the backend this build selected.
//
// Usage: bench_matmul [--short] [--threads N] [--tokens N] [--seconds S]
//   --threads  GEMM threads (kernels::set_blas_threads; the oneDNN backend follows it), def. 1
//   --tokens   rows of the activations (batch x sequence), default 256
//   --seconds  minimum timed seconds per shape and precision, default 0.3
//   --short    64 tokens, 0.02 s per shape: checks the shape list and that every rate and the
//              ceiling line come out (the ctest perf.bench_matmul_short)
// Prints one line per shape and precision, then
//   backend: <description>; bf16 native: yes|no
//   ceiling: fp32=<mean GFLOP/s> bf16=<mean GFLOP/s> ratio=<bf16/fp32>
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "matmul_ceiling.hpp"
#include "pdtrain/kernels/blas_runtime.hpp"
#include "pdtrain/kernels/gemm.hpp"

int main(int argc, char** argv) {
  bool short_mode = false;
  int threads = 1, tokens = 256;
  double seconds = 0.3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--short") short_mode = true;
    else if (a == "--threads" && has_value) threads = std::max(1, std::atoi(argv[++i]));
    else if (a == "--tokens" && has_value) tokens = std::max(1, std::atoi(argv[++i]));
    else if (a == "--seconds" && has_value) seconds = std::atof(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: bench_matmul [--short] [--threads N] [--tokens N] [--seconds S]\n");
      return 2;
    }
  }
  if (short_mode) tokens = 64, seconds = 0.02;
  int kokkos_argc = 1;
  Kokkos::ScopeGuard kokkos(kokkos_argc, argv);  // for gemm's profiling regions
  pdtrain::kernels::set_blas_threads(threads);

  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::printf("FAIL %s\n", what.c_str());
      ++failures;
    }
  };
  const auto shapes = pdtrain::perf::gpt2_matmul_shapes(tokens);
  check(shapes.size() == 12, "12 shapes");
  check(shapes[9].flops() == 2.0 * tokens * 50304 * 768, "LM head forward FLOPs");

  std::printf("bench_matmul: threads=%d tokens=%d\n", threads, tokens);
  double mean[2] = {};
  for (bool bf16 : {false, true}) {
    std::vector<double> rates;
    mean[bf16] = pdtrain::perf::matmul_ceiling_gflops(bf16, tokens, seconds, &rates);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto& s = shapes[i];
      std::printf("matmul %-6s %-7s %c%c M=%-5d N=%-5d K=%-5d %s gflops=%.2f\n", s.layer, s.pass,
                  s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.M, s.N, s.K,
                  bf16 ? "bf16" : "fp32", rates[i]);
      check(std::isfinite(rates[i]) && rates[i] > 0, std::string(s.layer) + " " + s.pass);
    }
  }
  std::printf("backend: %s; bf16 native: %s\n",
              pdtrain::kernels::gemm_backend_description().c_str(),
              pdtrain::kernels::gemm_bf16_native() ? "yes" : "no");
  std::printf("ceiling: fp32=%.2f bf16=%.2f ratio=%.3f\n", mean[0], mean[1], mean[1] / mean[0]);
  if (failures) return 1;
  std::printf("bench_matmul: ok\n");
  return 0;
}
