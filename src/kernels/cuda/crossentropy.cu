// Softmax cross-entropy over a vocabulary shard (V columns from vocab_begin), in the CPU's three
// phases (gpt_kernels.hpp) plus its backward, and the in-order loss sum. One block of kCeBlock
// threads per row: thread j takes columns j, j + kCeBlock, ... and the block reduces in a fixed
// tree (common.cuh), so a row's sum depends on V only. V may be 0 (a shard of padding rows).
//
// This file is compiled with --fmad=false (cmake/PdtrainCuda.cmake) for sum_losses.
#include <cfloat>

#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

constexpr int kCeBlock = 512;  // 16 warps; a 50304-column row is ~100 columns per thread

// rowmax[n] = max_v logits[n,v] (the lowest float when V = 0).
__global__ void rowmax_kernel(float* __restrict__ rowmax, const float* __restrict__ logits, int V) {
  __shared__ float shared[kWarp];
  const Index n = blockIdx.x;
  const float* z = logits + n * V;
  float m = -FLT_MAX;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += kCeBlock) m = fmaxf(m, z[v]);
  m = block_max(m, shared);
  if (threadIdx.x == 0) rowmax[n] = m;
}

// probs[n,v] = exp(logits - rowmax) (unnormalized); stats[n] = their sum over the shard;
// stats[N+n] = target logit - rowmax when the shard holds the target, else 0.
__global__ void partials_kernel(float* __restrict__ stats, float* __restrict__ probs,
                                const float* __restrict__ logits, const float* __restrict__ rowmax,
                                const I32* __restrict__ targets, int vocab_begin, int N, int V) {
  __shared__ float shared[kWarp];
  const Index n = blockIdx.x;
  const float* z = logits + n * V;
  float* p = probs + n * V;
  const float m = rowmax[n];
  float sum = 0.0f;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += kCeBlock) {
    const float e = expf(z[v] - m);
    p[v] = e;
    sum += e;
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const I32 t = targets[n] - vocab_begin;
    stats[n] = sum;
    stats[N + n] = t >= 0 && t < V ? z[t] - m : 0.0f;
  }
}

// probs normalized by the (all-shard) sum; losses[n] = log(sum) - (target logit - max).
__global__ void finish_kernel(float* __restrict__ losses, float* __restrict__ probs,
                              const float* __restrict__ stats, int N, int V) {
  const Index n = blockIdx.x;
  const float inv = 1.0f / stats[n];
  float* p = probs + n * V;
  for (int v = static_cast<int>(threadIdx.x); v < V; v += kCeBlock) p[v] *= inv;
  if (threadIdx.x == 0) losses[n] = logf(stats[n]) - stats[N + n];
}

// dlogits[n,v] += (or =) (probs - onehot(target)) * dlosses[n], the target counted on its shard
// only.
__global__ void backward_kernel(float* __restrict__ dlogits, const float* __restrict__ probs,
                                const I32* __restrict__ targets, const float* __restrict__ dlosses,
                                int V, int vocab_begin, bool overwrite) {
  const Index n = blockIdx.x;
  const float dl = dlosses[n];
  const float* p = probs + n * V;
  float* d = dlogits + n * V;
  const I32 t = targets[n] - vocab_begin;  // a column of this shard when 0 <= t < V
  for (int v = static_cast<int>(threadIdx.x); v < V; v += kCeBlock)
    d[v] = (overwrite ? 0.0f : d[v]) + (v == t ? p[v] - 1.0f : p[v]) * dl;
}

// One thread, in order, in double: the CPU's loop, bit for bit.
__global__ void sum_losses_kernel(double* __restrict__ sum, const float* __restrict__ losses,
                                  int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s = __dadd_rn(s, static_cast<double>(losses[i]));
  *sum = s;
}

}  // namespace

void crossentropy_rowmax(cudaStream_t stream, float* rowmax, const float* logits, int N, int V) {
  if (N <= 0) return;
  PDTRAIN_LAUNCH(rowmax_kernel, static_cast<unsigned>(N), kCeBlock, 0, stream)(rowmax, logits, V);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_partials(cudaStream_t stream, float* stats, float* probs, const float* logits,
                           const float* rowmax, const I32* targets, int vocab_begin, int N, int V) {
  if (N <= 0) return;
  PDTRAIN_LAUNCH(partials_kernel, static_cast<unsigned>(N), kCeBlock, 0, stream)(
      stats, probs, logits, rowmax, targets, vocab_begin, N, V);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_finish(cudaStream_t stream, float* losses, float* probs, const float* stats,
                         int N, int V) {
  if (N <= 0) return;
  PDTRAIN_LAUNCH(finish_kernel, static_cast<unsigned>(N), kCeBlock, 0, stream)(
      losses, probs, stats, N, V);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_backward(cudaStream_t stream, float* dlogits, const float* probs,
                           const I32* targets, const float* dlosses, int N, int V,
                           int vocab_begin, bool overwrite) {
  if (N <= 0 || V <= 0) return;
  PDTRAIN_LAUNCH(backward_kernel, static_cast<unsigned>(N), kCeBlock, 0, stream)(
      dlogits, probs, targets, dlosses, V, vocab_begin, overwrite);
  CUDA_CHECK_LAUNCH();
}

void sum_losses(cudaStream_t stream, double* sum, const float* losses, int n) {
  PDTRAIN_LAUNCH(sum_losses_kernel, 1, 1, 0, stream)(sum, losses, n > 0 ? n : 0);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pdtrain::kernels::cuda
