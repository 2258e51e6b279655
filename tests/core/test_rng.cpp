// The counter-based RNG: a value depends on (key, counter) only, keys separate the streams of
// different purposes and indices, and the values are pinned (initialization and batches of every
// past run depend on them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "pdtrain/core/rng.hpp"

namespace pdtrain {
namespace {

TEST(Rng, Mix64IsSplitMix64) {
  // The reference SplitMix64 generator seeded with 0 outputs mix64(0), mix64(g), mix64(2g), ...
  // for the golden-ratio increment g; these are its first three outputs.
  constexpr std::uint64_t g = 0x9E3779B97F4A7C15ull;
  EXPECT_EQ(mix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(mix64(g), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(mix64(2 * g), 0x06C45D188009454Full);
}

TEST(Rng, PinnedValuesOfTheInitStream) {
  const std::uint64_t key = rng_key(1337, 0x1417);  // model/catalog.cpp's initialization stream
  EXPECT_EQ(key, 0xDA878B83CD69479Aull);
  EXPECT_EQ(rng_bits(key, 0), 0x987BC5D102DFA9D7ull);
  EXPECT_EQ(rng_bits(key, 1), 0xA4004B65A3B055C1ull);
  EXPECT_EQ(rng_uniform(key, 5), 0.47129731668974906);
  EXPECT_EQ(rng_below(key, 3, 1000), 968u);
  EXPECT_DOUBLE_EQ(rng_normal(key, 7), -0.17621202435939287);  // through libm's log and cos
}

TEST(Rng, ValuesDoNotDependOnTheOrderOfDraws) {
  const std::uint64_t key = rng_key(7, 3, 11);
  const int n = 1000;
  std::vector<double> in_order(n);
  for (int i = 0; i < n; ++i) in_order[i] = rng_normal(key, i);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());
  std::rotate(order.begin(), order.begin() + 377, order.end());
  for (int i : order) {
    EXPECT_EQ(rng_normal(key, i), in_order[i]) << "counter " << i;
    EXPECT_EQ(rng_uniform(key, i), rng_uniform(key, i));
  }
}

TEST(Rng, KeysSeparateStreamsByPurposeAndIndex) {
  // Keys of (seed, purpose, index) are distinct, and order-sensitive.
  std::set<std::uint64_t> keys;
  for (std::uint64_t purpose = 0; purpose < 8; ++purpose)
    for (std::uint64_t index = 0; index < 64; ++index) keys.insert(rng_key(1337, purpose, index));
  EXPECT_EQ(keys.size(), 8u * 64u);
  EXPECT_NE(rng_key(1, 2), rng_key(2, 1));
  EXPECT_NE(rng_key(1, 2, 3), rng_key(1, 3, 2));
  EXPECT_NE(rng_key(5), rng_key(5, 0, 0, 1));
  // The first values of neighbouring streams share nothing.
  std::set<std::uint64_t> values;
  for (std::uint64_t index = 0; index < 64; ++index)
    for (std::uint64_t c = 0; c < 64; ++c) values.insert(rng_bits(rng_key(1337, 1, index), c));
  EXPECT_EQ(values.size(), 64u * 64u);
}

TEST(Rng, RangesAndMoments) {
  const std::uint64_t key = rng_key(42, 9);
  const int n = 200000;
  double sum = 0.0, sum_sq = 0.0;
  for (int i = 0; i < n; ++i) {
    const double u = rng_uniform(key, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_LT(rng_below(key, i, 10), 10u);
    const double z = rng_normal(key, i);
    sum += z;
    sum_sq += z * z;
  }
  // Deterministic: these bounds hold for this key (about 4 standard errors wide).
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.015);
}

}  // namespace
}  // namespace pdtrain
