// Softmax cross-entropy over a vocabulary shard (V columns from vocab_begin, rows ld apart), in
// the CPU's phases (gpt_kernels.hpp): no probability array; the backward recomputes the softmax
// and writes dlogits over the logits. One block of kCeBlock threads per row: thread j takes
// columns j, j + kCeBlock, ... and the block reduces in a fixed tree (common.cuh), so a row's sum
// depends on V only. V may be 0 (a shard of padding rows). And the in-order loss sum.
//
// This file is compiled with --fmad=false (cmake/PdtrainCuda.cmake) for sum_losses.
#include <cfloat>

#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

constexpr int kCeBlock = 512;  // 16 warps; a 50304-column row is ~100 columns per thread

// rowmax[n] = max_v logits[n,v] (the lowest float when V = 0).
__global__ void rowmax_kernel(float* __restrict__ rowmax, const float* __restrict__ logits, int V,
                              int ld) {
  __shared__ float shared[kWarp];
  const Index n = blockIdx.x;
  const float* z = logits + n * ld;
  float m = -FLT_MAX;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += kCeBlock) m = fmaxf(m, z[v]);
  m = block_max(m, shared);
  if (threadIdx.x == 0) rowmax[n] = m;
}

// stats[n] = sum over the shard of exp(logits - rowmax); stats[N+n] = target logit - rowmax
// when the shard holds the target, else 0.
__global__ void partials_kernel(float* __restrict__ stats, const float* __restrict__ logits,
                                const float* __restrict__ rowmax, const I32* __restrict__ targets,
                                int vocab_begin, int N, int V, int ld) {
  __shared__ float shared[kWarp];
  const Index n = blockIdx.x;
  const float* z = logits + n * ld;
  const float m = rowmax[n];
  float sum = 0.0f;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += kCeBlock) sum += expf(z[v] - m);
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const I32 t = targets[n] - vocab_begin;
    stats[n] = sum;
    stats[N + n] = t >= 0 && t < V ? z[t] - m : 0.0f;
  }
}

// losses[n] = log(sum) - (target logit - max), one thread per row.
__global__ void losses_kernel(float* __restrict__ losses, const float* __restrict__ stats, int N) {
  const Index n = global_thread();
  if (n < N) losses[n] = logf(stats[n]) - stats[N + n];
}

// In place: z[n,v] = (exp(z - rowmax) / sum - onehot(target)) * dlosses[n], the target counted
// on its shard only; the padding columns V..ld-1 = 0.
__global__ void backward_kernel(float* __restrict__ logits, const float* __restrict__ rowmax,
                                const float* __restrict__ stats, const I32* __restrict__ targets,
                                const float* __restrict__ dlosses, int vocab_begin, int V,
                                int ld) {
  const Index n = blockIdx.x;
  float* z = logits + n * ld;
  const float m = rowmax[n], inv = 1.0f / stats[n], dl = dlosses[n];
  const I32 shifted = targets[n] - vocab_begin;
  const I32 t = shifted < V ? shifted : -1;  // the target's column if this shard holds it
  for (int v = static_cast<int>(threadIdx.x); v < ld; v += kCeBlock) {
    const float p = v < V ? expf(z[v] - m) * inv : 0.0f;
    z[v] = (v == t ? p - 1.0f : p) * dl;
  }
}

// One thread, in order, in double: the CPU's loop, bit for bit.
__global__ void sum_losses_kernel(double* __restrict__ sum, const float* __restrict__ losses,
                                  int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s = __dadd_rn(s, static_cast<double>(losses[i]));
  *sum = s;
}

}  // namespace

void crossentropy_rowmax(cudaStream_t stream, float* rowmax, const float* logits, int N, int V,
                         int ld) {
  if (N <= 0) return;
  PDTRAIN_LAUNCH(rowmax_kernel, static_cast<unsigned>(N), kCeBlock, 0, stream)(rowmax, logits, V,
                                                                                 ld);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_partials(cudaStream_t stream, float* stats, const float* logits,
                           const float* rowmax, const I32* targets, int vocab_begin, int N, int V,
                           int ld) {
  if (N <= 0) return;
  PDTRAIN_LAUNCH(partials_kernel, static_cast<unsigned>(N), kCeBlock, 0, stream)(
      stats, logits, rowmax, targets, vocab_begin, N, V, ld);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_losses(cudaStream_t stream, float* losses, const float* stats, int N) {
  if (N <= 0) return;
  PDTRAIN_LAUNCH(losses_kernel, grid_for(N), kBlock, 0, stream)(losses, stats, N);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_backward(cudaStream_t stream, float* logits, const float* rowmax,
                           const float* stats, const I32* targets, const float* dlosses,
                           int vocab_begin, int N, int V, int ld) {
  if (N <= 0 || ld <= 0) return;
  PDTRAIN_LAUNCH(backward_kernel, static_cast<unsigned>(N), kCeBlock, 0, stream)(
      logits, rowmax, stats, targets, dlosses, vocab_begin, V, ld);
  CUDA_CHECK_LAUNCH();
}

void sum_losses(cudaStream_t stream, double* sum, const float* losses, int n) {
  PDTRAIN_LAUNCH(sum_losses_kernel, 1, 1, 0, stream)(sum, losses, n > 0 ? n : 0);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pdtrain::kernels::cuda
