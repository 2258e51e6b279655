#pragma once
// bf16 spans for the CPU kernels; the type and the scalar rounding are core/bf16.hpp's (one
// rounding for the wire, the CPU and the GPU).
#include <cstdint>

#include "pdtrain/core/bf16.hpp"

namespace pdtrain::kernels {

using pdtrain::bf16;
using pdtrain::to_bf16;
using pdtrain::to_float;

// to_bf16 / to_float over n contiguous elements (vectorized; an AVX2 version is picked at run
// time).
void to_bf16(const float* in, bf16* out, std::int64_t n);
void to_float(const bf16* in, float* out, std::int64_t n);

}  // namespace pdtrain::kernels
