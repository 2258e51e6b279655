// Mixed-precision (bf16) kernels against their fp32 references.
// - LayerNorm and GELU with a bf16 output are fused versions of "compute in fp32, round once":
//   their outputs must be exactly the fp32 kernel's outputs rounded to nearest even.
// - The bf16 matmul (bf16 inputs, fp32 accumulation) against a double-precision product of the
//   same bf16 values: only fp32 accumulation error, |err| <= K * 2^-23 * sum_k |a_k b_k|
//   (a generous bound; a native bf16 kernel may add in another order).
// - The bf16 matmul against the fp32 matmul of the unrounded values: each input is rounded to
//   8 significant bits (relative error <= 2^-9), so each product is within 2^-8 and
//   |err| <= 2^-8 * sum_k |a_k b_k| (+ the accumulation term above). This is the error budget
//   a bf16 step adds per matmul; the training tests check what it does to the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "pdtrain/core/rng.hpp"
#include "pdtrain/kernels/gpt_kernels.hpp"

namespace pdtrain::kernels {
namespace {

Kokkos::DefaultHostExecutionSpace host() { return {}; }

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<float> v(n);
  const std::uint64_t key = rng_key(0x6d697864ull, seed);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * rng_normal(key, i));
  return v;
}

std::vector<bf16> rounded(const std::vector<float>& x) {
  std::vector<bf16> h(x.size());
  to_bf16(x.data(), h.data(), static_cast<std::int64_t>(x.size()));
  return h;
}

TEST(MixedPrecision, LayerNormWithBf16OutputIsTheRoundedFp32Output) {
  const int N = 37, C = 96;
  const auto x = random_floats(N * C, 1, 3.0), w = random_floats(C, 2), b = random_floats(C, 3);
  std::vector<float> out(N * C), mean(N), rstd(N), mean_h(N), rstd_h(N);
  std::vector<bf16> out_h(N * C);
  layernorm_forward(host(), out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_forward(host(), out_h.data(), mean_h.data(), rstd_h.data(), x.data(), w.data(),
                    b.data(), N, C);
  for (int i = 0; i < N * C; ++i) ASSERT_EQ(out_h[i].bits, to_bf16(out[i]).bits) << i;
  EXPECT_EQ(mean, mean_h);  // statistics stay fp32, unchanged
  EXPECT_EQ(rstd, rstd_h);
}

TEST(MixedPrecision, GeluWithBf16OutputIsTheRoundedFp32Output) {
  const std::int64_t n = 100003;  // not a multiple of any chunk or piece
  const auto x = random_floats(static_cast<std::size_t>(n), 4, 2.0);
  std::vector<float> out(n);
  std::vector<bf16> out_h(n);
  gelu_forward(host(), out.data(), x.data(), n);
  gelu_forward(host(), out_h.data(), x.data(), n);
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(out_h[i].bits, to_bf16(out[i]).bits) << i;
}

struct Shapes {
  int N, C, OC;
};

class MixedMatmul : public ::testing::TestWithParam<Shapes> {};

TEST_P(MixedMatmul, ForwardAndBackwardWithinTheBf16ErrorBudget) {
  const auto [N, C, OC] = GetParam();
  const auto x = random_floats(N * C, 5), w = random_floats(OC * C, 6, 0.05),
             bias = random_floats(OC, 7), dout = random_floats(N * OC, 8);
  const auto xh = rounded(x), wh = rounded(w);
  std::vector<float> y(N * OC), y32(N * OC);
  matmul_forward(host(), y.data(), xh.data(), wh.data(), bias.data(), N, C, OC);
  matmul_forward(host(), y32.data(), x.data(), w.data(), bias.data(), N, C, OC);
  const double u = std::ldexp(1.0, -23), rounding = std::ldexp(1.0, -8);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double exact = bias[o], mag = std::abs(bias[o]);
      for (int c = 0; c < C; ++c) {
        const double p = double(to_float(xh[n * C + c])) * to_float(wh[o * C + c]);
        exact += p;
        mag += std::abs(p);
      }
      const double acc_bound = (C + 1) * u * mag;
      ASSERT_NEAR(y[n * OC + o], exact, acc_bound) << n << "," << o;
      ASSERT_NEAR(y[n * OC + o], y32[n * OC + o], rounding * mag + 2 * acc_bound) << n << "," << o;
    }
  // Backward: dinp += dout_bf16 * W_bf16, dW += dout_bf16^T * x_bf16, dbias from fp32 dout.
  std::vector<float> dx(N * C, 0.5f), dw(OC * C, -0.25f), db(OC, 1.0f);
  std::vector<bf16> scratch(N * OC);
  matmul_backward(host(), dx.data(), dw.data(), db.data(), dout.data(), scratch.data(), xh.data(),
                  wh.data(), N, C, OC);
  const auto dh = rounded(dout);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      double exact = 0.5, mag = 0.5;
      for (int o = 0; o < OC; ++o) {
        const double p = double(to_float(dh[n * OC + o])) * to_float(wh[o * C + c]);
        exact += p;
        mag += std::abs(p);
      }
      ASSERT_NEAR(dx[n * C + c], exact, (OC + 1) * u * mag) << "dinp " << n << "," << c;
    }
  for (int o = 0; o < OC; ++o)
    for (int c = 0; c < C; ++c) {
      double exact = -0.25, mag = 0.25;
      for (int n = 0; n < N; ++n) {
        const double p = double(to_float(dh[n * OC + o])) * to_float(xh[n * C + c]);
        exact += p;
        mag += std::abs(p);
      }
      ASSERT_NEAR(dw[o * C + c], exact, (N + 1) * u * mag) << "dweight " << o << "," << c;
    }
  for (int o = 0; o < OC; ++o) {
    double exact = 1.0;
    for (int n = 0; n < N; ++n) exact += dout[n * OC + o];  // fp32 dout, not rounded
    ASSERT_NEAR(db[o], exact, (N + 1) * u * (1.0 + N * 4.0)) << "dbias " << o;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MixedMatmul,
                         ::testing::Values(Shapes{8, 16, 48}, Shapes{33, 64, 17},
                                           Shapes{64, 96, 384}));

}  // namespace
}  // namespace pdtrain::kernels
