#pragma once
// bfloat16: the upper 16 bits of an IEEE float (8 exponent bits, 7 stored mantissa bits).
// The scalar conversions are inline so other kernels can fuse them into their own loops;
// bf16 -> float is exact, float -> bf16 rounds to nearest, ties to even.
#include <bit>
#include <cstdint>
#include <type_traits>

namespace pdtrain::kernels {

struct bf16 {
  std::uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && std::is_trivial_v<bf16>);

// Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. Carries into the
// exponent are right (the largest finite floats round to Inf, as they should); Inf is unchanged.
// NaN would carry into Inf or lose its payload, so it is quieted instead (sign kept). Written as
// a select, not a branch, so that loops over it vectorize.
inline bf16 to_bf16(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
  return bf16{static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

inline float to_float(bf16 h) { return std::bit_cast<float>(std::uint32_t(h.bits) << 16); }

// The same over n contiguous elements (vectorized; an AVX2 version is picked at run time).
void to_bf16(const float* in, bf16* out, std::int64_t n);
void to_float(const bf16* in, float* out, std::int64_t n);

}  // namespace pdtrain::kernels
