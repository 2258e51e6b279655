// Residual (out = a + b; its backward passes the gradient through), fill and the bf16
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

}  // namespace

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
