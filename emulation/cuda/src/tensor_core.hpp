#pragma once
// The emulated tensor cores' arithmetic, shared by WMMA (wmma.cpp) and PTX mma.sync (ptx.cpp):
// d = c + sum_k a(k) b(k) with a(k), b(k) bf16 values as floats. Each product of two bf16
// values is exact in fp32 (8-bit significands); the products are summed in fp32 in k order,
// then c is added. A GPU's tensor cores add in an undocumented order and internal precision
// (docs/cuda-emulation.md, "What it cannot show").
namespace cuda_emu {

template <class A, class B>
float tensor_core_dot(float c, int K, const A& a, const B& b) {
  float dot = 0.0f;
  for (int k = 0; k < K; ++k) dot += a(k) * b(k);
  return c + dot;
}

}  // namespace cuda_emu
