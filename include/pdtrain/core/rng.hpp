#pragma once
// Counter-based random numbers: a value depends only on (key, counter), never on how many
// values were drawn before or on which rank draws it. That is what makes initialization and
// batches independent of the parallel layout and of restarts.
#include <cmath>
#include <cstdint>

namespace pdtrain {

// SplitMix64 finalizer: a bijective 64-bit mixer with good avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A key made from several integers (seed, purpose, step, ...), order-sensitive.
constexpr std::uint64_t rng_key(std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0,
                                std::uint64_t d = 0) {
  return mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d);
}

constexpr std::uint64_t rng_bits(std::uint64_t key, std::uint64_t counter) {
  return mix64(key ^ mix64(counter));
}

// Uniform in [0, 1) with 53 random bits.
inline double rng_uniform(std::uint64_t key, std::uint64_t counter) {
  return static_cast<double>(rng_bits(key, counter) >> 11) * 0x1.0p-53;
}

// Uniform integer in [0, n).
inline std::uint64_t rng_below(std::uint64_t key, std::uint64_t counter, std::uint64_t n) {
  return static_cast<std::uint64_t>(rng_uniform(key, counter) * static_cast<double>(n)) % n;
}

// Standard normal by Box-Muller from two counter-derived uniforms.
inline double rng_normal(std::uint64_t key, std::uint64_t counter) {
  const double u1 = 1.0 - rng_uniform(key, 2 * counter);  // (0, 1]
  const double u2 = rng_uniform(key, 2 * counter + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace pdtrain
