// LayerNorm (eps 1e-5) over rows of C, forward (fp32 or bf16 output; alone or fused with the
// residual add before it) and backward. One warp per row for the row-wise work (lane j takes
// columns 4j..4j+3, 4(j+32).. with 16-byte accesses where C and the arrays allow, else j,
// j+32, ...; warp sums in a fixed butterfly); the weight and bias gradients are column sums in
// two deterministic stages.
#include "column_sums.cuh"
#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = kBlock / kWarp;  // one warp per row

// The columns of one row a lane takes: four at a time (kVec: C % 4 == 0 and every array
// 16-byte aligned, bf16 outputs 8-byte) at 4 lane, 4 (lane + 32), ..., else one at a time at
// lane, lane + 32, .... f(i, x) gets the column (of the first of four) and the values.
template <bool kVec, class F>
__device__ __forceinline__ void for_row_columns(int lane, int C, F f) {
  if (kVec) {
    for (int j = lane; j < C / 4; j += kWarp) f(j, true);
  } else {
    for (int i = lane; i < C; i += kWarp) f(i, false);
  }
}

// Mean, then the two-pass variance (no cancellation when |mean| >> std), as the CPU. The output
// (x - m) s w + b is rounded step by step in the CPU's order (no FMA contraction), so the bf16
// output is exactly the fp32 output rounded. Fused with the residual add (branch non-null): the
// row x = residual + (branch + branch_bias) is made in the first pass (bias_add then
// residual_forward's two additions) and written to residual_out, which the later passes read
// back (each lane its own columns).
template <bool kVec, class Out>
__global__ void layernorm_forward_kernel(Out* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, float* residual_out,
                                         const float* residual, const float* __restrict__ branch,
                                         const float* __restrict__ branch_bias,
                                         const float* __restrict__ weight,
                                         const float* __restrict__ bias, int N, int C) {
  const Index row = Index(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= N) return;  // the whole warp: warp_sum below needs all 32 lanes
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float* r = residual + row * C;
  float* x = branch != nullptr ? residual_out + row * C : const_cast<float*>(r);
  const float* a = branch != nullptr ? branch + row * C : nullptr;
  float sum = 0.0f;
  for_row_columns<kVec>(lane, C, [&](int i, bool vec) {
    if (vec) {
      float4 v = load4(r, i);
      if (a != nullptr) {
        const float4 av = load4(a, i), bv = load4(branch_bias, i);
        v = make_float4(v.x + (av.x + bv.x), v.y + (av.y + bv.y), v.z + (av.z + bv.z),
                        v.w + (av.w + bv.w));
        store4(x, i, v);
      }
      sum += v.x + v.y + v.z + v.w;
    } else {
      float v = r[i];
      if (a != nullptr) x[i] = v = v + (a[i] + branch_bias[i]);
      sum += v;
    }
  });
  const float m = warp_sum(sum) / static_cast<float>(C);
  float sq = 0.0f;
  for_row_columns<kVec>(lane, C, [&](int i, bool vec) {
    if (vec) {
      const float4 v = load4(x, i);
      const float d0 = v.x - m, d1 = v.y - m, d2 = v.z - m, d3 = v.w - m;
      sq += d0 * d0 + d1 * d1 + d2 * d2 + d3 * d3;
    } else {
      const float d = x[i] - m;
      sq += d * d;
    }
  });
  const float var = warp_sum(sq) / static_cast<float>(C);
  const float s = 1.0f / sqrtf(var + 1e-5f);
  const auto norm = [&](float xi, float w, float b) {
    return __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xi, m), s), w), b);
  };
  Out* y = out + row * C;
  for_row_columns<kVec>(lane, C, [&](int i, bool vec) {
    if (vec) {
      const float4 v = load4(x, i), w = load4(weight, i), b = load4(bias, i);
      store4(y, i, make_float4(norm(v.x, w.x, b.x), norm(v.y, w.y, b.y), norm(v.z, w.z, b.z),
                               norm(v.w, w.w, b.w)));
    } else {
      store1(y, i, norm(x[i], weight[i], bias[i]));
    }
  });
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp += (or =) (w dy - mean(w dy) - norm mean(w dy norm)) s, one warp per row (row < N).
template <bool kVec>
__device__ __forceinline__ void layernorm_backward_row(float* dinp, const float* dout,
                                                       const float* inp, const float* weight,
                                                       const float* mean, const float* rstd,
                                                       Index row, int C, bool overwrite) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  float* dx = dinp + row * C;
  const float m = mean[row], s = rstd[row];
  float a1 = 0.0f, a2 = 0.0f;  // sums of dnorm and dnorm * norm
  const auto terms = [&](float xi, float w, float g) {
    const float dnorm = w * g;
    a1 += dnorm;
    a2 += dnorm * (xi - m) * s;
  };
  for_row_columns<kVec>(lane, C, [&](int i, bool vec) {
    if (vec) {
      const float4 xv = load4(x, i), wv = load4(weight, i), gv = load4(dy, i);
      terms(xv.x, wv.x, gv.x), terms(xv.y, wv.y, gv.y), terms(xv.z, wv.z, gv.z);
      terms(xv.w, wv.w, gv.w);
    } else {
      terms(x[i], weight[i], dy[i]);
    }
  });
  const float dnorm_mean = warp_sum(a1) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(a2) / static_cast<float>(C);
  const auto grad = [&](float old, float xi, float w, float g) {
    const float norm = (xi - m) * s;
    return (overwrite ? 0.0f : old) + (w * g - dnorm_mean - norm * dnorm_norm_mean) * s;
  };
  for_row_columns<kVec>(lane, C, [&](int i, bool vec) {
    if (vec) {
      const float4 xv = load4(x, i), wv = load4(weight, i), gv = load4(dy, i);
      const float4 o = overwrite ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : load4(dx, i);
      store4(dx, i, make_float4(grad(o.x, xv.x, wv.x, gv.x), grad(o.y, xv.y, wv.y, gv.y),
                                grad(o.z, xv.z, wv.z, gv.z), grad(o.w, xv.w, wv.w, gv.w)));
    } else {
      dx[i] = grad(overwrite ? 0.0f : dx[i], x[i], weight[i], dy[i]);
    }
  });
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

