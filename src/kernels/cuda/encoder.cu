// Encoder: out[b,t,:] = wte[tokens[b,t] - vocab_begin,:] + wpe[t,:] over a vocabulary shard,
// and its backward. Every output element gets exactly the CPU's operations in the CPU's order
// (gpt_kernels.hpp), so forward and backward match the CPU bit for bit.
#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

// One thread per output element (grid-stride). Tokens outside the shard contribute 0.
__global__ void encoder_forward_kernel(float* __restrict__ out, const I32* __restrict__ tokens,
                                       const float* __restrict__ wte, const float* __restrict__ wpe,
                                       Index NC, int T, int C, int vocab_begin, int vocab_end) {
  for (Index i = global_thread(); i < NC; i += grid_threads()) {
    const Index bt = i / C, c = i - bt * C, t = bt % T;
    const I32 tok = tokens[bt];
    float y = tok >= vocab_begin && tok < vocab_end ? wte[Index(tok - vocab_begin) * C + c] : 0.0f;
    if (wpe != nullptr) y = y + wpe[t * C + c];  // 0 + p when the token is elsewhere, as the CPU
    out[i] = y;
  }
}

// dwte: repeated tokens add into the same row, so the order of their additions must be fixed
// without atomics. Thread (column c, bucket k) owns the elements dwte[r, c] of the shard's rows
// r with r % kBuckets == k and walks all tokens (b,t) in order, adding dout[b,t,c] where the
// token's row is its own: per element the CPU's sequence of additions. The bucket is the same
// for a whole block (blockIdx.y), so the skip branch never diverges within a warp. Tokens are
// staged in shared memory, kChunk at a time, as shard rows (-1: not in this shard).
constexpr int kBuckets = 32;
constexpr int kWteThreads = 128;
constexpr int kChunk = 2048;  // 8 KiB of shared memory

__global__ void encoder_backward_wte_kernel(float* __restrict__ dwte,
                                            const float* __restrict__ dout,
                                            const I32* __restrict__ tokens, Index N, int C,
                                            int vocab_begin, int vocab_end) {
  __shared__ int rows[kChunk];
  const Index c = Index(blockIdx.x) * blockDim.x + threadIdx.x;
  const int bucket = static_cast<int>(blockIdx.y);
  for (Index base = 0; base < N; base += kChunk) {
    const int len = static_cast<int>(N - base < kChunk ? N - base : kChunk);
    __syncthreads();  // every thread is done with the previous chunk
    for (int j = static_cast<int>(threadIdx.x); j < len; j += static_cast<int>(blockDim.x)) {
      const I32 tok = tokens[base + j];
      rows[j] = tok >= vocab_begin && tok < vocab_end ? tok - vocab_begin : -1;
    }
    __syncthreads();
    if (c < C) {
      for (int j = 0; j < len; ++j) {
        const int r = rows[j];
        if (r < 0 || r % kBuckets != bucket) continue;
        float* d = dwte + Index(r) * C + c;
        *d = *d + dout[(base + j) * C + c];
      }
    }
  }
}

// dwpe[t,c] += sum over b of dout[b,t,c], b in order: one thread per (t,c).
__global__ void encoder_backward_wpe_kernel(float* __restrict__ dwpe,
                                            const float* __restrict__ dout, int B, Index TC) {
  for (Index i = global_thread(); i < TC; i += grid_threads()) {
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += dout[b * TC + i];
    dwpe[i] += acc;
  }
}

}  // namespace

void encoder_forward(cudaStream_t stream, float* out, const I32* tokens, const float* wte,
                     const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end) {
  const Index NC = Index(B) * T * C;
  if (NC <= 0) return;
  PDTRAIN_LAUNCH(encoder_forward_kernel, grid_for(NC), kBlock, 0, stream)(
      out, tokens, wte, wpe, NC, T, C, vocab_begin, vocab_end);
  CUDA_CHECK_LAUNCH();
}

void encoder_backward(cudaStream_t stream, float* dwte, float* dwpe, const float* dout,
                      const I32* tokens, int B, int T, int C, int vocab_begin, int vocab_end) {
  const Index N = Index(B) * T;
  if (N <= 0 || C <= 0) return;
  if (dwte != nullptr) {
    const dim3 grid(static_cast<unsigned>(ceil_div(C, kWteThreads)), kBuckets);
    PDTRAIN_LAUNCH(encoder_backward_wte_kernel, grid, kWteThreads, 0, stream)(
        dwte, dout, tokens, N, C, vocab_begin, vocab_end);
    CUDA_CHECK_LAUNCH();
  }
  if (dwpe != nullptr) {
    const Index TC = Index(T) * C;
    PDTRAIN_LAUNCH(encoder_backward_wpe_kernel, grid_for(TC), kBlock, 0, stream)(dwpe, dout, B, TC);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace pdtrain::kernels::cuda
