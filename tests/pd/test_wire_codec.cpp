// Wire codecs: lossless ones round-trip bit for bit, bf16 rounds to nearest even, and a
// malformed payload is refused rather than misread.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "pdtrain/core/rng.hpp"
#include "pdtrain/pd/wire_codec.hpp"

namespace pdtrain {
namespace {

std::vector<float> sample(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(0.02 * rng_normal(rng_key(3), i));
  v[0] = -0.0f;
  v[1] = std::numeric_limits<float>::denorm_min();
  return v;
}

TEST(WireCodec, LosslessCodecsRoundTripExactly) {
  const std::vector<float> in = sample(1000);
  for (WireCodec c : {WireCodec::raw, WireCodec::lz4, WireCodec::zstd}) {
    std::vector<char> buf = {'x'};  // encoding appends
    const std::size_t n = wire_encode(c, in.data(), 1000, buf);
    ASSERT_EQ(buf.size(), n + 1) << to_string(c);
    std::vector<float> out(1000);
    ASSERT_TRUE(wire_decode(c, buf.data() + 1, n, out.data(), 1000)) << to_string(c);
    EXPECT_EQ(std::memcmp(out.data(), in.data(), 4000), 0) << to_string(c);
  }
}

TEST(WireCodec, Bf16HalvesBytesAndRoundsToNearestEven) {
  const std::vector<float> in = {1.0f, 1.00390625f /* exactly halfway: 1 + 2^-8 */,
                                 1.01171875f /* 1 + 3*2^-8: halfway, rounds up to even */,
                                 -2.5f, 3.14159265f};
  std::vector<char> buf;
  ASSERT_EQ(wire_encode(WireCodec::bf16, in.data(), 5, buf), 10u);
  std::vector<float> out(5);
  ASSERT_TRUE(wire_decode(WireCodec::bf16, buf.data(), buf.size(), out.data(), 5));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f);          // tie -> even mantissa (0)
  EXPECT_EQ(out[2], 1.015625f);     // tie -> even mantissa (4 * 2^-8)
  EXPECT_EQ(out[3], -2.5f);
  EXPECT_NEAR(out[4], 3.14159265f, 3.14159265f / 256);  // 8-bit mantissa
  EXPECT_NE(out[4], 3.14159265f);
}

TEST(WireCodec, MalformedPayloadIsRefused) {
  const std::vector<float> in = sample(64);
  for (WireCodec c : {WireCodec::raw, WireCodec::bf16, WireCodec::lz4, WireCodec::zstd}) {
    std::vector<char> buf;
    const std::size_t n = wire_encode(c, in.data(), 64, buf);
    std::vector<float> out(64);
    EXPECT_FALSE(wire_decode(c, buf.data(), n - 1, out.data(), 64)) << to_string(c);
    EXPECT_FALSE(wire_decode(c, buf.data(), n, out.data(), 65)) << to_string(c);
  }
}

TEST(WireCodec, Names) {
  EXPECT_EQ(wire_codec_from_string("lz4"), WireCodec::lz4);
  EXPECT_FALSE(wire_codec_from_string("gzip").has_value());
  EXPECT_TRUE(is_lossy(WireCodec::bf16));
  EXPECT_FALSE(is_lossy(WireCodec::zstd));
}

}  // namespace
}  // namespace pdtrain
