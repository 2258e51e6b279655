// GELU, tanh form, as the CPU computes it: 0.5 x (1 + tanh u) = x / (1 + exp(-2u)),
// u = sqrt(2/pi) (x + 0.044715 x^3). Element-wise grid-stride loops, four elements per vector
// load where the pointers allow it.
#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kCubic = 0.044715f;

// The forward value with every rounding spelled out (the CPU's operation order, no FMA
// contraction), so the fp32 and bf16 outputs come from the very same float: the bf16 output is
// the fp32 output rounded, bit for bit. expf is CUDA's (within 2 ulp), not the CPU's polynomial.
__device__ __forceinline__ float gelu_value(float x) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kCubic, x), x), x);
  const float u = __fmul_rn(kS, __fadd_rn(x, cube));
  return __fdiv_rn(x, __fadd_rn(1.0f, expf(__fmul_rn(-2.0f, u))));
}

// gelu'(x) = s + 2 x s (1 - s) du/dx with s = sigmoid(2u) (0 where exp overflows to inf).
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kS * (x + kCubic * x * x * x);
  const float s = 1.0f / (1.0f + expf(-2.0f * u));
  const float du_dx = kS * (1.0f + 3.0f * kCubic * x * x);
  return s + 2.0f * x * s * (1.0f - s) * du_dx;
}

template <bool kVec, class Out, class In>
__global__ void gelu_forward_kernel(Out* __restrict__ out, const In* __restrict__ inp, Index n) {
  for_each_element<kVec>(
      n,
      [&](Index i) {
        const float4 x = load4(inp, i);
        store4(out, i,
               make_float4(gelu_value(x.x), gelu_value(x.y), gelu_value(x.z), gelu_value(x.w)));
      },
      [&](Index i) { store1(out, i, gelu_value(load1(inp, i))); });
}

// dinp and dout may be the same array (in place: Gemm's unfused DGELU epilogue): each element
// is read before it is written, by the same thread, so neither is __restrict__. G: the
// gradients' type (fp32, or bf16 for a bf16 GEMM's unfused DGELU), In: the GELU input's.
template <bool kVec, class G, class In>
__global__ void gelu_backward_kernel(G* dinp, const In* __restrict__ inp, const G* dout, Index n,
                                     bool overwrite) {
  for_each_element<kVec>(
      n,
      [&](Index i) {
        const float4 x = load4(inp, i);
        const float4 g = load4(dout, i);
        float4 d = overwrite ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : load4(dinp, i);
        d.x += gelu_grad(x.x) * g.x;
        d.y += gelu_grad(x.y) * g.y;
        d.z += gelu_grad(x.z) * g.z;
        d.w += gelu_grad(x.w) * g.w;
        store4(dinp, i, d);
      },
      [&](Index i) {
        const float d = overwrite ? 0.0f : load1(dinp, i);
        store1(dinp, i, d + gelu_grad(load1(inp, i)) * load1(dout, i));
      });
}

template <class Out, class In>
void launch_gelu_forward(cudaStream_t stream, Out* out, const In* inp, Index n) {
  launch_elementwise("gelu_forward_kernel", stream, n, vector_aligned(out) && vector_aligned(inp),
                     gelu_forward_kernel<true, Out, In>, gelu_forward_kernel<false, Out, In>, out,
                     inp, n);
}

template <class G, class In>
void launch_gelu_backward(cudaStream_t stream, G* dinp, const In* inp, const G* dout, Index n,
                          bool overwrite) {
  const bool vector_ok = vector_aligned(dinp) && vector_aligned(inp) && vector_aligned(dout);
  launch_elementwise("gelu_backward_kernel", stream, n, vector_ok,
                     gelu_backward_kernel<true, G, In>, gelu_backward_kernel<false, G, In>, dinp,
                     inp, dout, n, overwrite);
}

}  // namespace

void gelu_forward(cudaStream_t stream, float* out, const float* inp, Index n) {
  launch_gelu_forward(stream, out, inp, n);
}
void gelu_forward(cudaStream_t stream, bf16* out, const float* inp, Index n) {
  launch_gelu_forward(stream, out, inp, n);
}
void gelu_forward(cudaStream_t stream, bf16* out, const bf16* inp, Index n) {
  launch_gelu_forward(stream, out, inp, n);
}

void gelu_backward(cudaStream_t stream, float* dinp, const float* inp, const float* dout, Index n,
                   bool overwrite) {
  launch_gelu_backward(stream, dinp, inp, dout, n, overwrite);
}
void gelu_backward(cudaStream_t stream, bf16* dinp, const bf16* inp, const bf16* dout, Index n,
                   bool overwrite) {
  launch_gelu_backward(stream, dinp, inp, dout, n, overwrite);
}

}  // namespace pdtrain::kernels::cuda
