#pragma once
// The emulated CUDA target's <cuda_bf16.h> (a test tool, docs/cuda-emulation.md): the subset of
// CUDA's bfloat16 type and conversions that pdtrain's .cu sources use, with CUDA's names and
// semantics. __nv_bfloat16 is the upper 16 bits of an IEEE float; float -> bf16 rounds to
// nearest, ties to even (CUDA's __float2bfloat16; a NaN becomes CUDA's canonical NaN 0x7fff),
// bf16 -> float is exact.
#include <cstdint>

struct __nv_bfloat16 {
  std::uint16_t __x;
};
static_assert(sizeof(__nv_bfloat16) == 2);

inline __nv_bfloat16 __float2bfloat16(float f) {
  const std::uint32_t u = __builtin_bit_cast(std::uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{0x7fffu};
  return __nv_bfloat16{static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }

inline float __bfloat162float(__nv_bfloat16 h) {
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(h.__x) << 16);
}
