// bench_gemm_cuda: the bf16 GEMM ceiling of one NVIDIA GPU at a GPT-2 model's GEMM shapes,
// through cuBLASLt with bf16 inputs and fp32 accumulation (CUBLAS_COMPUTE_32F), as pdtrain's
// CUDA backend calls it (src/kernels/cuda/matmul.cu: fp32 output, 32 MiB workspace, the
// heuristic's first algorithm) and with bf16 output (as llm.c and PyTorch autocast do).
// perf/bench_gpu.sh divides pdtrain's model FLOP/s by the ceiling this prints, measured in the
// same run on the same GPU.
//
// Shapes, row-major as perf/matmul_ceiling.hpp (the CPU ceiling) writes them: each weight
// W[out, in] of a layer (qkv 3C x C, attproj C x C, fc 4C x C, fcproj C x 4C) and the tied LM
// head (Vp x C) gives three GEMMs per step and micro-batch of `tokens` rows:
//   fwd      out  = in W^T    M = tokens, N = out, K = in      (NT), beta 0
//   dinp     din  = dout W    M = tokens, N = in,  K = out     (NN), beta 0
//   dweight  dW  += dout^T in M = out,    N = in,  K = tokens  (TN), beta 1 (accumulates)
// plus one square GEMM (default 8192^3, NT, bf16 output) as the GPU's headline figure.
// Each (shape, output type): every algorithm the heuristic offers (up to --algos), each timed
// with CUDA events around single calls, best of --iters after --warmup untimed calls.
//
// The ceiling is step-weighted: total FLOPs of one micro-batch's GEMMs (each layer shape
// counted n_layer times, the LM head once) over their total best time, i.e. the rate at which
// this model's GEMMs could run if every call ran as fast as cuBLASLt can run it. Printed as
//   ceiling: bf16_tflops=<per shape, best of algorithms and both output types>
//            fp32out_tflops=<fp32 output only> fp32out_heuristic_tflops=<pdtrain's exact call>
//            bf16out_tflops=<bf16 output only> square_tflops=<the square GEMM> ...
//
// Usage: bench_gemm_cuda [--short] [--tokens N] [--d-model C] [--vocab Vp] [--layers L]
//                        [--iters N] [--warmup N] [--algos K] [--square N] [--workspace-mb M]
//   defaults: GPT-2 124M at micro-batch 16 x 1024 (tokens 16384, C 768, Vp 50304, L 12),
//   iters 20, warmup 3, algos 4, square 8192 (0: none), workspace 32 MiB.
//   --short: tokens 1024, C 256, Vp 1024, L 2, iters 3, warmup 1, square 1024 (seconds).
// Before timing, one small GEMM per transpose pair (NT, NN, TN) is checked against a host
// loop, so the shapes timed are the products claimed.
// Exit status: 0 ok, 1 failure (a line with FAIL), 2 bad arguments, 77 no GPU (cudaGetDeviceCount
// reports no device or no/insufficient driver): the SKIP status of ctest and scripts/gpu-check.sh.
//
// Build: perf/CMakeLists.txt in a -DPDTRAIN_CUDA=ON build, or alone:
//   nvcc -std=c++20 -O2 -arch=sm_90 perf/bench_gemm_cuda.cu -lcublasLt -o bench_gemm_cuda
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void fail(const char* what, const char* file, int line, const std::string& why) {
  std::printf("bench_gemm_cuda: FAIL: %s at %s:%d: %s\n", what, file, line, why.c_str());
  std::fflush(stdout);
  std::exit(1);
}
#define CUDA_OK(call)                                                                  \
  do {                                                                                 \
    const cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) fail(#call, __FILE__, __LINE__, cudaGetErrorString(e_));    \
  } while (0)
