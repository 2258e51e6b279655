#pragma once
// bfloat16: the upper 16 bits of an IEEE float (8 exponent bits, 7 stored mantissa bits). The
// one rounding of pdtrain: holders' bf16 wire codec, the CPU kernels and the CUDA kernels all
// call to_bf16() below, so a value rounds to the same bits wherever it is rounded.
// float -> bf16 rounds to nearest, ties to even; bf16 -> float is exact. Header-only and
// usable in CUDA device code (PDTRAIN_HOST_DEVICE).
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define PDTRAIN_HOST_DEVICE __host__ __device__
#else
#define PDTRAIN_HOST_DEVICE
#endif

namespace pdtrain {

struct bf16 {
  std::uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && std::is_trivial_v<bf16>);

// Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. Carries into the
// exponent are right (the largest finite floats round to Inf, as they should); Inf is unchanged.
// NaN would carry into Inf or lose its payload, so it is quieted instead (sign kept). Written as
// a select, not a branch, so that loops over it vectorize.
PDTRAIN_HOST_DEVICE inline bf16 to_bf16(float x) {
  const std::uint32_t u = __builtin_bit_cast(std::uint32_t, x);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
  return bf16{static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

PDTRAIN_HOST_DEVICE inline float to_float(bf16 h) {
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(h.bits) << 16);
}

}  // namespace pdtrain
