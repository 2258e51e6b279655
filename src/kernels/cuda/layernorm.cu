// LayerNorm (eps 1e-5) over rows of C, forward (fp32 or bf16 output) and backward. One warp
// per row for the row-wise work (lane j takes columns j, j+32, ...; warp sums in a fixed
// butterfly); the weight and bias gradients are column sums in two deterministic stages.
#include "column_sums.cuh"
#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = kBlock / kWarp;  // one warp per row

__device__ __forceinline__ void store(float* y, float v) { *y = v; }
__device__ __forceinline__ void store(bf16* y, float v) { *y = pdtrain::to_bf16(v); }

// Mean, then the two-pass variance (no cancellation when |mean| >> std), as the CPU. The output
// (x - m) s w + b is rounded step by step in the CPU's order (no FMA contraction), so the bf16
// output is exactly the fp32 output rounded.
template <class Out>
__global__ void layernorm_forward_kernel(Out* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, const float* __restrict__ inp,
                                         const float* __restrict__ weight,
                                         const float* __restrict__ bias, int N, int C) {
  const Index row = Index(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= N) return;  // the whole warp: warp_sum below needs all 32 lanes
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float* x = inp + row * C;
  float sum = 0.0f;
  for (int i = lane; i < C; i += kWarp) sum += x[i];
  const float m = warp_sum(sum) / static_cast<float>(C);
  float sq = 0.0f;
  for (int i = lane; i < C; i += kWarp) {
    const float d = x[i] - m;
    sq += d * d;
  }
  const float var = warp_sum(sq) / static_cast<float>(C);
  const float s = 1.0f / sqrtf(var + 1e-5f);
  Out* y = out + row * C;
  for (int i = lane; i < C; i += kWarp)
    store(y + i, __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x[i], m), s), weight[i]), bias[i]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp += (or =) (w dy - mean(w dy) - norm mean(w dy norm)) s, one warp per row.
__global__ void layernorm_backward_inp_kernel(float* __restrict__ dinp,
                                              const float* __restrict__ dout,
                                              const float* __restrict__ inp,
                                              const float* __restrict__ weight,
                                              const float* __restrict__ mean,
                                              const float* __restrict__ rstd, int N, int C,
                                              bool overwrite) {
  const Index row = Index(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= N) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float a1 = 0.0f, a2 = 0.0f;  // sums of dnorm and dnorm * norm
  for (int i = lane; i < C; i += kWarp) {
    const float dnorm = weight[i] * dy[i];
    a1 += dnorm;
    a2 += dnorm * (x[i] - m) * s;
  }
  const float dnorm_mean = warp_sum(a1) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(a2) / static_cast<float>(C);
  float* dx = dinp + row * C;
  for (int i = lane; i < C; i += kWarp) {
    const float norm = (x[i] - m) * s;
    dx[i] = (overwrite ? 0.0f : dx[i]) +
            (weight[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// The terms of dweight (norm * dy) and dbias (dy) of row n, column c, for column_sums.
struct LayernormParamTerms {
  const float* __restrict__ dout;
  const float* __restrict__ inp;
  const float* __restrict__ mean;
  const float* __restrict__ rstd;
  int C;
  __device__ __forceinline__ void operator()(Index n, Index c, float (&acc)[2]) const {
    const float dy = dout[n * C + c];
    acc[0] += (inp[n * C + c] - mean[n]) * rstd[n] * dy;
    acc[1] += dy;
  }
};

template <class Out>
void layernorm_forward_impl(cudaStream_t stream, Out* out, float* mean, float* rstd,
                            const float* inp, const float* weight, const float* bias, int N,
                            int C) {
  if (N <= 0) return;
  PDTRAIN_LAUNCH(layernorm_forward_kernel,
                 static_cast<unsigned>(ceil_div(N, kRowsPerBlock)), kBlock, 0, stream)(
      out, mean, rstd, inp, weight, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_forward(cudaStream_t stream, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  layernorm_forward_impl(stream, out, mean, rstd, inp, weight, bias, N, C);
}
void layernorm_forward(cudaStream_t stream, bf16* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  layernorm_forward_impl(stream, out, mean, rstd, inp, weight, bias, N, C);
}

Index layernorm_backward_scratch(int N, int C) { return column_sums_scratch(2, N, C); }

void layernorm_backward(cudaStream_t stream, float* scratch, float* dinp, float* dweight,
                        float* dbias, const float* dout, const float* inp, const float* weight,
                        const float* mean, const float* rstd, int N, int C, bool overwrite) {
  if (N <= 0 || C <= 0) return;
  PDTRAIN_LAUNCH(layernorm_backward_inp_kernel,
                 static_cast<unsigned>(ceil_div(N, kRowsPerBlock)), kBlock, 0, stream)(
      dinp, dout, inp, weight, mean, rstd, N, C, overwrite);
  CUDA_CHECK_LAUNCH();
  column_sums<2>(stream, scratch, {dweight, dbias}, N, C,
                 LayernormParamTerms{dout, inp, mean, rstd, C});
}

}  // namespace pdtrain::kernels::cuda