#define LT_OK(call)                                                                    \
  do {                                                                                 \
    const cublasStatus_t s_ = (call);                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                   \
      fail(#call, __FILE__, __LINE__, cublasLtGetStatusString(s_));                    \
  } while (0)

struct Shape {
  std::string layer;  // qkv, attproj, fc, fcproj, lmhead, square
  std::string pass;   // fwd, dinp, dweight, -
  bool trans_a, trans_b;
  std::int64_t M, N, K;
  int count;          // calls per micro-batch (n_layer for layer shapes, 1 for the head)
  float beta;
  double flops() const { return 2.0 * double(M) * double(N) * double(K); }
};

std::vector<Shape> model_shapes(std::int64_t tokens, std::int64_t C, std::int64_t V, int L) {
  struct W {
    const char* name;
    std::int64_t out, in;
    int count;
  };
  const W weights[] = {{"qkv", 3 * C, C, L},
                       {"attproj", C, C, L},
                       {"fc", 4 * C, C, L},
                       {"fcproj", C, 4 * C, L},
                       {"lmhead", V, C, 1}};
  std::vector<Shape> s;
  for (const W& w : weights) {
    s.push_back({w.name, "fwd", false, true, tokens, w.out, w.in, w.count, 0.0f});
    s.push_back({w.name, "dinp", false, false, tokens, w.in, w.out, w.count, 0.0f});
    s.push_back({w.name, "dweight", true, false, w.out, w.in, tokens, w.count, 1.0f});
  }
  return s;
}

// Deterministic values in [-1, 1), as bf16.
__global__ void fill_bf16(__nv_bfloat16* x, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    x[i] = __float2bfloat16(static_cast<float>(h >> 8) / 8388608.0f - 1.0f);
  }
}

// bf16 bits to float.
float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t u = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// One cuBLASLt matmul of a row-major problem C[M,N] = op(A) op(B) (+ beta C), bf16 A and B,
// fp32 compute, `out` the type of C. Row-major C is column-major C^T = op(B)^T op(A)^T, so
// cuBLASLt's A is our B and its B our A, with the transposes swapped (as pdtrain does).
struct Problem {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  // A plain array: nvcc 13 in C++20 mode with GCC 12's library crashes ("internal error ...
  // find_allocated_name_reference") on a std::vector of cublasLtMatmulHeuristicResult_t.
  static constexpr int kMaxAlgos = 16;
  cublasLtMatmulHeuristicResult_t algos[kMaxAlgos] = {};
  int n_algos = 0;

  Problem(cublasLtHandle_t lt, const Shape& s, cudaDataType_t out, std::size_t workspace,
          int max_algos) {
    LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    const std::int64_t a_rows = s.trans_a ? s.K : s.M, a_cols = s.trans_a ? s.M : s.K;
    const std::int64_t b_rows = s.trans_b ? s.N : s.K, b_cols = s.trans_b ? s.K : s.N;
    LT_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, b_cols, b_rows, b_cols));  // our B
    LT_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, a_cols, a_rows, a_cols));  // our A
    LT_OK(cublasLtMatrixLayoutCreate(&lc, out, s.N, s.M, s.N));
    cublasLtMatmulPreference_t pref = nullptr;
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = workspace;
    LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                               sizeof ws));
    int found = 0;
    const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(
        lt, desc, la, lb, lc, lc, pref, std::clamp(max_algos, 1, kMaxAlgos), algos, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (rc != CUBLAS_STATUS_SUCCESS || found == 0)
      fail("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__,
           std::string("no algorithm for ") + s.layer + " " + s.pass + ": " +
               cublasLtGetStatusString(rc));
    n_algos = found;
  }
  ~Problem() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  cublasStatus_t run(cublasLtHandle_t lt, int algo, const void* A, const void* B, void* C,
                     float beta, void* workspace, std::size_t ws_bytes, cudaStream_t stream) const {
    const float alpha = 1.0f;
    return cublasLtMatmul(lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc,
                          &algos[algo].algo, workspace, ws_bytes, stream);
  }
};

struct Buffers {
  __nv_bfloat16 *A = nullptr, *B = nullptr;
  void* C = nullptr;
  void* workspace = nullptr;
  std::size_t ws_bytes = 0;
};

