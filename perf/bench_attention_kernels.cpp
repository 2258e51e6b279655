// bench_attention_kernels: causal attention's kernels on one NVIDIA GPU at a GPT-2 shape, each
// timed against the tensor-core bound of that shape:
//   flash bf16   flash_attention_forward/backward with bf16 tiles (WMMA, fp32 accumulation)
//   flash fp32   the same kernels with fp32 tiles on the CUDA cores
//   cublas fp32  attention.cu's path: cuBLASLt GEMMs over the full T x T square (fp32, no TF32)
//                and the softmax kernels, with the B*NH*T*T score and probability arrays
//   cudnn bf16   cuDNN's fused attention through the graph pdtrain builds (cudnn_sdpa.hpp:
//                bf16 q, k, v, out and dout, the deterministic backward), where cuDNN takes the
//                shape ("attention cudnn refused: <why>" otherwise); the family's bf16
//                conversions around it are not timed
// Useful FLOPs of causal attention (the lower triangle, T(T+1)/2 score pairs per head):
// forward 2 products (q k^T, P v), backward 4 (dP, dv, dq, dk), each 2 * HS flops per pair.
// The bound is those FLOPs at --peak-tflops (default 989: an H100/H200 SXM's dense bf16 tensor
// core rate); fraction = bound / measured time. The fp32 paths are shown against the same bound
// (what a tensor-core kernel could reach), not against the CUDA cores' fp32 rate.
//
// Before timing, the flash forward's output (both variants) is compared with the cuBLAS path's
// on the same inputs, so the kernels timed compute attention. Each timing: CUDA events around
// --iters calls after --warmup untimed ones, best of --repeats.
//
// Usage: bench_attention_kernels [--batch B] [--seq T] [--heads NH] [--head-size HS]
//                                [--iters N] [--warmup N] [--repeats N] [--peak-tflops P]
//   defaults: GPT-2 124M, B 16, T 1024, NH 12, HS 64; iters 10, warmup 2, repeats 3.
// Exit status: 0 ok, 1 failure (a line with FAIL), 2 bad arguments, 77 no GPU, or the emulated
// CUDA target (its timings mean nothing: it says so and times nothing).
// Built in -DPDTRAIN_CUDA=ON builds (perf/CMakeLists.txt), never in the emulated one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../src/kernels/cuda/cudnn_sdpa.hpp"
#include "../src/kernels/cuda/flash_attention.hpp"
#include "../src/kernels/cuda/launch.hpp"

#ifdef PDTRAIN_CUDA_EMULATED
int main() {
  std::printf("bench_attention_kernels: the emulated CUDA target runs kernels on the CPU: timing "
              "is not measurable there; nothing timed\n");
  return 77;
}
#else
namespace {

namespace kc = pdtrain::kernels::cuda;

void fail(const char* what, int line, const std::string& why) {
  std::printf("bench_attention_kernels: FAIL: %s at line %d: %s\n", what, line, why.c_str());
  std::fflush(stdout);
  std::exit(1);
}
#define CUDA_OK(call)                                                    \
  do {                                                                   \
    const cudaError_t e_ = (call);                                       \
    if (e_ != cudaSuccess) fail(#call, __LINE__, cudaGetErrorString(e_)); \
  } while (0)

struct Config {
  int B = 16, T = 1024, NH = 12, HS = 64;
  int iters = 10, warmup = 2, repeats = 3;
  double peak_tflops = 989.0;
};

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool v = i + 1 < argc;
    if (a == "--batch" && v) c.B = std::atoi(argv[++i]);
    else if (a == "--seq" && v) c.T = std::atoi(argv[++i]);
    else if (a == "--heads" && v) c.NH = std::atoi(argv[++i]);
    else if (a == "--head-size" && v) c.HS = std::atoi(argv[++i]);
    else if (a == "--iters" && v) c.iters = std::atoi(argv[++i]);
    else if (a == "--warmup" && v) c.warmup = std::atoi(argv[++i]);
    else if (a == "--repeats" && v) c.repeats = std::atoi(argv[++i]);
    else if (a == "--peak-tflops" && v) c.peak_tflops = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "bench_attention_kernels: unknown or incomplete argument '%s'\n",
                   a.c_str());
      std::exit(2);
    }
  }
  if (c.B < 1 || c.T < 1 || c.NH < 1 || c.HS < 1 || c.iters < 1 || c.repeats < 1 ||
      c.peak_tflops <= 0 || !kc::flash_attention_supported(c.NH * c.HS, c.NH)) {
    std::fprintf(stderr, "bench_attention_kernels: bad shape or counts (head size at most %d)\n",
                 kc::kFlashMaxHeadSize);
    std::exit(2);
  }
  return c;
}

