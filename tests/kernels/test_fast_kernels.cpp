// The fast paths of the kernels: the float exp (accuracy, edge values), its 4-lane vector form
// (bit-identical to the scalar one, whatever the length and alignment), GELU through the
// sigmoid form against the tanh formula, the BLAS attention against llm.c's loops on shapes
// where a wrong stride or transpose shows up, the column-panel reductions against plain loops
// at widths that are not a multiple of the panel, and determinism of every kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "pdtrain/core/rng.hpp"
#include "pdtrain/kernels/gpt_kernels.hpp"

namespace pdtrain::kernels {
namespace {

Kokkos::DefaultHostExecutionSpace host() { return {}; }

template <class Real>
std::vector<Real> random_vec(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<Real> v(n);
  const std::uint64_t key = rng_key(0x66617374ull, seed);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<Real>(scale * rng_normal(key, i));
  return v;
}

std::uint32_t bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Distance in units in the last place between two finite positive floats.
std::int64_t ulps(float a, float b) {
  return std::abs(static_cast<std::int64_t>(bits(a)) - static_cast<std::int64_t>(bits(b)));
}

// ---------------------------------------------------------------------------------------------
// exp

TEST(FastExp, FloatWithinTwoUlpOfCorrectlyRounded) {
  std::int64_t worst = 0;
  for (int i = 0; i <= 400000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 400000.0f;  // [-87, 88]
    const float got = detail::vexp(x);
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    worst = std::max(worst, ulps(got, want));
  }
  EXPECT_LE(worst, 2);  // 1 on glibc x86-64 over this grid
}

TEST(FastExp, EdgeValues) {
  EXPECT_EQ(detail::vexp(0.0f), 1.0f);
  EXPECT_EQ(detail::vexp(-100.0f), 0.0f);
  EXPECT_EQ(detail::vexp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(detail::vexp(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(detail::vexp(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(detail::vexp(std::numeric_limits<float>::quiet_NaN())));
  // No subnormal results: the smallest nonzero value is a normal float.
  EXPECT_GE(detail::vexp(-87.3f), std::numeric_limits<float>::min());
  EXPECT_EQ(detail::vexp(1.0), std::exp(1.0));  // double is the library's
}

// The span helpers (vector lanes plus a scalar tail) give every element exactly the scalar
// function's value, for every length and start offset: results never depend on how a kernel
// cuts its work into chunks.
// Both SIMD widths (8 lanes only where the CPU has AVX2) are checked.
void check_spans_against_scalar() {
  auto x = random_vec<float>(64, 1, 6.0);
  x[3] = 95.0f, x[7] = -95.0f, x[11] = 0.0f;  // saturating lanes mixed with ordinary ones
  x[13] = std::numeric_limits<float>::infinity(), x[17] = -x[13];
  const auto d = random_vec<float>(64, 2);
  for (int off = 0; off < 8; ++off)
    for (int n = 0; off + n <= 64; n += 5) {
      std::vector<float> e(64, -1.0f), g(64, -1.0f), dg(64, 0.5f);
      std::vector<float> dw(64, std::numeric_limits<float>::quiet_NaN());  // overwritten: unread
      detail::exp_shifted(e.data() + off, x.data() + off, 1.25f, n);
      detail::gelu_span(g.data() + off, x.data() + off, n);
      detail::gelu_grad_span(dg.data() + off, x.data() + off, d.data() + off, n, false);
      detail::gelu_grad_span(dw.data() + off, x.data() + off, d.data() + off, n, true);
      for (int i = 0; i < 64; ++i) {
        const bool in = i >= off && i < off + n;
        EXPECT_EQ(bits(e[i]), bits(in ? detail::vexp(x[i] - 1.25f) : -1.0f)) << off << " " << i;
        EXPECT_EQ(bits(g[i]), bits(in ? detail::gelu_value(x[i]) : -1.0f)) << off << " " << i;
        EXPECT_EQ(bits(dg[i]), bits(in ? 0.5f + detail::gelu_grad(x[i]) * d[i] : 0.5f))
            << off << " " << i;
        if (in)  // the bits of accumulating onto +0
          EXPECT_EQ(bits(dw[i]), bits(0.0f + detail::gelu_grad(x[i]) * d[i])) << off << " " << i;
      }
    }
}

TEST(FastExp, SpansAreBitIdenticalToScalarForAnyLengthAndOffset) {
#ifdef PDTRAIN_KERNELS_VECTOR_SPANS
  const int automatic = detail::vector_lanes();
  for (int lanes : {4, 8}) {
    SCOPED_TRACE(detail::set_vector_lanes(lanes));
    check_spans_against_scalar();
  }
  EXPECT_EQ(detail::set_vector_lanes(0), automatic);
#else
  check_spans_against_scalar();
#endif
}

// ---------------------------------------------------------------------------------------------
// GELU: the sigmoid form equals llm.c's tanh formula and its derivative.

TEST(FastGelu, SigmoidFormEqualsTanhFormula) {
  const double s = std::sqrt(2.0 / std::numbers::pi), c = 0.044715;
  for (double x = -12.0; x <= 12.0; x += 0.01) {
    const double u = s * (x + c * x * x * x), th = std::tanh(u);
    const double value = 0.5 * x * (1.0 + th);
    const double grad = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * c * x * x);
    EXPECT_NEAR(detail::gelu_value(x), value, 1e-14 * std::max(1.0, std::abs(value))) << x;
    EXPECT_NEAR(detail::gelu_grad(x), grad, 1e-14 * std::max(1.0, std::abs(grad))) << x;
    const auto xf = static_cast<float>(x);
    EXPECT_NEAR(detail::gelu_value(xf), value, 2e-6 * std::max(1.0, std::abs(value))) << x;
    EXPECT_NEAR(detail::gelu_grad(xf), grad, 2e-6 * std::max(1.0, std::abs(grad))) << x;
  }
  // Far tails: exactly x and 0 (no NaN from inf * 0), gradient 1 and 0.
  EXPECT_EQ(detail::gelu_value(60.0f), 60.0f);
  EXPECT_EQ(detail::gelu_grad(60.0f), 1.0f);
  EXPECT_EQ(detail::gelu_value(-60.0f), 0.0f);
  EXPECT_EQ(detail::gelu_grad(-60.0f), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Attention through BLAS against llm.c's loops (the previous implementation), in double.

struct AttentionShape {
  int B, T, C, NH;
};

// llm.c's attention forward and backward, verbatim in structure.
void naive_attention(std::vector<double>& out, std::vector<double>& dqkv,
                     const std::vector<double>& qkv, const std::vector<double>& dout,
                     const AttentionShape& s) {
  const int B = s.B, T = s.T, C = s.C, NH = s.NH, HS = C / NH, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(double(HS));
  std::vector<double> att(std::size_t(B) * NH * T * T, 0.0);
  out.assign(std::size_t(B) * T * C, 0.0);
  dqkv.assign(qkv.size(), 0.0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h) {
        const double* q = &qkv[(b * T + t) * C3 + h * HS];
        double* a = &att[((b * NH + h) * T + t) * T];
        double maxval = -1e300;
        for (int t2 = 0; t2 <= t; ++t2) {
          const double* k = &qkv[(b * T + t2) * C3 + C + h * HS];
          double dot = 0;
          for (int i = 0; i < HS; ++i) dot += q[i] * k[i];
          a[t2] = dot * scale;
          maxval = std::max(maxval, a[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) sum += (a[t2] = std::exp(a[t2] - maxval));
        for (int t2 = 0; t2 <= t; ++t2) a[t2] /= sum;
        double* y = &out[(b * T + t) * C + h * HS];
        for (int t2 = 0; t2 <= t; ++t2)
          for (int i = 0; i < HS; ++i) y[i] += a[t2] * qkv[(b * T + t2) * C3 + 2 * C + h * HS + i];
      }
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h) {
        const double* a = &att[((b * NH + h) * T + t) * T];
        const double* dy = &dout[(b * T + t) * C + h * HS];
        std::vector<double> da(T, 0.0), dpre(T, 0.0);
        for (int t2 = 0; t2 <= t; ++t2)
          for (int i = 0; i < HS; ++i) {
            const int v = (b * T + t2) * C3 + 2 * C + h * HS + i;
            da[t2] += qkv[v] * dy[i];
            dqkv[v] += a[t2] * dy[i];
          }
        for (int t2 = 0; t2 <= t; ++t2)
          for (int t3 = 0; t3 <= t; ++t3)
            dpre[t3] += a[t2] * ((t2 == t3 ? 1.0 : 0.0) - a[t3]) * da[t2];
        for (int t2 = 0; t2 <= t; ++t2)
          for (int i = 0; i < HS; ++i) {
            const int q = (b * T + t) * C3 + h * HS + i, k = (b * T + t2) * C3 + C + h * HS + i;
            dqkv[q] += qkv[k] * dpre[t2] * scale;
            dqkv[k] += qkv[q] * dpre[t2] * scale;
          }
      }
}

TEST(FastAttention, BlasMatchesLlmcLoops) {
  for (const AttentionShape s : {AttentionShape{2, 17, 24, 3}, AttentionShape{1, 1, 8, 2},
                                 AttentionShape{3, 9, 12, 1}, AttentionShape{1, 33, 64, 4}}) {
    const std::size_t n_qkv = std::size_t(s.B) * s.T * 3 * s.C, n_out = n_qkv / 3;
    const std::size_t n_att = std::size_t(s.B) * s.NH * s.T * s.T;
    const auto qkv = random_vec<double>(n_qkv, 10 + s.T, 1.5);
    const auto dout = random_vec<double>(n_out, 20 + s.T);
    std::vector<double> want_out, want_dqkv;
    naive_attention(want_out, want_dqkv, qkv, dout, s);

    std::vector<double> out(n_out), preatt(n_att), att(n_att), dqkv(n_qkv, 0.0);
    std::vector<double> dpreatt(n_att, 5.0), datt(n_att, -3.0);  // garbage scratch
    attention_forward(host(), out.data(), preatt.data(), att.data(), qkv.data(), s.B, s.T, s.C,
                      s.NH);
    attention_backward(host(), dqkv.data(), dpreatt.data(), datt.data(), dout.data(), qkv.data(),
                       att.data(), s.B, s.T, s.C, s.NH);
    host().fence();
    for (std::size_t i = 0; i < n_out; ++i) ASSERT_NEAR(out[i], want_out[i], 1e-12) << i;
    for (std::size_t i = 0; i < n_qkv; ++i) ASSERT_NEAR(dqkv[i], want_dqkv[i], 1e-12) << i;
    // Masked entries of the saved and scratch arrays are exact zeros.
    for (std::size_t r = 0; r < n_att / s.T; ++r)
      for (int t2 = int(r % s.T) + 1; t2 < s.T; ++t2) {
        EXPECT_EQ(att[r * s.T + t2], 0.0);
        EXPECT_EQ(preatt[r * s.T + t2], 0.0);
        EXPECT_EQ(datt[r * s.T + t2], 0.0);
        EXPECT_EQ(dpreatt[r * s.T + t2], 0.0);
      }
  }
}

// ---------------------------------------------------------------------------------------------
// Column-panel reductions: widths around the panel size, against plain row loops (the same
// additions in the same order, so equal bit for bit), accumulating.

TEST(FastReductions, PanelColumnSumsEqualPlainLoopsBitForBit) {
  for (int W : {1, 63, 64, 65, 130}) {
    const int N = 37;
    const auto g = random_vec<float>(std::size_t(N) * W, 30 + W);
    const auto x = random_vec<float>(std::size_t(N) * W, 40 + W);
    const auto w = random_vec<float>(W, 50 + W);
    std::vector<float> mean(N), rstd(N), dx(std::size_t(N) * W, 0.0f);
    for (int n = 0; n < N; ++n) mean[n] = 0.1f * n, rstd[n] = 1.0f + 0.01f * n;

    std::vector<float> dbias(W, 0.25f), dw(W, 0.5f), db(W, -0.5f);
    column_sums_add(host(), dbias.data(), g.data(), N, W);
    layernorm_backward(host(), dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(),
                       mean.data(), rstd.data(), N, W);
    host().fence();
    for (int c = 0; c < W; ++c) {
      float s = 0, sw = 0;
      for (int n = 0; n < N; ++n) {
        s += g[n * W + c];
        sw += (x[n * W + c] - mean[n]) * rstd[n] * g[n * W + c];
      }
      EXPECT_EQ(dbias[c], 0.25f + s) << W << " " << c;
      EXPECT_EQ(db[c], -0.5f + s) << W << " " << c;
      EXPECT_EQ(dw[c], 0.5f + sw) << W << " " << c;
    }
  }
}

TEST(FastReductions, EncoderBackwardPanelsEqualPlainLoops) {
  const int B = 3, T = 4, C = 70, Vocab = 5;
  const auto dout = random_vec<float>(std::size_t(B) * T * C, 60);
  const std::vector<std::int32_t> tokens = {1, 1, 4, 0, 1, 3, 3, 1, 0, 4, 4, 1};
  std::vector<float> dwte(std::size_t(Vocab) * C, 1.0f), dwpe(std::size_t(T) * C, 2.0f);
  encoder_backward(host(), dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  host().fence();
  // dwte adds straight into the gradient, token by token; dwpe sums the batch first.
  std::vector<float> want_wte(dwte.size(), 1.0f), want_wpe(dwpe.size(), 0.0f);
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c) {
      want_wte[tokens[bt] * C + c] += dout[bt * C + c];
      want_wpe[(bt % T) * C + c] += dout[bt * C + c];
    }
  for (std::size_t i = 0; i < dwte.size(); ++i) EXPECT_EQ(dwte[i], want_wte[i]) << i;
  for (std::size_t i = 0; i < dwpe.size(); ++i) EXPECT_EQ(dwpe[i], 2.0f + want_wpe[i]) << i;
}

// ---------------------------------------------------------------------------------------------
// Determinism: a whole forward/backward chain run twice gives the same bits.

TEST(FastKernels, RerunsAreBitIdentical) {
  const int B = 2, T = 16, C = 48, NH = 4, N = B * T;
  const auto inp = random_vec<float>(std::size_t(N) * C, 70);
  const auto w = random_vec<float>(std::size_t(3) * C * C, 71, 0.2);
  const auto dout = random_vec<float>(std::size_t(N) * C, 72);
  auto run = [&] {
    std::vector<float> qkv(std::size_t(N) * 3 * C), out(std::size_t(N) * C),
        pre(std::size_t(B) * NH * T * T), att(pre.size()), dqkv(qkv.size(), 0.0f),
        dp(pre.size()), da(pre.size()), g(qkv.size()), dg(qkv.size(), 0.0f);
    matmul_forward(host(), qkv.data(), inp.data(), w.data(), nullptr, N, C, 3 * C);
    gelu_forward(host(), g.data(), qkv.data(), Index(qkv.size()));
    attention_forward(host(), out.data(), pre.data(), att.data(), g.data(), B, T, C, NH);
    attention_backward(host(), dqkv.data(), dp.data(), da.data(), dout.data(), g.data(),
                       att.data(), B, T, C, NH);
    gelu_backward(host(), dg.data(), qkv.data(), dqkv.data(), Index(qkv.size()));
    host().fence();
    out.insert(out.end(), dg.begin(), dg.end());
    return out;
  };
  const std::vector<float> a = run(), b = run();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits(a[i]), bits(b[i])) << i;
}

}  // namespace
}  // namespace pdtrain::kernels