struct Timing {
  double heuristic_s = 0, best_s = 0;
  int best_algo = 0, algos = 0;
};

Timing time_shape(cublasLtHandle_t lt, const Shape& s, cudaDataType_t out, const Buffers& buf,
                  int max_algos, int warmup, int iters, cudaStream_t stream) {
  Problem p(lt, s, out, buf.ws_bytes, max_algos);
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  Timing t;
  t.best_s = 1e30;
  int usable = 0;
  for (int a = 0; a < p.n_algos; ++a) {
    // An algorithm the heuristic offers may still refuse to run (rare): skip it, unless it is
    // the first, which is the one pdtrain uses.
    cublasStatus_t rc = CUBLAS_STATUS_SUCCESS;
    for (int w = 0; w < warmup && rc == CUBLAS_STATUS_SUCCESS; ++w)
      rc = p.run(lt, a, buf.A, buf.B, buf.C, s.beta, buf.workspace, buf.ws_bytes, stream);
    if (rc != CUBLAS_STATUS_SUCCESS) {
      if (a == 0) LT_OK(rc);
      continue;
    }
    ++usable;
    double best = 1e30;
    for (int i = 0; i < iters; ++i) {
      CUDA_OK(cudaEventRecord(e0, stream));
      LT_OK(p.run(lt, a, buf.A, buf.B, buf.C, s.beta, buf.workspace, buf.ws_bytes, stream));
      CUDA_OK(cudaEventRecord(e1, stream));
      CUDA_OK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, 1e-3 * ms);
    }
    if (a == 0) t.heuristic_s = best;
    if (best < t.best_s) t.best_s = best, t.best_algo = a;
  }
  t.algos = usable;
  CUDA_OK(cudaEventDestroy(e0));
  CUDA_OK(cudaEventDestroy(e1));
  return t;
}

