// Softmax cross-entropy over a vocabulary shard (V columns from vocab_begin, rows ld apart), in
// the CPU's phases (gpt_kernels.hpp): no probability array; the backward recomputes the softmax
// and writes dlogits over the logits. One block of kCeBlock threads per row: thread j takes
// columns j, j + kCeBlock, ... and the block reduces in a fixed tree (common.cuh), so a row's sum
// depends on V only. V may be 0 (a shard of padding rows). bf16 logits (a GPU's bf16 runs) take
// one fused pass each way instead (below). And the in-order loss sum.
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

// bf16 logits, the fused classifier: llm.c's one read of the logits in forward and one read
// and write in backward, four columns at a time where the row's alignment allows (kVec: every
// row 8-byte aligned; the tail columns one at a time).

// Each thread keeps the max m of its columns and the sum s of exp(z - m), rescaled when m grows
// (an online softmax); the block then moves every thread's sum to the row's max M (exact
// combine: s exp(m - M)) and sums them in common.cuh's fixed order.
struct OnlineSum {
  float m = -FLT_MAX, s = 0.0f;
  __device__ void add(float z) {
    if (z > m) {
      s = s * expf(m - z) + 1.0f;
      m = z;
    } else {
      s += expf(z - m);
    }
  }
};

// rowmax[n] = the shard's max M, stats[n] = sum of exp(z - M), stats[N+n] = target logit - M on
// the target's shard (else 0), stats[2N+n] = M (for crossentropy_rescale).
template <bool kVec>
__global__ void forward_bf16_kernel(float* __restrict__ rowmax, float* __restrict__ stats,
                                    const bf16* __restrict__ logits,
                                    const I32* __restrict__ targets, int vocab_begin, int N,
                                    int V, int ld) {
  __shared__ float shared[kWarp];
  const Index n = blockIdx.x;
  const bf16* z = logits + n * ld;
  OnlineSum row;
  const int V4 = kVec ? V / 4 : 0;
  for (int i = static_cast<int>(threadIdx.x); i < V4; i += kCeBlock) {
    const float4 q = load4(z, i);
    row.add(q.x), row.add(q.y), row.add(q.z), row.add(q.w);
  }
  for (int v = 4 * V4 + static_cast<int>(threadIdx.x); v < V; v += kCeBlock) row.add(load1(z, v));
  const float M = block_max(row.m, shared);
  const float sum = block_sum(row.s * expf(row.m - M), shared);
  if (threadIdx.x == 0) {
    const I32 t = targets[n] - vocab_begin;
    rowmax[n] = M;
    stats[n] = sum;
    stats[N + n] = t >= 0 && t < V ? load1(z, t) - M : 0.0f;
    stats[2 * Index(N) + n] = M;
  }
}

// The shard's statistics moved from its max (stats[2N+n]) to the group's (rowmax[n]).
__global__ void rescale_kernel(float* __restrict__ stats, const float* __restrict__ rowmax,
                               const I32* __restrict__ targets, int vocab_begin, int N, int V) {
  for (Index n = global_thread(); n < N; n += grid_threads()) {
    const float shift = stats[2 * Index(N) + n] - rowmax[n];
    const I32 t = targets[n] - vocab_begin;
    stats[n] *= expf(shift);
    if (t >= 0 && t < V) stats[N + n] += shift;
  }
}

// In place: z[n,v] = bf16((exp(z - rowmax) / sum - onehot(target)) * dlosses[n]), the target
// counted on its shard only; the padding columns V..ld-1 = 0.
template <bool kVec>
__global__ void backward_bf16_kernel(bf16* __restrict__ logits, const float* __restrict__ rowmax,
                                     const float* __restrict__ stats,
                                     const I32* __restrict__ targets,
                                     const float* __restrict__ dlosses, int vocab_begin, int V,
                                     int ld) {
  const Index n = blockIdx.x;
  bf16* z = logits + n * ld;
  const float m = rowmax[n], inv = 1.0f / stats[n], dl = dlosses[n];
  const I32 shifted = targets[n] - vocab_begin;
  const I32 t = shifted < V ? shifted : -1;  // the target's column if this shard holds it
  const auto grad = [&](int v, float x) {
    const float p = v < V ? expf(x - m) * inv : 0.0f;
    return (v == t ? p - 1.0f : p) * dl;
  };
  const int ld4 = kVec ? ld / 4 : 0;
  for (int i = static_cast<int>(threadIdx.x); i < ld4; i += kCeBlock) {
    const float4 q = load4(z, i);
    const int v = 4 * i;
    store4(z, i, make_float4(grad(v, q.x), grad(v + 1, q.y), grad(v + 2, q.z), grad(v + 3, q.w)));
  }
  for (int v = 4 * ld4 + static_cast<int>(threadIdx.x); v < ld; v += kCeBlock)
    store1(z, v, grad(v, load1(z, v)));
}

// Whether every row of bf16 logits ld apart takes four-column accesses.
bool rows_vector_aligned(const bf16* logits, int ld) {
  return vector_aligned(logits) && ld % 4 == 0;
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

void crossentropy_forward(cudaStream_t stream, float* rowmax, float* stats, const bf16* logits,
                          const I32* targets, int vocab_begin, int N, int V, int ld) {
  if (N <= 0) return;
  const auto kernel = rows_vector_aligned(logits, ld) ? forward_bf16_kernel<true>
                                                      : forward_bf16_kernel<false>;
  PDTRAIN_LAUNCH_AS("forward_bf16_kernel", kernel, static_cast<unsigned>(N), kCeBlock, 0,
                    stream)(rowmax, stats, logits, targets, vocab_begin, N, V, ld);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_rescale(cudaStream_t stream, float* stats, const float* rowmax,
                          const I32* targets, int vocab_begin, int N, int V) {
  if (N <= 0) return;
  PDTRAIN_LAUNCH(rescale_kernel, grid_for(N), kBlock, 0, stream)(stats, rowmax, targets,
                                                                 vocab_begin, N, V);
  CUDA_CHECK_LAUNCH();
}

void crossentropy_backward(cudaStream_t stream, bf16* logits, const float* rowmax,
                           const float* stats, const I32* targets, const float* dlosses,
                           int vocab_begin, int N, int V, int ld) {
  if (N <= 0 || ld <= 0) return;
  const auto kernel = rows_vector_aligned(logits, ld) ? backward_bf16_kernel<true>
                                                      : backward_bf16_kernel<false>;
  PDTRAIN_LAUNCH_AS("backward_bf16_kernel", kernel, static_cast<unsigned>(N), kCeBlock, 0,
                    stream)(logits, rowmax, stats, targets, dlosses, vocab_begin, V, ld);
  CUDA_CHECK_LAUNCH();
}

void sum_losses(cudaStream_t stream, double* sum, const float* losses, int n) {
  PDTRAIN_LAUNCH(sum_losses_kernel, 1, 1, 0, stream)(sum, losses, n > 0 ? n : 0);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pdtrain::kernels::cuda
