// Causal multi-head self-attention over qkv[B,T,3C] with the CPU's buffers and math
// (gpt_kernels.hpp): preatt = scale q k^T and out = att v as GEMMs over the full T x T square
// (masked probabilities are exact zeros), the causal softmax between them one warp per row.
//
// GEMMs: head h of sequence b reads q at qkv + b*T*3C + h*HS (row stride 3C), k at +C, v at
// +2C. Over h that is a constant stride HS, over (b,h) it is not, so each GEMM is one cuBLASLt
// call per sequence b with the NH heads as a strided batch (stride HS in qkv, dout, out and
// dqkv; T*T in preatt/att). The heads' columns interleave in memory but never overlap, and the
// backward accumulates into dqkv directly (beta = 1), as the CPU does: no permuted copies.
#include <cmath>

#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = kBlock / kWarp;  // one warp per row (b,h,t)

// att[row, t2] = softmax over keys t2 <= t of preatt[row, :]; masked entries of both preatt and
// att set to 0. Lane j takes keys j, j+32, ...; max and sum over the warp in a fixed butterfly.
__global__ void causal_softmax_forward_kernel(float* __restrict__ att,
                                              float* __restrict__ preatt, Index rows, int T) {
  const Index row = Index(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int n = static_cast<int>(row % T) + 1;  // keys 0..t
  float* pre = preatt + row * T;
  float* a = att + row * T;
  float m = -FLT_MAX;
  for (int t2 = lane; t2 < n; t2 += kWarp) m = fmaxf(m, pre[t2]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int t2 = lane; t2 < n; t2 += kWarp) {
    const float e = expf(pre[t2] - m);
    a[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);  // sum >= 1: the max term is exp(0)
  for (int t2 = lane; t2 < n; t2 += kWarp) a[t2] *= inv;  // the lane's own writes above
  for (int t2 = n + lane; t2 < T; t2 += kWarp) a[t2] = pre[t2] = 0.0f;
}

// dpreatt = scale * a * (datt - sum_t2 a datt) over keys t2 <= t; masked entries of dpreatt and
// datt set to 0. One warp per row.
__global__ void causal_softmax_backward_kernel(float* __restrict__ dpreatt,
                                               float* __restrict__ datt,
                                               const float* __restrict__ att, Index rows, int T,
                                               float scale) {
  const Index row = Index(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int n = static_cast<int>(row % T) + 1;
  const float* a = att + row * T;
  float* da = datt + row * T;
  float* dpre = dpreatt + row * T;
  float dot = 0.0f;
  for (int t2 = lane; t2 < n; t2 += kWarp) dot += a[t2] * da[t2];
  const float weighted = warp_sum(dot);
  for (int t2 = lane; t2 < n; t2 += kWarp) dpre[t2] = scale * (a[t2] * (da[t2] - weighted));
  for (int t2 = n + lane; t2 < T; t2 += kWarp) dpre[t2] = da[t2] = 0.0f;
}

unsigned row_blocks(Index rows) { return static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)); }

}  // namespace

void attention_forward(Gemm& gemm, cudaStream_t stream, float* out, float* preatt, float* att,
                       const float* qkv, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || NH <= 0) return;
  const int HS = C / NH;
  const Index C3 = 3 * Index(C), TT = Index(T) * T, rows = Index(B) * NH * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  for (int b = 0; b < B; ++b) {  // preatt = scale q k^T
    const float* q = qkv + Index(b) * T * C3;
    gemm.run({.trans_b = true, .M = T, .N = T, .K = HS, .alpha = scale,
              .A = q, .lda = C3, .stride_a = HS,
              .B = q + C, .ldb = C3, .stride_b = HS,
              .beta = 0.0f, .C = preatt + Index(b) * NH * TT, .ldc = T, .stride_c = TT,
              .batch = NH});
  }
  PDTRAIN_LAUNCH(causal_softmax_forward_kernel, row_blocks(rows), kBlock, 0, stream)(
      att, preatt, rows, T);
  CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; ++b) {  // out = att v
    gemm.run({.M = T, .N = HS, .K = T,
              .A = att + Index(b) * NH * TT, .lda = T, .stride_a = TT,
              .B = qkv + Index(b) * T * C3 + 2 * C, .ldb = C3, .stride_b = HS,
              .beta = 0.0f, .C = out + Index(b) * T * C, .ldc = C, .stride_c = HS,
              .batch = NH});
  }
}

void attention_backward(Gemm& gemm, cudaStream_t stream, float* dqkv, float* dpreatt, float* datt,
                        const float* dout, const float* qkv, const float* att, int B, int T,
                        int C, int NH) {
  if (B <= 0 || T <= 0 || NH <= 0) return;
  const int HS = C / NH;
  const Index C3 = 3 * Index(C), TT = Index(T) * T, rows = Index(B) * NH * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  for (int b = 0; b < B; ++b) {  // out = att v:  datt = dy v^T,  dv += att^T dy
    const float* dy = dout + Index(b) * T * C;
    const float* v = qkv + Index(b) * T * C3 + 2 * C;
    const float* a = att + Index(b) * NH * TT;
    gemm.run({.trans_b = true, .M = T, .N = T, .K = HS,
              .A = dy, .lda = C, .stride_a = HS,
              .B = v, .ldb = C3, .stride_b = HS,
              .beta = 0.0f, .C = datt + Index(b) * NH * TT, .ldc = T, .stride_c = TT,
              .batch = NH});
    gemm.run({.trans_a = true, .M = T, .N = HS, .K = T,
              .A = a, .lda = T, .stride_a = TT,
              .B = dy, .ldb = C, .stride_b = HS,
              .beta = 1.0f, .C = dqkv + Index(b) * T * C3 + 2 * C, .ldc = C3, .stride_c = HS,
              .batch = NH});
  }
  PDTRAIN_LAUNCH(causal_softmax_backward_kernel, row_blocks(rows), kBlock, 0, stream)(
      dpreatt, datt, att, rows, T, scale);
  CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; ++b) {  // preatt = scale q k^T:  dq += dpre k,  dk += dpre^T q
    const float* q = qkv + Index(b) * T * C3;
    const float* dpre = dpreatt + Index(b) * NH * TT;
    float* dq = dqkv + Index(b) * T * C3;
    gemm.run({.M = T, .N = HS, .K = T,
              .A = dpre, .lda = T, .stride_a = TT,
              .B = q + C, .ldb = C3, .stride_b = HS,
              .beta = 1.0f, .C = dq, .ldc = C3, .stride_c = HS,
              .batch = NH});
    gemm.run({.trans_a = true, .M = T, .N = HS, .K = T,
              .A = dpre, .lda = T, .stride_a = TT,
              .B = q, .ldb = C3, .stride_b = HS,
              .beta = 1.0f, .C = dq + C, .ldc = C3, .stride_c = HS,
              .batch = NH});
  }
}

}  // namespace pdtrain::kernels::cuda
