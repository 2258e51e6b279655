#include "pdtrain/kernels/bf16.hpp"

// The build uses no -march flags: target_clones compiles each loop for AVX2 as well and lets
// the loader pick it (ifunc) on CPUs that have it; either way these are plain loops of 32-bit
// integer operations that GCC vectorizes at -O3.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PDTRAIN_BF16_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PDTRAIN_BF16_CLONES
#endif

namespace pdtrain::kernels {

PDTRAIN_BF16_CLONES void to_bf16(const float* in, bf16* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

PDTRAIN_BF16_CLONES void to_float(const bf16* in, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}

}  // namespace pdtrain::kernels
