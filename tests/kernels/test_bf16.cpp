// bf16 conversions: round to nearest even, NaN/Inf kept, half-ulp (2^-8 relative) error, and
// the span versions equal to the scalar ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "pdtrain/kernels/bf16.hpp"

namespace pdtrain::kernels {
namespace {

float round_trip(float x) { return to_float(to_bf16(x)); }

TEST(Bf16, RoundsToNearestEven) {
  // bf16 keeps 7 mantissa bits: next to 1 the representable steps are 2^-7 apart.
  EXPECT_EQ(round_trip(1.0f), 1.0f);
  EXPECT_EQ(round_trip(1.0f + 0x1p-8f), 1.0f);                       // tie, 1 is even: down
  EXPECT_EQ(round_trip(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);         // tie, 1 + 2^-7 odd: up
  EXPECT_EQ(round_trip(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above the tie: up
  EXPECT_EQ(round_trip(1.0f + 0x1p-8f - 0x1p-20f), 1.0f);            // below the tie: down
  EXPECT_EQ(round_trip(-(1.0f + 3 * 0x1p-8f)), -(1.0f + 0x1p-6f));   // symmetric in sign
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(round_trip(std::numeric_limits<float>::max()),  // rounds past the largest bf16
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_trip(0x1p-130f), 0x1p-130f);  // subnormals with few bits are exact
  EXPECT_TRUE(std::signbit(round_trip(-0.0f)));
}

TEST(Bf16, NanAndInfSurvive) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_trip(inf), inf);
  EXPECT_EQ(round_trip(-inf), -inf);
  EXPECT_TRUE(std::isnan(round_trip(std::numeric_limits<float>::quiet_NaN())));
  // NaNs whose payload lies only in the dropped bits, or whose rounding would carry.
  for (std::uint32_t bits : {0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu}) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    EXPECT_TRUE(std::isnan(round_trip(x))) << std::hex << bits;
    EXPECT_EQ(std::signbit(round_trip(x)), std::signbit(x)) << std::hex << bits;
  }
}

// bf16 has 8 significant bits, so its unit roundoff is 2^-8: round to nearest is within half
// an ulp, 2^(e-8) for |x| in [2^e, 2^(e+1)), i.e. a relative error up to 2^-8 (just above 2^e,
// e.g. 1 + 2^-8 - 2^-20 -> 1), not 2^-9; 2^-9 holds only relative to the top of the binade.
TEST(Bf16, RandomValuesWithinHalfAnUlp) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-100, 100);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(mant(gen), expo(gen));
    if (x == 0) continue;
    const double err = std::abs(double(round_trip(x)) - x);
    ASSERT_LE(err / std::abs(double(x)), 0x1p-8) << x;
    int e;
    std::frexp(x, &e);  // |x| in [2^(e-1), 2^e): half an ulp is 2^(e-1-8)
    ASSERT_LE(err, std::ldexp(1.0, e - 9)) << x;
  }
}

TEST(Bf16, SpansEqualScalar) {
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const int n = 1003;  // not a multiple of any vector width: the tail runs too
  std::vector<float> x(n), back(n);
  for (float& v : x) v = dist(gen);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[6] = -std::numeric_limits<float>::infinity();
  std::vector<bf16> h(n);
  to_bf16(x.data(), h.data(), n);
  to_float(h.data(), back.data(), n);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(h[i].bits, to_bf16(x[i]).bits) << i;
    const float s = to_float(h[i]);
    EXPECT_TRUE(std::memcmp(&back[i], &s, sizeof s) == 0) << i;
  }
}

}  // namespace
}  // namespace pdtrain::kernels
