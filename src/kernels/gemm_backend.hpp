#pragma once
// Internal to src/kernels: the oneDNN backend (gemm_onednn.cpp) as gemm.cpp calls it.
#include <string>

#include "pdtrain/kernels/bf16.hpp"

namespace pdtrain::kernels::detail {

// Same contract as kernels::gemm, with M, N, K > 0. Throws std::runtime_error on failure.
void onednn_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc);
// Returns false, doing nothing, when this shape has no native bf16 kernel (decided once per
// shape): the caller then widens A and B to fp32 and calls onednn_gemm.
bool onednn_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A,
                      int lda, const bf16* B, int ldb, float beta, float* C, int ldc);
bool onednn_bf16_native();
std::string onednn_description();  // "oneDNN 2.6.3 (fp32: gemm:jit, bf16: ...)"

}  // namespace pdtrain::kernels::detail