// Small GEMMs of each transpose pair against a host loop (double accumulation).
bool check_products(cublasLtHandle_t lt, const Buffers& buf, cudaStream_t stream) {
  const std::int64_t M = 96, N = 80, K = 64;
  bool ok = true;
  for (int pair = 0; pair < 3; ++pair) {
    const bool ta = pair == 2, tb = pair == 0;  // NT, NN, TN
    Shape s{"check", "-", ta, tb, M, N, K, 1, 0.0f};
    Problem p(lt, s, CUDA_R_32F, buf.ws_bytes, 1);
    std::vector<std::uint16_t> a(M * K), b(K * N);
    CUDA_OK(cudaMemcpy(a.data(), buf.A, a.size() * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(b.data(), buf.B, b.size() * 2, cudaMemcpyDeviceToHost));
    LT_OK(p.run(lt, 0, buf.A, buf.B, buf.C, 0.0f, buf.workspace, buf.ws_bytes, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<float> c(M * N);
    CUDA_OK(cudaMemcpy(c.data(), buf.C, c.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double ref = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          const float x = bf16_to_float(ta ? a[k * M + i] : a[i * K + k]);
          const float y = bf16_to_float(tb ? b[j * K + k] : b[k * N + j]);
          ref += double(x) * double(y);
        }
        worst = std::max(worst, std::fabs(ref - c[i * N + j]));
      }
    const char* name = pair == 0 ? "NT" : pair == 1 ? "NN" : "TN";
    const bool good = worst < 1e-3;  // products of bf16 values are exact in fp32; sums of 64
    std::printf("check %s M=%lld N=%lld K=%lld: max |error| %.2e %s\n", name, (long long)M,
                (long long)N, (long long)K, worst, good ? "ok" : "FAIL");
    ok = ok && good;
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t tokens = 16 * 1024, C = 768, V = 50304, square = 8192;
  int L = 12, iters = 20, warmup = 3, max_algos = 4;
  double workspace_mb = 32;
  bool short_mode = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool v = i + 1 < argc;
    if (a == "--short") short_mode = true;
    else if (a == "--tokens" && v) tokens = std::atoll(argv[++i]);
    else if (a == "--d-model" && v) C = std::atoll(argv[++i]);
    else if (a == "--vocab" && v) V = std::atoll(argv[++i]);
    else if (a == "--layers" && v) L = std::atoi(argv[++i]);
    else if (a == "--iters" && v) iters = std::atoi(argv[++i]);
    else if (a == "--warmup" && v) warmup = std::atoi(argv[++i]);
    else if (a == "--algos" && v) max_algos = std::atoi(argv[++i]);
    else if (a == "--square" && v) square = std::atoll(argv[++i]);
    else if (a == "--workspace-mb" && v) workspace_mb = std::atof(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: bench_gemm_cuda [--short] [--tokens N] [--d-model C] [--vocab Vp] "
                   "[--layers L] [--iters N] [--warmup N] [--algos K] [--square N] "
                   "[--workspace-mb M]\n");
      return 2;
    }
  }
  if (short_mode) tokens = 1024, C = 256, V = 1024, L = 2, iters = 3, warmup = 1, square = 1024;
  if (tokens < 1 || C < 1 || V < 1 || L < 1 || iters < 1 || warmup < 0 || max_algos < 1 || max_algos > 16 ||
      square < 0 || workspace_mb < 0) {
    std::fprintf(stderr, "bench_gemm_cuda: sizes and counts must be positive, --algos at most 16\n");
    return 2;
  }

  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe == cudaErrorNoDevice || probe == cudaErrorInsufficientDriver ||
      (probe == cudaSuccess && devices == 0)) {
    std::printf("bench_gemm_cuda: SKIP: no GPU (cudaGetDeviceCount: %s)\n",
                probe == cudaSuccess ? "0 devices" : cudaGetErrorString(probe));
    return 77;
  }
  if (probe != cudaSuccess) {
    std::printf("bench_gemm_cuda: FAIL: cudaGetDeviceCount: %s\n", cudaGetErrorString(probe));
    return 1;
  }
  CUDA_OK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  int runtime = 0, driver = 0;
  CUDA_OK(cudaRuntimeGetVersion(&runtime));
  CUDA_OK(cudaDriverGetVersion(&driver));
  std::printf("bench_gemm_cuda: %s (sm_%d%d, %d SMs, %.1f GiB), CUDA runtime %d, driver %d, "
              "cuBLASLt %zu\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              double(prop.totalGlobalMem) / (1 << 30), runtime, driver, cublasLtGetVersion());
  std::printf("bench_gemm_cuda: tokens=%lld d_model=%lld vocab=%lld layers=%d; bf16 inputs, fp32 "
              "compute; best of %d after %d warm-up call(s), up to %d algorithm(s); workspace "
              "%.0f MiB\n",
              (long long)tokens, (long long)C, (long long)V, L, iters, warmup, max_algos,
              workspace_mb);

  const std::vector<Shape> shapes = model_shapes(tokens, C, V, L);
  std::int64_t max_a = 96 * 64, max_b = 64 * 80, max_c = 96 * 80;
  auto grow = [&](const Shape& s) {
    max_a = std::max(max_a, s.M * s.K);
    max_b = std::max(max_b, s.K * s.N);
    max_c = std::max(max_c, s.M * s.N);
  };
  for (const Shape& s : shapes) grow(s);
  const Shape sq{"square", "-", false, true, square, square, square, 1, 0.0f};
  if (square > 0) grow(sq);

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cublasLtHandle_t lt;
  LT_OK(cublasLtCreate(&lt));
  Buffers buf;
  buf.ws_bytes = static_cast<std::size_t>(workspace_mb * 1048576.0);
  CUDA_OK(cudaMalloc(&buf.A, std::size_t(max_a) * 2));
  CUDA_OK(cudaMalloc(&buf.B, std::size_t(max_b) * 2));
  CUDA_OK(cudaMalloc(&buf.C, std::size_t(max_c) * 4));
  if (buf.ws_bytes > 0) CUDA_OK(cudaMalloc(&buf.workspace, buf.ws_bytes));
  fill_bf16<<<1024, 256, 0, stream>>>(buf.A, max_a, 0x1234u);
  fill_bf16<<<1024, 256, 0, stream>>>(buf.B, max_b, 0xabcdu);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemsetAsync(buf.C, 0, std::size_t(max_c) * 4, stream));
  CUDA_OK(cudaStreamSynchronize(stream));

  if (!check_products(lt, buf, stream)) {
    std::printf("bench_gemm_cuda: FAIL: a GEMM disagrees with the host loop\n");
    return 1;
  }

  // Step-weighted sums: FLOPs and the best time per output type, the heuristic's fp32 time,
  // and the best of both output types per shape.
  double flops = 0, t_fp32 = 0, t_fp32_heur = 0, t_bf16 = 0, t_best = 0;
  int failures = 0;
  for (const Shape& s : shapes) {
    const Timing f = time_shape(lt, s, CUDA_R_32F, buf, max_algos, warmup, iters, stream);
    const Timing h = time_shape(lt, s, CUDA_R_16BF, buf, max_algos, warmup, iters, stream);
    const double w = s.count;
    flops += w * s.flops();
    t_fp32 += w * f.best_s, t_fp32_heur += w * f.heuristic_s, t_bf16 += w * h.best_s;
    t_best += w * std::min(f.best_s, h.best_s);
    std::printf("gemm %-7s %-7s %c%c M=%-6lld N=%-6lld K=%-6lld x%-3d fp32out: heuristic %7.1f best "
                "%7.1f TFLOP/s (algo %d of %d) | bf16out: heuristic %7.1f best %7.1f TFLOP/s "
                "(algo %d of %d)\n",
                s.layer.c_str(), s.pass.c_str(), s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N',
                (long long)s.M, (long long)s.N, (long long)s.K, s.count,
                s.flops() / f.heuristic_s * 1e-12, s.flops() / f.best_s * 1e-12, f.best_algo,
                f.algos, s.flops() / h.heuristic_s * 1e-12, s.flops() / h.best_s * 1e-12,
                h.best_algo, h.algos);
    if (!(f.best_s > 0 && f.best_s < 1e29 && h.best_s > 0 && h.best_s < 1e29)) {
      std::printf("FAIL: no timing for %s %s\n", s.layer.c_str(), s.pass.c_str());
      ++failures;
    }
  }
  double square_tflops = 0;
  if (square > 0) {
    const Timing h = time_shape(lt, sq, CUDA_R_16BF, buf, max_algos, warmup, iters, stream);
    square_tflops = sq.flops() / h.best_s * 1e-12;
    std::printf("gemm square  -       NT M=%-6lld N=%-6lld K=%-6lld      bf16out: heuristic %7.1f "
                "best %7.1f TFLOP/s (algo %d of %d)\n",
                (long long)square, (long long)square, (long long)square,
                sq.flops() / h.heuristic_s * 1e-12, square_tflops, h.best_algo, h.algos);
  }
  const double per_step = flops;  // one micro-batch's GEMM FLOPs
  std::printf("model GEMMs per micro-batch: %.3f TFLOP (%zu shapes, layer shapes x%d)\n",
              per_step * 1e-12, shapes.size(), L);
  std::printf("ceiling: bf16_tflops=%.1f fp32out_tflops=%.1f fp32out_heuristic_tflops=%.1f "
              "bf16out_tflops=%.1f square_tflops=%.1f\n",
              flops / t_best * 1e-12, flops / t_fp32 * 1e-12, flops / t_fp32_heur * 1e-12,
              flops / t_bf16 * 1e-12, square_tflops);

  cublasLtDestroy(lt);
  cudaFree(buf.A);
  cudaFree(buf.B);
  cudaFree(buf.C);
  if (buf.workspace) cudaFree(buf.workspace);
  cudaStreamDestroy(stream);
  if (failures) return 1;
  std::printf("bench_gemm_cuda: ok\n");
  return 0;
}
