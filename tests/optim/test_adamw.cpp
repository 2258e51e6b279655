#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "pdtrain/optim/adamw.hpp"

namespace pdtrain {
namespace {

AdamWConfig cfg() {
  AdamWConfig c;
  c.lr = 1e-2;
  c.min_lr = 1e-3;
  c.warmup_steps = 10;
  c.total_steps = 110;
  c.weight_decay = 0.1;
  c.grad_clip = 1.0;
  return c;
}

TEST(LearningRate, WarmupThenCosineToMin) {
  const AdamWConfig c = cfg();
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1e-2);
  EXPECT_NEAR(learning_rate(c, 60), 0.5 * (1e-2 + 1e-3), 1e-12);  // half way: cosine midpoint
  EXPECT_NEAR(learning_rate(c, 110), 1e-3, 1e-12);
  for (int s = 11; s < 110; ++s) EXPECT_GT(learning_rate(c, s), learning_rate(c, s + 1));
}

TEST(Clip, FactorOnlyAboveThreshold) {
  const AdamWConfig c = cfg();
  EXPECT_EQ(clip_factor(c, 0.5), 1.0);
  EXPECT_NEAR(clip_factor(c, 4.0), 0.25, 1e-6);
  AdamWConfig off = c;
  off.grad_clip = 0.0;
  EXPECT_EQ(clip_factor(off, 100.0), 1.0);
  EXPECT_DOUBLE_EQ(global_norm({9.0, 16.0}), 5.0);
}

TEST(AdamW, FirstStepMovesByLrTimesSignPlusDecay) {
  const AdamWConfig c = cfg();
  BlockState s{{1.0f, -2.0f}, {0.f, 0.f}, {0.f, 0.f}, true};
  const float g[2] = {0.5f, -3.0f};
  adamw_update(c, 1, 0.01, 1.0f, g, s);
  // Bias-corrected m_hat / sqrt(v_hat) = sign(g) on the first step (up to eps).
  EXPECT_NEAR(s.param[0], 1.0 - 0.01 * (1.0 + 0.1 * 1.0), 1e-6);
  EXPECT_NEAR(s.param[1], -2.0 - 0.01 * (-1.0 + 0.1 * -2.0), 1e-6);
  EXPECT_NEAR(s.m[0], 0.1 * 0.5, 1e-7);
  EXPECT_NEAR(s.v[1], 0.05 * 9.0, 1e-6);
}

TEST(AdamW, NoDecayBlocksIgnoreWeightDecay) {
  const AdamWConfig c = cfg();
  BlockState s{{1.0f}, {0.f}, {0.f}, false};
  const float g[1] = {0.0f};
  adamw_update(c, 1, 0.01, 1.0f, g, s);
  EXPECT_EQ(s.param[0], 1.0f);
}

TEST(AdamW, ClipScaleAppliesToTheGradient) {
  const AdamWConfig c = cfg();
  BlockState a{{0.f}, {0.f}, {0.f}, false}, b = a;
  const float g1[1] = {2.0f}, g2[1] = {1.0f};
  adamw_update(c, 1, 0.01, 0.5f, g1, a);
  adamw_update(c, 1, 0.01, 1.0f, g2, b);
  EXPECT_EQ(a.m[0], b.m[0]);
  EXPECT_EQ(a.v[0], b.v[0]);
}

// The documented order (adamw_math.hpp), written out plainly: chunks of 4096, eight interleaved
// lanes per chunk combined in a fixed tree, chunk sums added in order. Holders, the replicated
// baseline and the GPU baseline must all produce exactly these bits.
TEST(SumOfSquares, FollowsTheChunkedLaneOrderExactly) {
  const std::int64_t n = 3 * 4096 + 13;
  std::vector<float> g(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) g[i] = std::sin(0.37f * static_cast<float>(i)) * 1e-3f;
  double expected = 0.0;
  for (std::int64_t c = 0; c < n; c += 4096) {
    double lane[8] = {};
    const std::int64_t len = std::min<std::int64_t>(4096, n - c);
    for (std::int64_t i = 0; i < len; ++i) lane[i % 8] += double(g[c + i]) * double(g[c + i]);
    expected += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
  EXPECT_EQ(sum_of_squares(g.data(), n), expected);
  double serial = 0.0;  // another order: the bits differ (so the test can tell orders apart)
  for (float x : g) serial += double(x) * double(x);
  EXPECT_NE(sum_of_squares(g.data(), n), serial);
  EXPECT_NEAR(sum_of_squares(g.data(), n), serial, 1e-12 * serial);
}

}  // namespace
}  // namespace pdtrain
