// Residual (out = a + b; its backward passes the gradient through; fused with a row-parallel
// projection's bias: bias_residual_forward), fill and the bf16
// conversions: element-wise grid-stride loops, four elements per vector load/store where the
// pointers allow it. Every element is computed exactly as on the CPU (one fp32 addition, the
// one bf16 rounding of core/bf16.hpp), so these match the CPU bit for bit. No __restrict__ on
// fp32 outputs: out may be one of the inputs (each element is read before it is written).
#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

template <bool kVec>
__global__ void fill_kernel(float* p, Index n, float value) {
  for_each_element<kVec>(
      n,
      [&](Index i) { reinterpret_cast<float4*>(p)[i] = make_float4(value, value, value, value); },
      [&](Index i) { p[i] = value; });
}

// fp32 -> bf16 (rounded) or bf16 -> fp32 (exact).
template <bool kVec, class Out, class In>
__global__ void convert_kernel(Out* __restrict__ out, const In* __restrict__ in, Index n) {
  for_each_element<kVec>(
      n, [&](Index i) { store4(out, i, load4(in, i)); },
      [&](Index i) { store1(out, i, load1(in, i)); });
}

template <bool kVec>
__global__ void residual_forward_kernel(float* out, const float* a, const float* b, Index n) {
  for_each_element<kVec>(
      n,
      [&](Index i) {
        const float4 x = reinterpret_cast<const float4*>(a)[i];
        const float4 y = reinterpret_cast<const float4*>(b)[i];
        reinterpret_cast<float4*>(out)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      },
      [&](Index i) { out[i] = a[i] + b[i]; });
}

// out = residual + (branch + bias[c]) (bias_add then residual_forward's additions), one warp
// per row (no index division), lanes over four columns at a time (kVec: C % 4 == 0 and the
// arrays 16-byte aligned) or one.
template <bool kVec>
__global__ void bias_residual_kernel(float* __restrict__ out, const float* __restrict__ residual,
                                     const float* __restrict__ branch,
                                     const float* __restrict__ bias, int N, int C) {
  constexpr int kRowsPerBlock = kBlock / kWarp;
  const Index row = Index(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= N) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float *r = residual + row * C, *a = branch + row * C;
  float* y = out + row * C;
  if (kVec) {
    for (int j = lane; j < C / 4; j += kWarp) {
      const float4 x = load4(r, j), u = load4(a, j), b = load4(bias, j);
      store4(y, j, make_float4(x.x + (u.x + b.x), x.y + (u.y + b.y), x.z + (u.z + b.z),
                               x.w + (u.w + b.w)));
    }
  } else {
    for (int i = lane; i < C; i += kWarp) y[i] = r[i] + (a[i] + bias[i]);
  }
}

}  // namespace

void bias_residual_forward(cudaStream_t stream, float* out, const float* residual,
                           const float* branch, const float* bias, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const bool vec = C % 4 == 0 && aligned(out, 16) && aligned(residual, 16) &&
                   aligned(branch, 16) && aligned(bias, 16);
  const auto kernel = vec ? bias_residual_kernel<true> : bias_residual_kernel<false>;
  PDTRAIN_LAUNCH_AS("bias_residual_kernel", kernel,
                    static_cast<unsigned>(ceil_div(N, kBlock / kWarp)), kBlock, 0, stream)(
      out, residual, branch, bias, N, C);
  CUDA_CHECK_LAUNCH();
}

void fill(cudaStream_t stream, float* p, Index n, float value) {
  launch_elementwise("fill_kernel", stream, n, aligned(p, 16), fill_kernel<true>,
                     fill_kernel<false>, p, n, value);
}

void to_bf16(cudaStream_t stream, bf16* out, const float* in, Index n) {
  launch_elementwise("to_bf16_kernel", stream, n, vector_aligned(out) && vector_aligned(in),
                     convert_kernel<true, bf16, float>, convert_kernel<false, bf16, float>, out, in,
                     n);
}

void to_float(cudaStream_t stream, float* out, const bf16* in, Index n) {
  launch_elementwise("to_float_kernel", stream, n, vector_aligned(out) && vector_aligned(in),
                     convert_kernel<true, float, bf16>, convert_kernel<false, float, bf16>, out, in,
                     n);
}

void residual_forward(cudaStream_t stream, float* out, const float* a, const float* b, Index n) {
  const bool vector_ok = aligned(out, 16) && aligned(a, 16) && aligned(b, 16);
  launch_elementwise("residual_forward_kernel", stream, n, vector_ok,
                     residual_forward_kernel<true>, residual_forward_kernel<false>, out, a, b, n);
}

}  // namespace pdtrain::kernels::cuda