struct DeviceFloats {
  float* p = nullptr;
  explicit DeviceFloats(std::size_t n) { CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(float))); }
  ~DeviceFloats() { cudaFree(p); }
};

std::vector<float> host_values(std::size_t n, std::uint32_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    v[i] = static_cast<float>(h >> 8) / 8388608.0f - 1.0f;  // [-1, 1)
  }
  return v;
}

// Best milliseconds per call of `f` over the repeats.
template <class F>
double time_ms(const Config& c, cudaStream_t stream, F f) {
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  for (int i = 0; i < c.warmup; ++i) f();
  double best = 1e30;
  for (int r = 0; r < c.repeats; ++r) {
    CUDA_OK(cudaEventRecord(start, stream));
    for (int i = 0; i < c.iters; ++i) f();
    CUDA_OK(cudaEventRecord(stop, stream));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, double(ms) / c.iters);
  }
  CUDA_OK(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

void report(const Config& c, const char* kernel, const char* pass, double ms, double products) {
  const double pairs = double(c.B) * c.NH * (double(c.T) * (c.T + 1) / 2);
  const double flops = products * 2.0 * c.HS * pairs;
  const double bound_ms = flops / (c.peak_tflops * 1e12) * 1e3;
  std::printf("attention %-12s %-8s B=%d T=%d NH=%d HS=%d ms=%.4f tflops=%.2f bound_ms=%.4f "
              "fraction=%.4f\n",
              kernel, pass, c.B, c.T, c.NH, c.HS, ms, flops / (ms * 1e-3) / 1e12, bound_ms,
              bound_ms / ms);
}

std::vector<float> download(const float* p, std::size_t n) {
  std::vector<float> h(n);
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// The flash forward's output against the cuBLAS path's (the latter in fp32 throughout).
void check_same_function(const std::vector<float>& flash, const std::vector<float>& cublas,
                         const char* what, double tol) {
  double worst = 0;
  for (std::size_t i = 0; i < flash.size(); ++i)
    worst = std::max(worst, double(std::abs(flash[i] - cublas[i])));
  std::printf("check %s out vs cublas: max_abs_diff=%.3g (tolerance %.1g) %s\n", what, worst, tol,
              worst <= tol ? "ok" : "FAIL");
  if (!(worst <= tol)) std::exit(1);
}

// cuDNN's forward checked against the cuBLAS path's output, then timed like the others.
void bench_cudnn(const Config& c, cudaStream_t stream, const float* qkv, const float* dout,
                 const std::vector<float>& reference) {
  const kc::SdpaShape s{c.B, c.T, c.NH, c.HS};
  kc::CudnnSdpa sdpa(stream);
  std::printf("attention cudnn version=%s\n", kc::cudnn_version().c_str());
  if (const std::string& why = sdpa.refusal(s); !why.empty()) {
    std::printf("attention cudnn refused: %s\n", why.c_str());
    return;
  }
  const std::size_t n = std::size_t(c.B) * c.T * c.NH * c.HS, rows = std::size_t(c.B) * c.NH * c.T;
  const std::size_t ws_bytes = std::max(sdpa.workspace_bytes(s), sdpa.backward_scratch_bytes(s));
  DeviceFloats qkv16((3 * n + 1) / 2), out16((n + 1) / 2), dout16((n + 1) / 2),
      dqkv16((3 * n + 1) / 2), stats(rows), out(n), ws(ws_bytes / sizeof(float) + 1);
  using pdtrain::bf16;
  auto* q = reinterpret_cast<bf16*>(qkv16.p);
  auto* o = reinterpret_cast<bf16*>(out16.p);
  auto* g = reinterpret_cast<bf16*>(dout16.p);
  auto* dq = reinterpret_cast<bf16*>(dqkv16.p);
  kc::to_bf16(stream, q, qkv, 3 * n);
  kc::to_bf16(stream, g, dout, n);
  sdpa.forward(s, o, stats.p, q, ws.p);
  kc::to_float(stream, out.p, o, n);
  check_same_function(download(out.p, n), reference, "cudnn bf16", 2e-2);
  report(c, "cudnn_bf16", "forward",
         time_ms(c, stream, [&] { sdpa.forward(s, o, stats.p, q, ws.p); }), 2);
  report(c, "cudnn_bf16", "backward",
         time_ms(c, stream, [&] { sdpa.backward(s, dq, g, q, o, stats.p, ws.p); }), 4);
}

}  // namespace

int main(int argc, char** argv) {
  const Config c = parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_attention_kernels: no GPU visible\n");
    return 77;
  }
  const int C = c.NH * c.HS;
  const std::size_t n_qkv = std::size_t(c.B) * c.T * 3 * C, n_out = std::size_t(c.B) * c.T * C;
  const std::size_t rows = std::size_t(c.B) * c.NH * c.T, n_att = rows * c.T;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  DeviceFloats qkv(n_qkv), dout(n_out), out(n_out), dqkv(n_qkv), lse(rows), scratch(rows),
      preatt(n_att), att(n_att), dpreatt(n_att), datt(n_att);
  const std::vector<float> h_qkv = host_values(n_qkv, 1), h_dout = host_values(n_out, 2);
  CUDA_OK(cudaMemcpy(qkv.p, h_qkv.data(), n_qkv * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dout.p, h_dout.data(), n_out * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dqkv.p, 0, n_qkv * sizeof(float)));
  const std::size_t workspace_bytes = 32u << 20;
  void* workspace = nullptr;
  CUDA_OK(cudaMalloc(&workspace, workspace_bytes));
  kc::Gemm gemm(stream, workspace, workspace_bytes);

  const auto cublas_forward = [&] {
    kc::attention_forward(gemm, stream, out.p, preatt.p, att.p, qkv.p, c.B, c.T, C, c.NH);
  };
  const auto cublas_backward = [&] {
    kc::attention_backward(gemm, stream, dqkv.p, dpreatt.p, datt.p, dout.p, qkv.p, att.p, c.B,
                           c.T, C, c.NH);
  };
  cublas_forward();
  const std::vector<float> reference = download(out.p, n_out);
  for (const bool bf16 : {true, false}) {
    kc::flash_attention_forward(stream, out.p, lse.p, qkv.p, c.B, c.T, C, c.NH, bf16);
    check_same_function(download(out.p, n_out), reference, bf16 ? "flash bf16" : "flash fp32",
                        bf16 ? 2e-2 : 1e-4);
  }

  for (const bool bf16 : {true, false}) {
    const char* name = bf16 ? "flash_bf16" : "flash_fp32";
    const auto fwd = [&] {
      kc::flash_attention_forward(stream, out.p, lse.p, qkv.p, c.B, c.T, C, c.NH, bf16);
    };
    report(c, name, "forward", time_ms(c, stream, fwd), 2);
    fwd();
    report(c, name, "backward", time_ms(c, stream, [&] {
             kc::flash_attention_backward(stream, dqkv.p, scratch.p, dout.p, qkv.p, out.p, lse.p,
                                          c.B, c.T, C, c.NH, bf16);
           }), 4);
  }
  bench_cudnn(c, stream, qkv.p, dout.p, reference);
  report(c, "cublas_fp32", "forward", time_ms(c, stream, cublas_forward), 2);
  cublas_forward();  // the att the backward reads
  report(c, "cublas_fp32", "backward", time_ms(c, stream, cublas_backward), 4);
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaFree(workspace);
  cudaStreamDestroy(stream);
  std::printf("bench_attention_kernels: ok\n");
  return 0;
}
#endif  // PDTRAIN_CUDA_EMULATED