// Four columns at a time when C and every array allow it (vector_aligned: 16 bytes of fp32,
// 8 of bf16); else one at a time.
// The whole backward's first launch: blocks [0, row_blocks) the input gradient (a warp per
// row), the others the column partials of dweight and dbias (column_sums.cuh's stage 1, block
// b = slab * column_blocks + column block); column_sums_finish adds the slabs (the second).
template <bool kVec>
__global__ void layernorm_backward_kernel(float* __restrict__ dinp, float* __restrict__ partial,
                                          const float* __restrict__ dout,
                                          const float* __restrict__ inp,
                                          const float* __restrict__ weight,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int N, int C,
                                          bool overwrite, unsigned row_blocks,
                                          unsigned column_blocks, Index slab_rows, Index slabs) {
  if (blockIdx.x < row_blocks) {
    const Index row = Index(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
    if (row < N) layernorm_backward_row<kVec>(dinp, dout, inp, weight, mean, rstd, row, C, overwrite);
    return;
  }
  const unsigned b = blockIdx.x - row_blocks;
  const Index c = Index(b % column_blocks) * blockDim.x + threadIdx.x;
  column_partials<2>(partial, N, C, slab_rows, slabs, c, b / column_blocks,
                     LayernormParamTerms{dout, inp, mean, rstd, C});
}

template <class Out>
void layernorm_forward_impl(cudaStream_t stream, Out* out, float* mean, float* rstd,
                            float* residual_out, const float* residual, const float* branch,
                            const float* branch_bias, const float* weight, const float* bias,
                            int N, int C) {
  if (N <= 0) return;
  const bool fused_ok = branch == nullptr || (vector_aligned(residual_out) &&
                                              vector_aligned(branch) &&
                                              vector_aligned(branch_bias));
  const bool vec = C % 4 == 0 && fused_ok && vector_aligned(out) && vector_aligned(residual) &&
                   vector_aligned(weight) && vector_aligned(bias);
  const auto kernel = vec ? layernorm_forward_kernel<true, Out> : layernorm_forward_kernel<false, Out>;
  PDTRAIN_LAUNCH_AS(branch != nullptr ? "residual_layernorm_forward_kernel"
                                      : "layernorm_forward_kernel",
                    kernel, static_cast<unsigned>(ceil_div(N, kRowsPerBlock)), kBlock, 0, stream)(
      out, mean, rstd, residual_out, residual, branch, branch_bias, weight, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_forward(cudaStream_t stream, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  layernorm_forward_impl(stream, out, mean, rstd, nullptr, inp, nullptr, nullptr, weight, bias, N,
                         C);
}
void layernorm_forward(cudaStream_t stream, bf16* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  layernorm_forward_impl(stream, out, mean, rstd, nullptr, inp, nullptr, nullptr, weight, bias, N,
                         C);
}
void residual_layernorm_forward(cudaStream_t stream, float* residual_out, float* out, float* mean,
                                float* rstd, const float* residual, const float* branch,
                                const float* branch_bias, const float* weight, const float* bias,
                                int N, int C) {
  layernorm_forward_impl(stream, out, mean, rstd, residual_out, residual, branch, branch_bias,
                         weight, bias, N, C);
}
void residual_layernorm_forward(cudaStream_t stream, float* residual_out, bf16* out, float* mean,
                                float* rstd, const float* residual, const float* branch,
                                const float* branch_bias, const float* weight, const float* bias,
                                int N, int C) {
  layernorm_forward_impl(stream, out, mean, rstd, residual_out, residual, branch, branch_bias,
                         weight, bias, N, C);
}

Index layernorm_backward_scratch(int N, int C) { return column_sums_scratch(2, N, C); }

// Two launches: layernorm_backward_kernel, then the slabs' sums of dweight and dbias.
void layernorm_backward(cudaStream_t stream, float* scratch, float* dinp, float* dweight,
                        float* dbias, const float* dout, const float* inp, const float* weight,
                        const float* mean, const float* rstd, int N, int C, bool overwrite) {
  if (N <= 0 || C <= 0) return;
  const Slabs slabs = column_slabs(N);
  const auto row_blocks = static_cast<unsigned>(ceil_div(N, kRowsPerBlock));
  const auto column_blocks = static_cast<unsigned>(ceil_div(C, kBlock));
  const auto blocks = row_blocks + column_blocks * static_cast<unsigned>(slabs.count);
  const bool vec = C % 4 == 0 && aligned(dinp, 16) && aligned(dout, 16) && aligned(inp, 16) &&
                   aligned(weight, 16);
  const auto kernel = vec ? layernorm_backward_kernel<true> : layernorm_backward_kernel<false>;
  PDTRAIN_LAUNCH_AS("layernorm_backward_kernel", kernel, blocks, kBlock, 0, stream)(
      dinp, scratch, dout, inp, weight, mean, rstd, N, C, overwrite, row_blocks, column_blocks,
      slabs.rows, slabs.count);
  CUDA_CHECK_LAUNCH();
  ColumnSumsOut out;
  out.to[0] = dweight, out.to[1] = dbias;
  column_sums_finish(stream, out, 2, scratch, slabs.count, C);
}

}  // namespace pdtrain::kernels::cuda
