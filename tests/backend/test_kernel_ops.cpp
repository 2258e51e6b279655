// Every KernelOps method, forward and backward, on each backend (CPU here; CUDA in
// test_backend_cuda), against the reference kernels of gpt_kernels.hpp run in double on the host.
// Inputs come from the counter RNG, move through the backend's Device, on small odd shapes and a
// larger one that crosses block, warp and vector tails. Every op runs twice from the same inputs
// and must give the same bits (determinism); gradient outputs start nonzero (accumulation).
// GradWrite::overwrite starts from NaN (it must not read the buffer) and must give the bits of
// accumulating onto zeros (elementwise ops on every backend, GEMMs on the CPU; a GPU's GEMM
// with beta = 0 is held to the reference's bound instead).
//
// Tolerances (u = 2^-24, fp32's unit roundoff):
//  * Exact: fill, to_bf16 (core/bf16.hpp's rounding), residual and bias_add (one fp32 addition),
//    the encoder forward (one addition: within u |ref| of the double result), sum_losses (the
//    CPU loop's bits), the cross-entropy row max, and each bf16 output, which must be the same
//    backend's fp32 output rounded (LayerNorm, GELU), with statistics unchanged.
//  * Sums (matmuls, bias and encoder gradients, LayerNorm dbias, attention scores): any order of
//    k fp32 additions, with or without FMA, is within gamma_k sum|terms| of the exact sum; the
//    tests allow (k + 2) 2^-23 sum|terms|, with sum|terms| computed by the double reference on
//    absolute values. bf16 matmuls: the same bound against the double product of the bf16 values.
//  * Non-linear ops (LayerNorm, GELU, softmax, attention, cross-entropy): 1e-5 max(1, |ref|), as
//    tests/kernels/test_gradients.cpp allows float against double: a few ulps of exp/log/sqrt and
//    reductions of at most a few hundred terms of magnitude ~1 stay below 1e-6; an index or
//    indexing-stride bug gives errors of order 1e-2 to 1. Probabilities are checked relative to
//    themselves (floor 0). GELU's gradient: 5e-5, because s (1 - s) with s = sigmoid(2u) ~ 1
//    carries an absolute error ~u that the formula multiplies by 2 x du/dx (~150 at |x| ~ 9,
//    the tail of the test's inputs), in fp32 on any backend. bf16 outputs: the fp32 tolerance
//    plus the bf16 rounding, at most half an ulp of 8 significant bits, 2^-8 |ref|.
#include <algorithm>
#include <cfloat>
#include <limits>
#include <tuple>

#include "backend_test_support.hpp"
#include "pdtrain/kernels/gpt_kernels.hpp"

namespace pdtrain::kernels::testing {
namespace {

using Results = std::vector<std::vector<float>>;
using Vec = std::vector<double>;
using Tokens = std::vector<std::int32_t>;

struct Shape {
  const char* name;
  int B, T, C, NH, V, OC;
};
std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.name; }

// Odd sizes (OC != C, V odd, HS = 4 and 8) and one larger shape: N = 135 rows (several slabs of
// the column sums, a partial block of 8 warp-rows), T = 45 (softmax rows longer than a warp),
// C = 160 (columns beyond one block of 128), OC = 640 (several blocks of 256 plus a tail),
// V = 257 (one column beyond a 256-thread stride), HS = 32.
const Shape kShapes[] = {
    {"B2T5C8", 2, 5, 8, 2, 11, 12},
    {"B2T7C24", 2, 7, 24, 3, 11, 36},
    {"B3T45C160", 3, 45, 160, 5, 257, 640},
};

std::size_t sz(std::int64_t n) { return static_cast<std::size_t>(n); }

class KernelOpsTest : public ::testing::TestWithParam<std::tuple<TestBackend, Shape>> {
 protected:
  void SetUp() override {
    backend_ = std::get<0>(GetParam()).make();
    device_ = backend_.device;
    ops_ = backend_.ops.get();
    elem_ = &ops_->elementwise();
    norm_ = &ops_->norm();
    gemm_ = &ops_->gemm();
    loss_ = &ops_->loss();
  }
  const Shape& shape() const { return std::get<1>(GetParam()); }

  template <class T>
  Buffer<T> up(const std::vector<T>& h) {
    return to_device(*device_, h);
  }
  template <class T>
  Buffer<T> zeros(std::int64_t n) {
    return Buffer<T>(*device_, n);
  }
  std::vector<float> down(const Buffer<float>& b) { return to_host(*device_, b); }
  std::vector<float> down(const Buffer<bf16>& b) { return to_floats(to_host(*device_, b)); }

  // Runs `run` twice from the same inputs: both runs must give the same bits.
  template <class Run>
  Results deterministic(Run run) {
    const Results first = run(), second = run();
    EXPECT_EQ(first.size(), second.size());
    for (std::size_t i = 0; i < first.size() && i < second.size(); ++i)
      EXPECT_TRUE(same_bits(first[i], second[i])) << "output " << i << " differs between runs";
    return first;
  }

  ComputeBackend backend_;
  Device* device_ = nullptr;
  KernelOps* ops_ = nullptr;
  ElementwiseOps* elem_ = nullptr;  // ops_'s families
  NormOps* norm_ = nullptr;
  GemmOps* gemm_ = nullptr;
  LossOps* loss_ = nullptr;
};

constexpr double kTol = 1e-5;                  // non-linear ops, see the file comment
constexpr double kGeluGradTol = 5e-5;          // see the file comment
const double kBf16Half = std::ldexp(1.0, -8);  // half a bf16 ulp, relative (8 significant bits)
const float kNaN = std::numeric_limits<float>::quiet_NaN();  // what overwrite must not read

// A tolerance (fp32's unless given) plus bf16 rounding, against a double reference.
void expect_bf16_close(const std::string& what, const std::vector<float>& actual,
                       const Vec& expected, double tol = kTol) {
  Vec bound(expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i)
    bound[i] = kBf16Half * std::abs(expected[i]) + tol * std::max(1.0, std::abs(expected[i]));
  expect_within(what, actual, expected, bound);
}

// The bits of `rounded_fp32` (an fp32 output rounded to bf16) against a bf16 output, both given
// as floats (exact).
// The first `cols` columns of `rows` rows stored ld apart, as dense rows.
std::vector<float> dense_columns(const std::vector<float>& strided, int rows, int cols, int ld) {
  std::vector<float> out(sz(std::int64_t(rows) * cols));
  for (int n = 0; n < rows; ++n)
    std::copy_n(strided.begin() + std::int64_t(n) * ld, cols,
                out.begin() + std::int64_t(n) * cols);
  return out;
}

void expect_is_rounded(const std::string& what, const std::vector<float>& bf16_out,
                       const std::vector<float>& fp32_out) {
  ASSERT_EQ(bf16_out.size(), fp32_out.size());
  int failures = 0;
  for (std::size_t i = 0; i < fp32_out.size(); ++i)
    if (to_bf16(bf16_out[i]).bits != to_bf16(fp32_out[i]).bits && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: bf16 output " << bf16_out[i]
                    << " is not the fp32 output " << fp32_out[i] << " rounded";
  EXPECT_EQ(failures, 0) << what;
}

// ---------------------------------------------------------------------------------------------
// Fill, conversion, residual

TEST_P(KernelOpsTest, FillSetsExactlyTheRange) {
  const std::int64_t n =
      std::int64_t(shape().B) * shape().T * shape().C + 3;  // not a multiple of 4
  const auto got = deterministic([&] {
    auto a = up(std::vector<float>(sz(n + 1), -1.0f)), b = up(std::vector<float>(sz(n + 1), -1.0f));
    elem_->fill(a.data(), n, 0.375f);      // aligned: vector stores
    elem_->fill(b.data() + 1, n, 0.375f);  // 4 bytes off: element by element
    return Results{down(a), down(b)};
  });
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[0][sz(i)], 0.375f) << i;
    ASSERT_EQ(got[1][sz(i + 1)], 0.375f) << i;
  }
  EXPECT_EQ(got[0][sz(n)], -1.0f);
  EXPECT_EQ(got[1][0], -1.0f);
}

TEST_P(KernelOpsTest, ToBf16IsCoreRounding) {
  auto x = randn(sz(std::int64_t(shape().B) * shape().T * shape().C + 5), 11, 100.0);
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f + std::ldexp(1.0f, -8),      // a tie
                            1.0f + 3 * std::ldexp(1.0f, -8),  // a tie, odd
                            FLT_MAX,
                            -FLT_MAX,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::ldexp(1.0f, -130)};
  std::copy(std::begin(specials), std::end(specials), x.begin());
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<bf16> got[2];
  for (int run = 0; run < 2; ++run) {
    auto in = up(x);
    auto out = zeros<bf16>(n + 1);
    elem_->to_bf16(out.data(), in.data(), n);  // aligned
    got[run] = to_host(*device_, out);
    auto out1 = zeros<bf16>(n + 1);
    elem_->to_bf16(out1.data() + 1, in.data(), n);  // 2 bytes off: element by element
    const auto shifted = to_host(*device_, out1);
    for (std::int64_t i = 0; i < n; ++i)
      ASSERT_EQ(shifted[sz(i + 1)].bits, got[run][sz(i)].bits) << i;
  }
  EXPECT_TRUE(same_bits(got[0], got[1]));
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(got[0][sz(i)].bits, to_bf16(x[sz(i)]).bits) << i;
}

TEST_P(KernelOpsTest, ResidualIsTheFp32Sum) {
  const std::int64_t n = std::int64_t(shape().B) * shape().T * shape().C + 1;
  const auto a = randn(sz(n + 1), 12), b = randn(sz(n + 1), 13, 3.0);
  const auto got = deterministic([&] {
    auto da = up(a), db = up(b), out = zeros<float>(n + 1), in_place = up(a);
    elem_->residual_forward(out.data(), da.data(), db.data(), n);
    auto out1 = zeros<float>(n + 1);
    elem_->residual_forward(out1.data() + 1, da.data() + 1, db.data() + 1, n);  // unaligned
    elem_->residual_forward(in_place.data(), in_place.data(), db.data(), n);    // out == a
    return Results{down(out), down(out1), down(in_place)};
  });
  for (std::int64_t i = 0; i < n; ++i) {
    const std::size_t k = sz(i);
    ASSERT_EQ(got[0][k], a[k] + b[k]) << i;
    ASSERT_EQ(got[1][k + 1], a[k + 1] + b[k + 1]) << i;
    ASSERT_EQ(got[2][k], a[k] + b[k]) << i;
  }
}

TEST_P(KernelOpsTest, BiasAddIsTheFp32Sum) {
  const int N = shape().B * shape().T, OC = shape().OC;
  const auto out0 = randn(sz(std::int64_t(N) * OC), 14), bias = randn(sz(OC), 15);
  const auto got = deterministic([&] {
    auto out = up(out0), b = up(bias);
    elem_->bias_add_forward(out.data(), b.data(), N, OC);
    return Results{down(out)};
  });
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const std::size_t i = sz(std::int64_t(n) * OC + o);
      ASSERT_EQ(got[0][i], out0[i] + bias[sz(o)]) << n << "," << o;
    }
}

// bias_add then residual in one pass: the same two fp32 additions, bit for bit, on rows of C
// (four columns at a time) and of C - 1 (odd: one at a time); the rows past N untouched.
TEST_P(KernelOpsTest, BiasResidualIsTheFp32Sums) {
  const int N = shape().B * shape().T;
  for (const int C : {shape().C, shape().C - 1}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const std::int64_t n = std::int64_t(N) * C;
    const auto r = randn(sz(n), 16), a = randn(sz(n), 17, 3.0), bias = randn(sz(C), 18);
    const auto got = deterministic([&] {
      auto dr = up(r), da = up(a), db = up(bias), out = up(std::vector<float>(sz(n + C), 7.0f));
      elem_->bias_residual_forward(out.data(), dr.data(), da.data(), db.data(), N, C);
      return Results{down(out)};
    });
    for (int row = 0; row < N; ++row)
      for (int c = 0; c < C; ++c) {
        const std::size_t i = sz(std::int64_t(row) * C + c);
        ASSERT_EQ(got[0][i], r[i] + (a[i] + bias[sz(c)])) << row << "," << c;
      }
    for (std::int64_t i = n; i < n + C; ++i) ASSERT_EQ(got[0][sz(i)], 7.0f) << "past the end";
  }
}

// ---------------------------------------------------------------------------------------------
// Encoder

struct EncoderSetup {
  int v0, v1;    // vocabulary shard
  bool use_wpe;  // positions added by this shard
};

TEST_P(KernelOpsTest, EncoderForwardAndBackward) {
  const Shape s = shape();
  const int N = s.B * s.T, maxT = s.T + 2;
  Tokens tokens = random_tokens(sz(N), s.V, 16);
  tokens[1] = tokens[0];  // repeats within a sequence and across sequences
  tokens[sz(N - 1)] = tokens[0];
  const auto dout = randn(sz(std::int64_t(N) * s.C), 17);
  for (const EncoderSetup e : {EncoderSetup{0, s.V, true}, EncoderSetup{3, 8, false}}) {
    SCOPED_TRACE("shard [" + std::to_string(e.v0) + ", " + std::to_string(e.v1) + ")");
    const std::size_t rows = sz(e.v1 - e.v0);
    const auto wte = randn(rows * sz(s.C), 18), wpe = randn(sz(maxT * s.C), 19);
    const auto dwte0 = randn(wte.size(), 20), dwpe0 = randn(wpe.size(), 21);
    const auto got = deterministic([&] {
      auto t = up(tokens);
      auto w = up(wte), p = up(wpe), g = up(dout);
      auto out = zeros<float>(std::int64_t(N) * s.C);
      auto dw = up(dwte0), dp = up(dwpe0);
      elem_->encoder_forward(out.data(), t.data(), w.data(), e.use_wpe ? p.data() : nullptr, s.B,
                             s.T, s.C, e.v0, e.v1);
      elem_->encoder_backward(dw.data(), e.use_wpe ? dp.data() : nullptr, g.data(), t.data(), s.B,
                              s.T, s.C, e.v0, e.v1);
      return Results{down(out), down(dw), down(dp)};
    });
    Vec out(sz(std::int64_t(N) * s.C)), dw = widen(dwte0), dp = widen(dwpe0);
    const Vec w = widen(wte), p = widen(wpe), g = widen(dout);
    encoder_forward(host(), out.data(), tokens.data(), w.data(), e.use_wpe ? p.data() : nullptr,
                    s.B, s.T, s.C, e.v0, e.v1);
    encoder_backward(host(), dw.data(), e.use_wpe ? dp.data() : nullptr, g.data(), tokens.data(),
                     s.B, s.T, s.C, e.v0, e.v1);
    // One fp32 addition: within u |ref|.
    expect_close("encoder out", got[0], out, std::ldexp(1.0, -24), 0.0);
    Vec mw = absolute(widen(dwte0)), mp = absolute(widen(dwpe0));
    const Vec ag = absolute(g);
    encoder_backward(host(), mw.data(), e.use_wpe ? mp.data() : nullptr, ag.data(), tokens.data(),
                     s.B, s.T, s.C, e.v0, e.v1);
    expect_within("dwte", got[1], dw, sum_bounds(mw, N));
    expect_within("dwpe", got[2], dp, sum_bounds(mp, s.B));  // rows t >= T untouched
  }
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

TEST_P(KernelOpsTest, LayerNormForwardFp32AndBf16) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C;
  const auto x = randn(sz(std::int64_t(N) * C), 22, 1.0, 2.0);  // offset mean: it must matter
  const auto w = randn(sz(C), 23, 0.5, 1.0), b = randn(sz(C), 24);
  const auto got = deterministic([&] {
    auto dx = up(x), dw = up(w), db = up(b);
    auto out = zeros<float>(std::int64_t(N) * C), mean = zeros<float>(N), rstd = zeros<float>(N);
    auto out_h = zeros<bf16>(std::int64_t(N) * C);
    auto mean_h = zeros<float>(N), rstd_h = zeros<float>(N);
    norm_->layernorm_forward(out.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(),
                             N, C);
    norm_->layernorm_forward(out_h.data(), mean_h.data(), rstd_h.data(), dx.data(), dw.data(),
                             db.data(), N, C);
    return Results{down(out), down(mean), down(rstd), down(out_h), down(mean_h), down(rstd_h)};
  });
  Vec out(sz(std::int64_t(N) * C)), mean(sz(N)), rstd(sz(N));
  const Vec xd = widen(x), wd = widen(w), bd = widen(b);
  layernorm_forward(host(), out.data(), mean.data(), rstd.data(), xd.data(), wd.data(), bd.data(),
                    N, C);
  expect_close("out", got[0], out, kTol);
  expect_close("mean", got[1], mean, kTol);
  expect_close("rstd", got[2], rstd, kTol);
  expect_is_rounded("bf16 out", got[3], got[0]);
  EXPECT_TRUE(same_bits(got[4], got[1])) << "bf16 variant changed the mean";
  EXPECT_TRUE(same_bits(got[5], got[2])) << "bf16 variant changed rstd";
  expect_bf16_close("bf16 out", got[3], out);
}

// LayerNorm fused with the residual add before it (and a projection's bias): the new residual
// is the fp32 sums bit for bit, the LayerNorm of it as the reference's in double; and plain
// LayerNorm on the same widths. Rows of C (four columns at a time) and C - 1 (odd: one at a
// time).
TEST_P(KernelOpsTest, ResidualLayerNormForward) {
  const int N = shape().B * shape().T;
  for (const int C : {shape().C, shape().C - 1}) {
    SCOPED_TRACE("C = " + std::to_string(C));
    const std::int64_t n = std::int64_t(N) * C;
    const auto r = randn(sz(n), 25, 1.0, 2.0), a = randn(sz(n), 26), ab = randn(sz(C), 27);
    const auto w = randn(sz(C), 28, 0.5, 1.0), b = randn(sz(C), 29);
    const auto got = deterministic([&] {
      auto dr = up(r), da = up(a), dab = up(ab), dw = up(w), db = up(b);
      auto res = zeros<float>(n), out = zeros<float>(n), mean = zeros<float>(N),
           rstd = zeros<float>(N), res_h = zeros<float>(n), mean_h = zeros<float>(N),
           rstd_h = zeros<float>(N), plain = zeros<float>(n), pm = zeros<float>(N),
           ps = zeros<float>(N);
      auto out_h = zeros<bf16>(n);
      norm_->residual_layernorm_forward(res.data(), out.data(), mean.data(), rstd.data(),
                                        dr.data(), da.data(), dab.data(), dw.data(), db.data(), N,
                                        C);
      da = up(a);  // the branch is left unspecified
      norm_->residual_layernorm_forward(res_h.data(), out_h.data(), mean_h.data(), rstd_h.data(),
                                        dr.data(), da.data(), dab.data(), dw.data(), db.data(), N,
                                        C);
      norm_->layernorm_forward(plain.data(), pm.data(), ps.data(), dr.data(), dw.data(),
                               db.data(), N, C);
      return Results{down(res), down(out), down(mean), down(rstd), down(res_h), down(out_h),
                     down(mean_h), down(rstd_h), down(plain)};
    });
    std::vector<float> residual(sz(n));
    for (int row = 0; row < N; ++row)
      for (int c = 0; c < C; ++c) {
        const std::size_t i = sz(std::int64_t(row) * C + c);
        residual[i] = r[i] + (a[i] + ab[sz(c)]);
      }
    EXPECT_TRUE(same_bits(got[0], residual)) << "the new residual is not the fp32 sums";
    EXPECT_TRUE(same_bits(got[4], residual)) << "the new residual (bf16 out) is not the sums";
    Vec out(sz(n)), mean(sz(N)), rstd(sz(N));
    const Vec xd = widen(residual), wd = widen(w), bd = widen(b);
    layernorm_forward(host(), out.data(), mean.data(), rstd.data(), xd.data(), wd.data(),
                      bd.data(), N, C);
    expect_close("out", got[1], out, kTol);
    expect_close("mean", got[2], mean, kTol);
    expect_close("rstd", got[3], rstd, kTol);
    expect_is_rounded("bf16 out", got[5], got[1]);
    EXPECT_TRUE(same_bits(got[6], got[2])) << "bf16 variant changed the mean";
    EXPECT_TRUE(same_bits(got[7], got[3])) << "bf16 variant changed rstd";
    Vec plain(sz(n)), pm(sz(N)), ps(sz(N));
    const Vec rd = widen(r);
    layernorm_forward(host(), plain.data(), pm.data(), ps.data(), rd.data(), wd.data(), bd.data(),
                      N, C);
    expect_close("plain LayerNorm", got[8], plain, kTol);
  }
}

TEST_P(KernelOpsTest, LayerNormBackward) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C;
  const auto x = randn(sz(std::int64_t(N) * C), 25, 1.0, 2.0), w = randn(sz(C), 26, 0.5, 1.0);
  const auto dout = randn(sz(std::int64_t(N) * C), 27);
  // mean and rstd: the double forward's, as floats, the same input for both sides.
  std::vector<float> mean(sz(N)), rstd(sz(N));
  {
    Vec out(x.size()), m(sz(N)), r(sz(N));
    const Vec xd = widen(x), wd = widen(w), zero(sz(C), 0.0);
    layernorm_forward(host(), out.data(), m.data(), r.data(), xd.data(), wd.data(), zero.data(), N,
                      C);
    for (int n = 0; n < N; ++n) {
      mean[sz(n)] = static_cast<float>(m[sz(n)]);
      rstd[sz(n)] = static_cast<float>(r[sz(n)]);
    }
  }
  const auto dx0 = randn(x.size(), 28), dw0 = randn(sz(C), 29), db0 = randn(sz(C), 30);
  const auto got = deterministic([&] {
    auto g = up(dout), dx_in = up(x), dw_in = up(w), m = up(mean), r = up(rstd);
    auto dx = up(dx0), dw = up(dw0), db = up(db0);
    norm_->layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), dx_in.data(), dw_in.data(),
                              m.data(), r.data(), N, C, GradWrite::accumulate);
    // From zeros, and overwritten (dweight and dbias still accumulate: their own copies).
    auto dxz = zeros<float>(N * std::int64_t(C)), dxn = up(std::vector<float>(x.size(), kNaN));
    auto dw2 = up(dw0), db2 = up(db0), dw3 = up(dw0), db3 = up(db0);
    norm_->layernorm_backward(dxz.data(), dw2.data(), db2.data(), g.data(), dx_in.data(),
                              dw_in.data(), m.data(), r.data(), N, C, GradWrite::accumulate);
    norm_->layernorm_backward(dxn.data(), dw3.data(), db3.data(), g.data(), dx_in.data(),
                              dw_in.data(), m.data(), r.data(), N, C, GradWrite::overwrite);
    return Results{down(dx), down(dw), down(db), down(dxz), down(dxn), down(dw3), down(db3)};
  });
  Vec dx = widen(dx0), dw = widen(dw0), db = widen(db0);
  const Vec gd = widen(dout), xd = widen(x), wd = widen(w), md = widen(mean), rd = widen(rstd);
  layernorm_backward(host(), dx.data(), dw.data(), db.data(), gd.data(), xd.data(), wd.data(),
                     md.data(), rd.data(), N, C);
  expect_close("dinp", got[0], dx, kTol);
  EXPECT_TRUE(same_bits(got[4], got[3])) << "overwritten dinp differs from zeros'";
  EXPECT_TRUE(same_bits(got[5], got[1]) && same_bits(got[6], got[2]))
      << "dweight/dbias depend on how dinp is written";
  {
    Vec dxz(x.size(), 0.0), dwz = widen(dw0), dbz = widen(db0);
    layernorm_backward(host(), dxz.data(), dwz.data(), dbz.data(), gd.data(), xd.data(), wd.data(),
                       md.data(), rd.data(), N, C);
    expect_close("dinp overwritten", got[4], dxz, kTol);
  }
  // dweight and dbias are column sums of N terms (norm * dy, dy); norm itself is a few
  // roundings off in fp32 (1e-6 relative covers it).
  Vec mw = absolute(widen(dw0)), mb = absolute(widen(db0));
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      const std::size_t i = sz(std::int64_t(n) * C + c);
      mw[sz(c)] += std::abs((xd[i] - md[sz(n)]) * rd[sz(n)] * gd[i]);
      mb[sz(c)] += std::abs(gd[i]);
    }
  Vec bw = sum_bounds(mw, N);
  for (std::size_t c = 0; c < bw.size(); ++c) bw[c] += 1e-6 * mw[c];
  expect_within("dweight", got[1], dw, bw);
  expect_within("dbias", got[2], db, sum_bounds(mb, N));
}

// ---------------------------------------------------------------------------------------------
// Matmul

TEST_P(KernelOpsTest, MatmulForwardFp32AndBf16) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C, OC = s.OC;
  const auto x = randn(sz(std::int64_t(N) * C), 31), w = randn(sz(std::int64_t(OC) * C), 32, 0.2);
  const auto bias = randn(sz(OC), 33);
  const auto xh = rounded(x), wh = rounded(w);
  const std::vector<float> garbage(sz(std::int64_t(N) * OC), 7.0f);  // beta = 0 overwrites
  const int ld = static_cast<int>(logits_row_stride(OC + 1, LogitsRows::padded));
  const std::vector<float> padded_garbage(sz(std::int64_t(N) * ld), 7.0f);
  const auto got = deterministic([&] {
    auto dx = up(x), dw = up(w), db = up(bias);
    auto dxh = up(xh), dwh = up(wh);
    auto y = up(garbage), y_nb = up(garbage), yh = up(garbage), yh_nb = up(garbage);
    gemm_->matmul_forward(y.data(), dx.data(), dw.data(), db.data(), N, C, OC, OC);
    gemm_->matmul_forward(y_nb.data(), dx.data(), dw.data(), nullptr, N, C, OC, OC);
    gemm_->matmul_forward(yh.data(), dxh.data(), dwh.data(), db.data(), N, C, OC, OC);
    gemm_->matmul_forward(yh_nb.data(), dxh.data(), dwh.data(), nullptr, N, C, OC, OC);
    // Rows ld apart (the classifier's padded logits): the same values, the padding untouched.
    auto y_ld = up(padded_garbage), yh_ld = up(padded_garbage);
    gemm_->matmul_forward(y_ld.data(), dx.data(), dw.data(), db.data(), N, C, OC, ld);
    gemm_->matmul_forward(yh_ld.data(), dxh.data(), dwh.data(), db.data(), N, C, OC, ld);
    return Results{down(y), down(y_nb), down(yh), down(yh_nb), down(y_ld), down(yh_ld)};
  });
  const auto reference = [&](const Vec& xd, const Vec& wd, const Vec* bd) {
    Vec y(sz(std::int64_t(N) * OC));
    matmul_forward(host(), y.data(), xd.data(), wd.data(), bd != nullptr ? bd->data() : nullptr, N,
                   C, OC);
    return y;
  };
  const Vec bd = widen(bias), abd = absolute(bd);
  for (const bool half : {false, true}) {
    const Vec xd = half ? widen(xh) : widen(x), wd = half ? widen(wh) : widen(w);
    const Vec ax = absolute(xd), aw = absolute(wd);
    const std::string p = half ? "bf16 " : "fp32 ";
    expect_within(p + "with bias", got[half ? 2 : 0], reference(xd, wd, &bd),
                  sum_bounds(reference(ax, aw, &abd), C));
    expect_within(p + "without bias", got[half ? 3 : 1], reference(xd, wd, nullptr),
                  sum_bounds(reference(ax, aw, nullptr), C));
    const std::vector<float>& padded = got[half ? 5 : 4];
    expect_within(p + "rows ld apart", dense_columns(padded, N, OC, ld), reference(xd, wd, &bd),
                  sum_bounds(reference(ax, aw, &abd), C));
    for (int n = 0; n < N; ++n)
      for (int o = OC; o < ld; ++o)
        ASSERT_EQ(padded[sz(std::int64_t(n) * ld + o)], 7.0f) << p << "padding written " << n;
  }
}

TEST_P(KernelOpsTest, MatmulBackwardFp32AndBf16) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C, OC = s.OC;
  const auto x = randn(sz(std::int64_t(N) * C), 34), w = randn(sz(std::int64_t(OC) * C), 35, 0.2);
  const auto dout = randn(sz(std::int64_t(N) * OC), 36);
  const auto xh = rounded(x), wh = rounded(w);
  const auto dx0 = randn(x.size(), 37), dw0 = randn(w.size(), 38), db0 = randn(sz(OC), 39);
  const int ld = static_cast<int>(logits_row_stride(OC + 1, LogitsRows::padded));
  const auto padded = [&](const std::vector<float>& dense, float pad) {
    std::vector<float> out(sz(std::int64_t(N) * ld), pad);
    for (int n = 0; n < N; ++n)
      std::copy_n(dense.begin() + std::int64_t(n) * OC, OC, out.begin() + std::int64_t(n) * ld);
    return out;
  };
  const auto got = deterministic([&] {
    auto g = up(dout), dx_in = up(x), dw_in = up(w);
    auto dxh_in = up(xh), dwh_in = up(wh);
    auto dx = up(dx0), dw = up(dw0), db = up(db0), dw_only = up(dw0);
    auto dxh = up(dx0), dwh = up(dw0), dbh = up(db0);
    auto g_h = zeros<bf16>(std::int64_t(N) * OC);
    gemm_->matmul_backward(dx.data(), dw.data(), db.data(), g.data(), dx_in.data(), dw_in.data(), N,
                           C, OC, OC, GradWrite::accumulate);
    gemm_->matmul_backward(nullptr, dw_only.data(), nullptr, g.data(), dx_in.data(), dw_in.data(),
                           N, C, OC, OC, GradWrite::accumulate);
    gemm_->matmul_backward(dxh.data(), dwh.data(), dbh.data(), g.data(), g_h.data(), dxh_in.data(),
                           dwh_in.data(), N, C, OC, OC, GradWrite::accumulate);
    // dinp from zeros and overwritten, fp32 and bf16 (weight gradients into scratch copies).
    const std::vector<float> nan_x(x.size(), kNaN);
    auto dxz = zeros<float>(std::int64_t(N) * C), dxn = up(nan_x), dwt = up(dw0);
    auto dxhz = zeros<float>(std::int64_t(N) * C), dxhn = up(nan_x);
    gemm_->matmul_backward(dxz.data(), dwt.data(), nullptr, g.data(), dx_in.data(), dw_in.data(),
                           N, C, OC, OC, GradWrite::accumulate);
    gemm_->matmul_backward(dxn.data(), dwt.data(), nullptr, g.data(), dx_in.data(), dw_in.data(),
                           N, C, OC, OC, GradWrite::overwrite);
    gemm_->matmul_backward(dxhz.data(), dwt.data(), nullptr, g.data(), g_h.data(), dxh_in.data(),
                           dwh_in.data(), N, C, OC, OC, GradWrite::accumulate);
    gemm_->matmul_backward(dxhn.data(), dwt.data(), nullptr, g.data(), g_h.data(), dxh_in.data(),
                           dwh_in.data(), N, C, OC, OC, GradWrite::overwrite);
    // dout's rows ld apart: fp32 with NaN padding (never read), bf16 with 0 padding (rounded
    // with the rows, never multiplied in).
    auto gp_nan = up(padded(dout, kNaN)), gp_zero = up(padded(dout, 0.0f));
    auto dxp = up(dx0), dwp = up(dw0), dbp = up(db0), dxhp = up(dx0), dwhp = up(dw0);
    auto gp_h = zeros<bf16>(std::int64_t(N) * ld);
    gemm_->matmul_backward(dxp.data(), dwp.data(), dbp.data(), gp_nan.data(), dx_in.data(),
                           dw_in.data(), N, C, OC, ld, GradWrite::accumulate);
    gemm_->matmul_backward(dxhp.data(), dwhp.data(), nullptr, gp_zero.data(), gp_h.data(),
                           dxh_in.data(), dwh_in.data(), N, C, OC, ld, GradWrite::accumulate);
    return Results{down(dx),  down(dw),  down(db),   down(dw_only), down(dxh),  down(dwh),
                   down(dbh), down(g_h), down(dxz),  down(dxn),     down(dxhz), down(dxhn),
                   down(dxp), down(dwp), down(dbp),  down(dxhp),    down(dwhp)};
  });
  // dinp += g W, dweight += g^T x; dbias += column sums of the fp32 dout (bias_g) also when the
  // products use its bf16 rounding (g).
  const auto reference = [&](const Vec& g, const Vec& xd, const Vec& wd, const Vec& bias_g, Vec dx,
                             Vec dw, Vec db) {
    matmul_backward(host(), dx.data(), dw.data(), nullptr, g.data(), xd.data(), wd.data(), N, C,
                    OC);
    column_sums_add(host(), db.data(), bias_g.data(), N, OC);
    return std::tuple(dx, dw, db);
  };
  const Vec g32 = widen(dout);
  for (const bool half : {false, true}) {
    const Vec g = half ? widen(rounded(dout)) : g32;
    const Vec xd = half ? widen(xh) : widen(x), wd = half ? widen(wh) : widen(w);
    const auto [dx, dw, db] = reference(g, xd, wd, g32, widen(dx0), widen(dw0), widen(db0));
    const auto [mx, mw, mb] =
        reference(absolute(g), absolute(xd), absolute(wd), absolute(g32), absolute(widen(dx0)),
                  absolute(widen(dw0)), absolute(widen(db0)));
    const std::string p = half ? "bf16 " : "fp32 ";
    const std::size_t k = half ? 4 : 0;
    expect_within(p + "dinp", got[k], dx, sum_bounds(mx, OC));
    expect_within(p + "dweight", got[k + 1], dw, sum_bounds(mw, N));
    expect_within(p + "dbias", got[k + 2], db, sum_bounds(mb, N));
    if (!half) expect_within("dweight without dinp and dbias", got[3], dw, sum_bounds(mw, N));
    // Overwritten: the product alone, as accumulated onto zeros.
    const Vec zero(x.size(), 0.0);
    const auto [dxz, dwz, dbz] = reference(g, xd, wd, g32, zero, widen(dw0), widen(db0));
    const auto [mxz, mwz, mbz] = reference(absolute(g), absolute(xd), absolute(wd), absolute(g32),
                                           zero, absolute(widen(dw0)), absolute(widen(db0)));
    const std::size_t z = half ? 10 : 8;
    expect_within(p + "dinp from zeros", got[z], dxz, sum_bounds(mxz, OC));
    expect_within(p + "dinp overwritten", got[z + 1], dxz, sum_bounds(mxz, OC));
    if (device_->is_host()) {
      EXPECT_TRUE(same_bits(got[z + 1], got[z])) << p << "overwritten dinp differs from zeros'";
    }
    // dout's rows ld apart: the dense products (bf16: without the bias gradient).
    const std::size_t q = half ? 15 : 12;
    expect_within(p + "dinp, dout rows ld apart", got[q], dx, sum_bounds(mx, OC));
    expect_within(p + "dweight, dout rows ld apart", got[q + 1], dw, sum_bounds(mw, N));
    if (!half) expect_within("dbias, dout rows ld apart", got[14], db, sum_bounds(mb, N));
  }
  expect_is_rounded("dout_bf16", got[7], dout);
}

// The MLP's first layer and its GELU in one call (a GPU fuses them into the GEMM's epilogue):
// pre is the matmul with bias (the sum bound), out is gelu of the backend's own pre (kTol; bf16:
// plus its rounding), so a GEMM error is not counted twice. On the CPU both are exactly the bits
// of matmul_forward then gelu_forward.
TEST_P(KernelOpsTest, MatmulGeluForwardFp32AndBf16) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C, OC = s.OC;
  const std::int64_t NOC = std::int64_t(N) * OC;
  const auto x = randn(sz(std::int64_t(N) * C), 48), w = randn(sz(std::int64_t(OC) * C), 49, 0.2);
  const auto bias = randn(sz(OC), 50, 2.0);  // pre spans GELU's curved part and its tails
  const auto xh = rounded(x), wh = rounded(w);
  const std::vector<float> garbage(sz(NOC), 7.0f);  // outputs are written, never read
  const auto got = deterministic([&] {
    auto dx = up(x), dw = up(w), db = up(bias);
    auto dxh = up(xh), dwh = up(wh);
    auto pre = up(garbage), out = up(garbage), pre_h = up(garbage);
    auto out_h = up(rounded(garbage));
    gemm_->matmul_gelu_forward(pre.data(), out.data(), dx.data(), dw.data(), db.data(), N, C, OC);
    gemm_->matmul_gelu_forward(pre_h.data(), out_h.data(), dxh.data(), dwh.data(), db.data(), N, C,
                               OC);
    // The two ops unfused (the CPU's bits).
    auto pre2 = up(garbage), out2 = up(garbage), pre2_h = up(garbage);
    auto out2_h = up(rounded(garbage));
    gemm_->matmul_forward(pre2.data(), dx.data(), dw.data(), db.data(), N, C, OC, OC);
    elem_->gelu_forward(out2.data(), pre2.data(), NOC);
    gemm_->matmul_forward(pre2_h.data(), dxh.data(), dwh.data(), db.data(), N, C, OC, OC);
    elem_->gelu_forward(out2_h.data(), pre2_h.data(), NOC);
    return Results{down(pre),  down(out),  down(pre_h),  down(out_h),
                   down(pre2), down(out2), down(pre2_h), down(out2_h)};
  });
  const auto reference = [&](const Vec& xd, const Vec& wd, const Vec& bd) {
    Vec y(sz(NOC));
    matmul_forward(host(), y.data(), xd.data(), wd.data(), bd.data(), N, C, OC);
    return y;
  };
  const Vec bd = widen(bias);
  for (const bool half : {false, true}) {
    const Vec xd = half ? widen(xh) : widen(x), wd = half ? widen(wh) : widen(w);
    const std::string p = half ? "bf16 " : "fp32 ";
    const std::size_t k = half ? 2 : 0;
    expect_within(p + "pre", got[k], reference(xd, wd, bd),
                  sum_bounds(reference(absolute(xd), absolute(wd), absolute(bd)), C));
    Vec gelu_of_pre(sz(NOC), 0.0);
    const Vec pre = widen(got[k]);
    gelu_forward(host(), gelu_of_pre.data(), pre.data(), NOC);
    if (half)
      expect_bf16_close("bf16 out", got[k + 1], gelu_of_pre);
    else
      expect_close("fp32 out", got[k + 1], gelu_of_pre, kTol);
  }
  if (device_->is_host()) {
    for (std::size_t i = 0; i < 4; ++i)
      EXPECT_TRUE(same_bits(got[i], got[i + 4]))
          << "output " << i << " differs from the unfused ops'";
  }
}

// The projection's backward through the GELU (a GPU multiplies by gelu'(pre) in the input
// gradient GEMM's epilogue): dpre = gelu'(pre) * (dout W) written over NaN (never read), against
// the double reference; the bound is the product's sum bound times |gelu'| plus GELU's gradient
// tolerance (relative to the product). dweight and dbias accumulate as in matmul_backward. On
// the CPU every output has exactly the bits of matmul_backward then gelu_backward.
TEST_P(KernelOpsTest, MatmulBackwardGeluFp32AndBf16) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C, OC = s.OC;  // C: the GELU's width (pre and inp are [N,C])
  const std::int64_t NC = std::int64_t(N) * C;
  const auto pre = randn(sz(NC), 51, 2.0), x = randn(sz(NC), 52);
  const auto w = randn(sz(std::int64_t(OC) * C), 53, 0.2);
  const auto dout = randn(sz(std::int64_t(N) * OC), 54);
  const auto xh = rounded(x), wh = rounded(w);
  const auto dw0 = randn(w.size(), 55), db0 = randn(sz(OC), 56);
  const std::vector<float> nan_x(sz(NC), kNaN);
  const auto got = deterministic([&] {
    auto g = up(dout), p = up(pre), in = up(x), wt = up(w);
    auto in_h = up(xh), wt_h = up(wh);
    auto d = up(nan_x), dw = up(dw0), db = up(db0);
    auto d_h = up(nan_x), dw_h = up(dw0), db_h = up(db0);
    auto g_h = zeros<bf16>(std::int64_t(N) * OC);
    gemm_->matmul_backward_gelu(d.data(), dw.data(), db.data(), g.data(), p.data(), in.data(),
                                wt.data(), N, C, OC);
    gemm_->matmul_backward_gelu(d_h.data(), dw_h.data(), db_h.data(), g.data(), g_h.data(),
                                p.data(), in_h.data(), wt_h.data(), N, C, OC);
    // The two ops unfused (the CPU's bits), through a separate dout W.
    auto t = up(nan_x), u = up(nan_x), u_dw = up(dw0), u_db = up(db0);
    auto t_h = up(nan_x), u_h = up(nan_x), u_dw_h = up(dw0), u_db_h = up(db0);
    gemm_->matmul_backward(t.data(), u_dw.data(), u_db.data(), g.data(), in.data(), wt.data(), N,
                           C, OC, OC, GradWrite::overwrite);
    elem_->gelu_backward(u.data(), p.data(), t.data(), NC, GradWrite::overwrite);
    gemm_->matmul_backward(t_h.data(), u_dw_h.data(), u_db_h.data(), g.data(), g_h.data(),
                           in_h.data(), wt_h.data(), N, C, OC, OC, GradWrite::overwrite);
    elem_->gelu_backward(u_h.data(), p.data(), t_h.data(), NC, GradWrite::overwrite);
    return Results{down(d), down(dw), down(db), down(d_h), down(dw_h), down(db_h),
                   down(u), down(u_dw), down(u_db), down(u_h), down(u_dw_h), down(u_db_h)};
  });
  const auto reference = [&](const Vec& gd, const Vec& xd, const Vec& wd, const Vec& bias_g,
                             Vec dw, Vec db) {
    Vec dx(sz(NC), 0.0);
    matmul_backward(host(), dx.data(), dw.data(), nullptr, gd.data(), xd.data(), wd.data(), N, C,
                    OC);
    column_sums_add(host(), db.data(), bias_g.data(), N, OC);
    return std::tuple(dx, dw, db);
  };
  Vec grad(sz(NC), 0.0);  // gelu'(pre)
  const Vec pre_d = widen(pre), ones(sz(NC), 1.0);
  gelu_backward(host(), grad.data(), pre_d.data(), ones.data(), NC);
  const Vec g32 = widen(dout);
  for (const bool half : {false, true}) {
    const Vec gd = half ? widen(rounded(dout)) : g32;
    const Vec xd = half ? widen(xh) : widen(x), wd = half ? widen(wh) : widen(w);
    const auto [dx, dw, db] = reference(gd, xd, wd, g32, widen(dw0), widen(db0));
    const auto [mx, mw, mb] = reference(absolute(gd), absolute(xd), absolute(wd), absolute(g32),
                                        absolute(widen(dw0)), absolute(widen(db0)));
    const Vec sx = sum_bounds(mx, OC);
    Vec dpre(sz(NC)), bound(sz(NC));
    for (std::size_t i = 0; i < dpre.size(); ++i) {
      dpre[i] = grad[i] * dx[i];
      bound[i] = std::abs(grad[i]) * sx[i] +
                 kGeluGradTol * std::max(1.0, std::abs(grad[i])) * std::max(1.0, std::abs(dx[i]));
    }
    const std::string p = half ? "bf16 " : "fp32 ";
    const std::size_t k = half ? 3 : 0;
    expect_within(p + "dpre", got[k], dpre, bound);
    expect_within(p + "dweight", got[k + 1], dw, sum_bounds(mw, N));
    expect_within(p + "dbias", got[k + 2], db, sum_bounds(mb, N));
  }
  if (device_->is_host()) {
    for (std::size_t i = 0; i < 6; ++i)
      EXPECT_TRUE(same_bits(got[i], got[i + 6]))
          << "output " << i << " differs from the unfused ops'";
  }
}

// ---------------------------------------------------------------------------------------------
// GEMMs with bf16 outputs (bf16 activations, Bf16Activations::gemm_io): each output is the fp32
// result rounded once, so its bound is the fp32 bound plus half a bf16 ulp of the value (a
// GPU's unfused fallback rounds the GEMM's result before its GELU: within the same bound, the
// GELU terms below allowing for a rounded input).

// bound + half a bf16 ulp of (|ref| + bound): an fp32 result within `bound`, rounded.
Vec rounded_bounds(const Vec& ref, Vec bound) {
  for (std::size_t i = 0; i < ref.size(); ++i)
    bound[i] += kBf16Half * (std::abs(ref[i]) + bound[i]);
  return bound;
}

TEST_P(KernelOpsTest, MatmulForwardBf16Output) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C, OC = s.OC;
  const auto xh = rounded(randn(sz(std::int64_t(N) * C), 61));
  const auto wh = rounded(randn(sz(std::int64_t(OC) * C), 62, 0.2));
  const auto bh = rounded(randn(sz(OC), 63));
  const auto garbage = rounded(std::vector<float>(sz(std::int64_t(N) * OC), 7.0f));
  const int ld = OC + 3;  // rows ld apart (the classifier's logits): padding left alone
  const auto garbage_ld = rounded(std::vector<float>(sz(std::int64_t(N) * ld), 7.0f));
  const auto got = deterministic([&] {
    auto x = up(xh), w = up(wh), b = up(bh), y = up(garbage), y_nb = up(garbage);
    auto y_ld = up(garbage_ld);
    gemm_->matmul_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC, OC);
    gemm_->matmul_forward(y_nb.data(), x.data(), w.data(), nullptr, N, C, OC, OC);
    gemm_->matmul_forward(y_ld.data(), x.data(), w.data(), b.data(), N, C, OC, ld);
    return Results{down(y), down(y_nb), down(y_ld)};
  });
  for (int n = 0; n < N; ++n)
    for (int c = OC; c < ld; ++c)
      ASSERT_EQ(got[2][sz(std::int64_t(n) * ld + c)], 7.0f) << "padding " << n << ", " << c;
  const Vec xd = widen(xh), wd = widen(wh), bd = widen(bh);
  for (const bool bias : {true, false}) {
    Vec ref(sz(std::int64_t(N) * OC)), mag(ref.size());
    const Vec abd = absolute(bd);
    matmul_forward(host(), ref.data(), xd.data(), wd.data(), bias ? bd.data() : nullptr, N, C,
                   OC);
    matmul_forward(host(), mag.data(), absolute(xd).data(), absolute(wd).data(),
                   bias ? abd.data() : nullptr, N, C, OC);
    expect_within(bias ? "with bias" : "without bias", got[bias ? 0 : 1], ref,
                  rounded_bounds(ref, sum_bounds(mag, C)));
    // (another leading dimension may take another algorithm: held to the bound, not the bits)
    if (bias)
      expect_within("rows ld apart", dense_columns(got[2], N, OC, ld), ref,
                    rounded_bounds(ref, sum_bounds(mag, C)));
  }
}

// pre and gelu(pre) both in bf16, from the fp32 pre: out is checked against gelu of the
// backend's own rounded pre, allowing for the rounding of pre (|gelu'| < 1.13) and of out.
TEST_P(KernelOpsTest, MatmulGeluForwardBf16Output) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C, OC = s.OC;
  const std::int64_t NOC = std::int64_t(N) * OC;
  const auto xh = rounded(randn(sz(std::int64_t(N) * C), 64));
  const auto wh = rounded(randn(sz(std::int64_t(OC) * C), 65, 0.2));
  const auto bh = rounded(randn(sz(OC), 66, 2.0));  // pre spans GELU's curved part and tails
  const auto garbage = rounded(std::vector<float>(sz(NOC), 7.0f));
  const auto got = deterministic([&] {
    auto x = up(xh), w = up(wh), b = up(bh), pre = up(garbage), out = up(garbage);
    gemm_->matmul_gelu_forward(pre.data(), out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return Results{down(pre), down(out)};
  });
  const Vec xd = widen(xh), wd = widen(wh), bd = widen(bh);
  Vec ref(sz(NOC)), mag(sz(NOC));
  matmul_forward(host(), ref.data(), xd.data(), wd.data(), bd.data(), N, C, OC);
  matmul_forward(host(), mag.data(), absolute(xd).data(), absolute(wd).data(),
                 absolute(bd).data(), N, C, OC);
  expect_within("pre", got[0], ref, rounded_bounds(ref, sum_bounds(mag, C)));
  const Vec pre = widen(got[0]);
  Vec out(sz(NOC)), bound(sz(NOC));
  gelu_forward(host(), out.data(), pre.data(), NOC);
  for (std::size_t i = 0; i < out.size(); ++i)
    bound[i] = 1.13 * kBf16Half * std::abs(pre[i]) + kBf16Half * std::abs(out[i]) +
               kTol * std::max(1.0, std::abs(out[i]));
  expect_within("gelu(pre)", got[1], out, bound);
}

// The projection's backward through the GELU with the GELU's input gradient written in bf16
// (over NaN: never read) from a bf16 pre; dweight and dbias (from the fp32 dout) accumulate.
TEST_P(KernelOpsTest, MatmulBackwardGeluBf16Output) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C, OC = s.OC;  // C: the GELU's width (pre and inp are [N,C])
  const std::int64_t NC = std::int64_t(N) * C;
  const auto pre_h = rounded(randn(sz(NC), 67, 2.0)), xh = rounded(randn(sz(NC), 68));
  const auto wh = rounded(randn(sz(std::int64_t(OC) * C), 69, 0.2));
  const auto dout = randn(sz(std::int64_t(N) * OC), 70);
  const auto dw0 = randn(wh.size(), 71), db0 = randn(sz(OC), 72);
  const auto nan_h = rounded(std::vector<float>(sz(NC), kNaN));
  const auto got = deterministic([&] {
    auto g = up(dout), dw = up(dw0), db = up(db0);
    auto p = up(pre_h), in = up(xh), w = up(wh), d = up(nan_h);
    auto g_h = zeros<bf16>(std::int64_t(N) * OC);
    gemm_->matmul_backward_gelu(d.data(), dw.data(), db.data(), g.data(), g_h.data(), p.data(),
                                in.data(), w.data(), N, C, OC);
    return Results{down(d), down(dw), down(db), down(g_h)};
  });
  const Vec gd = widen(rounded(dout)), g32 = widen(dout), xd = widen(xh), wd = widen(wh);
  Vec dx(sz(NC), 0.0), mx(sz(NC), 0.0), dw = widen(dw0), mw = absolute(widen(dw0));
  matmul_backward(host(), dx.data(), dw.data(), nullptr, gd.data(), xd.data(), wd.data(), N, C,
                  OC);
  matmul_backward(host(), mx.data(), mw.data(), nullptr, absolute(gd).data(), absolute(xd).data(),
                  absolute(wd).data(), N, C, OC);
  Vec db = widen(db0), mb = absolute(widen(db0));
  column_sums_add(host(), db.data(), g32.data(), N, OC);
  column_sums_add(host(), mb.data(), absolute(g32).data(), N, OC);
  Vec grad(sz(NC), 0.0);  // gelu'(pre)
  const Vec pre_d = widen(pre_h), ones(sz(NC), 1.0);
  gelu_backward(host(), grad.data(), pre_d.data(), ones.data(), NC);
  const Vec sx = sum_bounds(mx, OC);
  Vec dpre(sz(NC)), bound(sz(NC));
  for (std::size_t i = 0; i < dpre.size(); ++i) {
    dpre[i] = grad[i] * dx[i];
    const double fp32 = std::abs(grad[i]) * sx[i] + kGeluGradTol * std::max(1.0, std::abs(grad[i])) *
                                                       std::max(1.0, std::abs(dx[i]));
    // Rounded once (fused), or the product rounded before the GELU's factor too (unfused).
    bound[i] = fp32 + 2 * kBf16Half * (std::abs(dpre[i]) + fp32);
  }
  expect_within("dpre", got[0], dpre, bound);
  expect_within("dweight", got[1], dw, sum_bounds(mw, N));
  expect_within("dbias", got[2], db, sum_bounds(mb, N));
  expect_is_rounded("dout_bf16", got[3], dout);
}

// matmul_backward of a bf16 output gradient: products of its values, bias gradient their column
// sums; dinp accumulated and overwritten (over NaN).
TEST_P(KernelOpsTest, MatmulBackwardBf16Gradient) {
  const Shape s = shape();
  const int N = s.B * s.T, C = s.C, OC = s.OC;
  const auto xh = rounded(randn(sz(std::int64_t(N) * C), 73));
  const auto wh = rounded(randn(sz(std::int64_t(OC) * C), 74, 0.2));
  const auto gh = rounded(randn(sz(std::int64_t(N) * OC), 75));
  const auto dx0 = randn(sz(std::int64_t(N) * C), 76), dw0 = randn(wh.size(), 77);
  const auto db0 = randn(sz(OC), 78);
  const std::vector<float> nan_x(dx0.size(), kNaN);
  // The same gradient with rows ld apart and NaN padding (the classifier's dlogits): never read.
  const int ld = OC + 5;
  std::vector<bf16> gh_ld(sz(std::int64_t(N) * ld), to_bf16(kNaN));
  for (int n = 0; n < N; ++n)
    std::copy_n(gh.begin() + std::int64_t(n) * OC, OC, gh_ld.begin() + std::int64_t(n) * ld);
  const auto got = deterministic([&] {
    auto g = up(gh), x = up(xh), w = up(wh), g_ld = up(gh_ld);
    auto dx = up(dx0), dw = up(dw0), db = up(db0), dxn = up(nan_x), dw2 = up(dw0);
    auto dx3 = up(dx0), dw3 = up(dw0), db3 = up(db0);
    gemm_->matmul_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), N, C, OC,
                           OC, GradWrite::accumulate);
    gemm_->matmul_backward(dxn.data(), dw2.data(), nullptr, g.data(), x.data(), w.data(), N, C,
                           OC, OC, GradWrite::overwrite);
    gemm_->matmul_backward(dx3.data(), dw3.data(), db3.data(), g_ld.data(), x.data(), w.data(), N,
                           C, OC, ld, GradWrite::accumulate);
    return Results{down(dx), down(dw), down(db), down(dxn), down(dx3), down(dw3), down(db3)};
  });
  const Vec gd = widen(gh), xd = widen(xh), wd = widen(wh);
  const auto reference = [&](const Vec& g, const Vec& x, const Vec& w, Vec dx, Vec dw, Vec db) {
    matmul_backward(host(), dx.data(), dw.data(), nullptr, g.data(), x.data(), w.data(), N, C, OC);
    column_sums_add(host(), db.data(), g.data(), N, OC);
    return std::tuple(dx, dw, db);
  };
  const auto [dx, dw, db] = reference(gd, xd, wd, widen(dx0), widen(dw0), widen(db0));
  const auto [mx, mw, mb] = reference(absolute(gd), absolute(xd), absolute(wd),
                                      absolute(widen(dx0)), absolute(widen(dw0)),
                                      absolute(widen(db0)));
  expect_within("dinp", got[0], dx, sum_bounds(mx, OC));
  expect_within("dweight", got[1], dw, sum_bounds(mw, N));
  expect_within("dbias", got[2], db, sum_bounds(mb, N));
  expect_within("dinp, rows ld apart", got[4], dx, sum_bounds(mx, OC));
  expect_within("dweight, rows ld apart", got[5], dw, sum_bounds(mw, N));
  expect_within("dbias, rows ld apart", got[6], db, sum_bounds(mb, N));
  const Vec zero(dx0.size(), 0.0);
  const auto [dxz, dwz, dbz] = reference(gd, xd, wd, zero, widen(dw0), widen(db0));
  const auto [mxz, mwz, mbz] = reference(absolute(gd), absolute(xd), absolute(wd), zero,
                                         absolute(widen(dw0)), absolute(widen(db0)));
  expect_within("dinp overwritten", got[3], dxz, sum_bounds(mxz, OC));
}

// ---------------------------------------------------------------------------------------------
// Attention

// The attention family is opaque: what it saves and its scratch are the backend's (filled with
// garbage first: forward and backward must not read them before writing). Only the output and
// the input gradient are compared, against the double reference of gpt_kernels.hpp.
AttentionShape attention_shape(const Shape& s) { return {s.B, s.T, s.C, s.NH, false}; }

// The attention tests run on every backend and on the other attention families of a backend
// (attention_backends(): cuDNN's on a GPU).
class AttentionOpsTest : public KernelOpsTest {};

TEST_P(AttentionOpsTest, AttentionForward) {
  const Shape s = shape();
  const AttentionShape as = attention_shape(s);
  AttentionOps& attention = ops_->attention();
  const std::int64_t n_qkv = std::int64_t(s.B) * s.T * 3 * s.C,
                     n_out = std::int64_t(s.B) * s.T * s.C;
  const std::int64_t n_att = std::int64_t(s.B) * s.NH * s.T * s.T;
  const auto qkv = randn(sz(n_qkv), 40);
  const std::vector<float> saved0(sz(attention.saved_floats(as)), 7.0f),
      scratch0(sz(attention.scratch_floats(as)), 7.0f);
  const auto got = deterministic([&] {
    auto in = up(qkv), out = up(std::vector<float>(sz(n_out), 7.0f)), saved = up(saved0),
         scratch = up(scratch0);
    attention.forward(out.data(), saved.data(), scratch.data(), in.data(), as);
    return Results{down(out), down(saved)};  // saved: its bits too are the same run to run
  });
  Vec out(sz(n_out)), preatt(sz(n_att)), att(sz(n_att));
  const Vec q = widen(qkv);
  attention_forward(host(), out.data(), preatt.data(), att.data(), q.data(), s.B, s.T, s.C, s.NH);
  expect_close("out", got[0], out, kTol);
}

// dqkv accumulates onto a nonzero start, from the backend's own forward (its saved floats).
TEST_P(AttentionOpsTest, AttentionBackward) {
  const Shape s = shape();
  const AttentionShape as = attention_shape(s);
  AttentionOps& attention = ops_->attention();
  const std::int64_t n_qkv = std::int64_t(s.B) * s.T * 3 * s.C,
                     n_out = std::int64_t(s.B) * s.T * s.C;
  const std::int64_t n_att = std::int64_t(s.B) * s.NH * s.T * s.T;
  const auto qkv = randn(sz(n_qkv), 41), dout = randn(sz(n_out), 42);
  const auto dqkv0 = randn(sz(n_qkv), 43);
  const std::vector<float> saved0(sz(attention.saved_floats(as)), 7.0f),
      scratch0(sz(attention.scratch_floats(as)), 7.0f);
  const auto got = deterministic([&] {
    auto in = up(qkv), out = zeros<float>(n_out), saved = up(saved0), scratch = up(scratch0);
    auto g = up(dout), dqkv = up(dqkv0), scratch_b = up(scratch0);
    attention.forward(out.data(), saved.data(), scratch.data(), in.data(), as);
    attention.backward(dqkv.data(), scratch_b.data(), g.data(), in.data(), out.data(),
                       saved.data(), as);
    return Results{down(dqkv)};
  });
  const Vec q = widen(qkv), gd = widen(dout);
  Vec out(sz(n_out)), preatt(sz(n_att)), att(sz(n_att));
  attention_forward(host(), out.data(), preatt.data(), att.data(), q.data(), s.B, s.T, s.C, s.NH);
  Vec dqkv = widen(dqkv0), dpreatt(sz(n_att)), datt(sz(n_att));
  attention_backward(host(), dqkv.data(), dpreatt.data(), datt.data(), gd.data(), q.data(),
                     att.data(), s.B, s.T, s.C, s.NH);
  expect_close("dqkv", got[0], dqkv, kTol);
}

// bf16 activations (qkv in and out as bf16, a GPU's bf16 runs): on every backend, and on both
// of a GPU's algorithms (the fused kernels take the test shapes' heads, the reference the
// 80-channel ones), exactly the fp32 overloads' results with bf16_inputs set on the same values:
// out their out rounded once, dqkv their dqkv bit for bit when their backward is given the bf16
// out (a fused backward's rowsum(dout * out) then sees the same values); from either
// bf16_inputs (bf16 activations are a bf16 run's). And within the bf16 attention tolerances of
// the double reference on the bf16 qkv: out kAttnBf16Forward plus its rounding, dqkv
// kAttnBf16Backward, relative to max(1, |ref|): a GPU's bf16 tiles round q, k, v (exact here),
// the probabilities and the score gradients to bf16 before their products
// (tests/backend/cuda/test_flash_attention.cpp, where these bounds and their measured margins
// are derived); the CPU and the reference algorithm compute in fp32, far inside them.
constexpr double kAttnBf16Forward = 1e-2, kAttnBf16Backward = 4e-2;

TEST_P(AttentionOpsTest, AttentionBf16ActivationsAreTheFp32OverloadsRounded) {
  const Shape shp = shape();
  AttentionOps& attention = ops_->attention();
  for (const AttentionShape base : {attention_shape(shp), AttentionShape{1, shp.T, 80, 1, false}})
    for (const bool bf16_inputs : {false, true}) {
      AttentionShape as = base, as_fp32 = base;
      as.bf16_inputs = bf16_inputs;
      as_fp32.bf16_inputs = true;
      SCOPED_TRACE("C " + std::to_string(as.C) + " NH " + std::to_string(as.NH) +
                   (bf16_inputs ? ", bf16_inputs" : ""));
      const std::int64_t n_qkv = std::int64_t(as.B) * as.T * 3 * as.C,
                         n_out = std::int64_t(as.B) * as.T * as.C,
                         n_att = std::int64_t(as.B) * as.NH * as.T * as.T;
      const std::vector<bf16> qkv = rounded(randn(sz(n_qkv), 53));
      const std::vector<float> qkv_f = to_floats(qkv), dout = randn(sz(n_out), 54),
                               dqkv0 = randn(sz(n_qkv), 55);
      const std::vector<float> saved0(sz(attention.saved_floats(as)), 7.0f),
          scratch0(sz(attention.scratch_floats(as)), 7.0f);
      const auto got = deterministic([&] {
        auto in = up(qkv), out = up(rounded(std::vector<float>(sz(n_out), 7.0f)));
        auto saved = up(saved0), scratch = up(scratch0), g = up(dout), dqkv = up(dqkv0);
        attention.forward(out.data(), saved.data(), scratch.data(), in.data(), as);
        attention.backward(dqkv.data(), scratch.data(), g.data(), in.data(), out.data(),
                           saved.data(), as);
        const std::vector<float> out_bf16 = down(out);
        auto in_f = up(qkv_f), out_f = zeros<float>(n_out), given_out = up(out_bf16);
        auto saved_f = up(saved0), dqkv_f = up(dqkv0);
        attention.forward(out_f.data(), saved_f.data(), scratch.data(), in_f.data(), as_fp32);
        attention.backward(dqkv_f.data(), scratch.data(), g.data(), in_f.data(), given_out.data(),
                           saved_f.data(), as_fp32);
        return Results{out_bf16, down(dqkv), down(out_f), down(dqkv_f)};
      });
      expect_is_rounded("out", got[0], got[2]);
      EXPECT_TRUE(same_bits(got[1], got[3])) << "dqkv is not the fp32 overload's";

      const Vec q = widen(qkv), gd = widen(dout);
      Vec out(sz(n_out)), preatt(sz(n_att)), att(sz(n_att)), dpreatt(sz(n_att)), datt(sz(n_att));
      attention_forward(host(), out.data(), preatt.data(), att.data(), q.data(), as.B, as.T, as.C,
                        as.NH);
      Vec dqkv = widen(dqkv0);
      attention_backward(host(), dqkv.data(), dpreatt.data(), datt.data(), gd.data(), q.data(),
                         att.data(), as.B, as.T, as.C, as.NH);
      expect_bf16_close("out", got[0], out, kAttnBf16Forward);
      expect_close("dqkv", got[1], dqkv, kAttnBf16Backward);
    }
}

// ---------------------------------------------------------------------------------------------
// GELU

TEST_P(KernelOpsTest, GeluForwardFp32AndBf16) {
  const std::int64_t n = std::int64_t(shape().B) * shape().T * 4 * shape().C + 3;
  const auto x = randn(sz(n + 1), 44, 2.0);
  const auto got = deterministic([&] {
    auto in = up(x), out = zeros<float>(n + 1), out1 = zeros<float>(n + 1);
    auto out_h = zeros<bf16>(n + 1), out1_h = zeros<bf16>(n + 1);
    elem_->gelu_forward(out.data(), in.data(), n);
    elem_->gelu_forward(out_h.data(), in.data(), n);
    elem_->gelu_forward(out1.data(), in.data() + 1, n);  // unaligned input: element by element
    elem_->gelu_forward(out1_h.data(), in.data() + 1, n);
    return Results{down(out), down(out_h), down(out1), down(out1_h)};
  });
  Vec ref(sz(n + 1), 0.0), ref1(sz(n + 1), 0.0);
  const Vec xd = widen(x);
  gelu_forward(host(), ref.data(), xd.data(), n);
  gelu_forward(host(), ref1.data(), xd.data() + 1, n);
  expect_close("fp32", got[0], ref, kTol);
  expect_close("fp32 unaligned", got[2], ref1, kTol);
  expect_is_rounded("bf16", got[1], got[0]);
  expect_is_rounded("bf16 unaligned", got[3], got[2]);
  expect_bf16_close("bf16", got[1], ref);
}

TEST_P(KernelOpsTest, GeluBackward) {
  const std::int64_t n = std::int64_t(shape().B) * shape().T * 4 * shape().C + 3;
  const auto x = randn(sz(n + 1), 45, 2.0), dout = randn(sz(n + 1), 46), d0 = randn(sz(n + 1), 47);
  const auto got = deterministic([&] {
    auto in = up(x), g = up(dout), d = up(d0), d1 = up(d0);
    auto dz = zeros<float>(n + 1), dn = up(std::vector<float>(sz(n + 1), kNaN));
    elem_->gelu_backward(d.data(), in.data(), g.data(), n, GradWrite::accumulate);
    elem_->gelu_backward(d1.data() + 1, in.data() + 1, g.data() + 1, n,  // unaligned
                         GradWrite::accumulate);
    elem_->gelu_backward(dz.data(), in.data(), g.data(), n, GradWrite::accumulate);
    elem_->gelu_backward(dn.data(), in.data(), g.data(), n, GradWrite::overwrite);
    return Results{down(d), down(d1), down(dz), down(dn)};
  });
  Vec ref = widen(d0), ref1 = widen(d0);
  const Vec xd = widen(x), gd = widen(dout);
  gelu_backward(host(), ref.data(), xd.data(), gd.data(), n);
  gelu_backward(host(), ref1.data() + 1, xd.data() + 1, gd.data() + 1, n);
  expect_close("dinp", got[0], ref, kGeluGradTol);
  expect_close("dinp unaligned", got[1], ref1, kGeluGradTol);
  // Overwritten: the bits of accumulating onto zeros, n elements and not the one past them.
  const std::vector<float> overwritten(got[3].begin(), got[3].begin() + n);
  EXPECT_TRUE(same_bits(overwritten, std::vector<float>(got[2].begin(), got[2].begin() + n)));
  EXPECT_TRUE(std::isnan(got[3][sz(n)])) << "overwrote past the end";
  Vec refz(sz(n), 0.0);
  gelu_backward(host(), refz.data(), xd.data(), gd.data(), n);
  expect_close("dinp overwritten", overwritten, refz, kGeluGradTol);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

struct Shard {
  int begin, width;  // vocabulary columns [begin, begin + width) of V
};

// Logits' rows ld apart with NaN padding: the forward must not read it, the backward (in place)
// must write it 0. Each phase from the reference's inputs, so each is checked alone.
TEST_P(KernelOpsTest, CrossEntropyPhasesAndBackward) {
  const Shape s = shape();
  const int N = s.B * s.T;
  Tokens targets = random_tokens(sz(N), s.V, 48);
  for (const Shard sh : {Shard{0, s.V}, Shard{3, s.V - 5}, Shard{s.V, 0}}) {
    SCOPED_TRACE("shard [" + std::to_string(sh.begin) + ", +" + std::to_string(sh.width) + ")");
    const int V = sh.width, ld = static_cast<int>(logits_row_stride(V + 1, LogitsRows::padded));
    std::vector<float> logits(sz(std::int64_t(N) * ld), kNaN);
    const auto values = randn(sz(std::int64_t(N) * V), 49, 2.0);
    for (int n = 0; n < N; ++n)
      std::copy_n(values.begin() + std::int64_t(n) * V, V, logits.begin() + std::int64_t(n) * ld);
    const auto dlosses = randn(sz(N), 50);
    // The double reference: statistics of this shard, then as if the shards were combined.
    Vec rowmax(sz(N)), stats(2 * sz(N)), losses(sz(N));
    const Vec z = widen(logits);
    crossentropy_rowmax(host(), rowmax.data(), z.data(), N, V, ld);
    crossentropy_partials(host(), stats.data(), z.data(), rowmax.data(), targets.data(), sh.begin,
                          N, V, ld);
    const Vec partial_stats = stats;
    if (V == 0) std::fill(stats.begin(), stats.begin() + N, 1.0);  // as if other shards summed
    crossentropy_losses(host(), losses.data(), stats.data(), N);
    const std::vector<float> rowmax_f(rowmax.begin(), rowmax.end()),
        stats_f(stats.begin(), stats.end());

    const auto got = deterministic([&] {
      auto t = up(targets);
      auto zl = up(logits), dl = up(dlosses), m_in = up(rowmax_f), st_in = up(stats_f);
      auto m = zeros<float>(N), st = zeros<float>(2 * std::int64_t(N)), l = zeros<float>(N);
      loss_->crossentropy_rowmax(m.data(), zl.data(), N, V, ld);
      loss_->crossentropy_partials(st.data(), zl.data(), m.data(), t.data(), sh.begin, N, V, ld);
      loss_->crossentropy_losses(l.data(), st_in.data(), N);
      loss_->crossentropy_backward(zl.data(), m_in.data(), st_in.data(), t.data(), dl.data(),
                                   sh.begin, N, V, ld);
      return Results{down(m), down(st), down(l), down(zl)};
    });
    for (int n = 0; n < N; ++n)  // the max is exact in any order; an empty shard gives lowest()
      ASSERT_EQ(got[0][sz(n)], V > 0 ? static_cast<float>(rowmax[sz(n)]) : -FLT_MAX) << n;
    expect_close("sums", std::vector<float>(got[1].begin(), got[1].begin() + N),
                 Vec(partial_stats.begin(), partial_stats.begin() + N), kTol);
    expect_close("target logit - max", std::vector<float>(got[1].begin() + N, got[1].end()),
                 Vec(partial_stats.begin() + N, partial_stats.end()), kTol);
    expect_close("losses", got[2], losses, kTol);
    Vec dlogits = z;
    const Vec dld = widen(dlosses);
    crossentropy_backward(host(), dlogits.data(), rowmax.data(), stats.data(), targets.data(),
                          dld.data(), sh.begin, N, V, ld);
    for (double d : dlogits) ASSERT_FALSE(std::isnan(d)) << "the reference left padding";
    expect_close("dlogits (padding 0)", got[3], dlogits, kTol);
    for (int n = 0; n < N; ++n)
      for (int v = V; v < ld; ++v)
        ASSERT_EQ(got[3][sz(std::int64_t(n) * ld + v)], 0.0f) << "padding " << n << ", " << v;
  }
}

// The fused classifier on bf16 logits (Bf16Activations::gemm_io): one forward pass giving the
// shard's statistics relative to its own max, the tensor-parallel rescale, and the backward
// writing bf16 dlogits over the logits. Rows ld apart with NaN padding (the forward must not
// read it, the backward writes it 0): ld padded (the vector path) and ld = V + 3 (odd: the
// one-column path). Each phase against the double reference of the bf16 values.
TEST_P(KernelOpsTest, CrossEntropyBf16FusedShard) {
  const Shape s = shape();
  const int N = s.B * s.T;
  const Tokens targets = random_tokens(sz(N), s.V, 53);
  for (const Shard sh : {Shard{0, s.V}, Shard{3, s.V - 5}, Shard{s.V, 0}})
    for (const bool padded : {true, false}) {
      if (!padded && sh.begin != 0) continue;  // the one-column path: the whole row is enough
      const int V = sh.width, ld = padded
                                       ? static_cast<int>(logits_row_stride(V + 1, LogitsRows::padded))
                                       : V + 3;
      SCOPED_TRACE("shard [" + std::to_string(sh.begin) + ", +" + std::to_string(V) + "), ld " +
                   std::to_string(ld));
      std::vector<float> logits(sz(std::int64_t(N) * ld), kNaN);
      const auto values = to_floats(rounded(randn(sz(std::int64_t(N) * V), 54, 3.0)));
      for (int n = 0; n < N; ++n)
        std::copy_n(values.begin() + std::int64_t(n) * V, V,
                    logits.begin() + std::int64_t(n) * ld);
      const auto logits_h = rounded(logits);
      const auto dlosses = randn(sz(N), 55);
      // The double reference: the shard's statistics relative to its max.
      const Vec z = widen(logits);
      Vec rowmax(sz(N)), stats(2 * sz(N));
      crossentropy_rowmax(host(), rowmax.data(), z.data(), N, V, ld);
      crossentropy_partials(host(), stats.data(), z.data(), rowmax.data(), targets.data(),
                            sh.begin, N, V, ld);
      Vec bstats = stats;  // the backward's statistics: as if other shards summed to 1
      if (V == 0) std::fill(bstats.begin(), bstats.begin() + N, 1.0);
      const std::vector<float> rowmax_f(rowmax.begin(), rowmax.end()),
          bstats_f(bstats.begin(), bstats.end());
      const auto got = deterministic([&] {
        auto t = up(targets);
        auto zl = up(logits_h);
        auto dl = up(dlosses), m_in = up(rowmax_f), st_in = up(bstats_f);
        auto m = zeros<float>(N), st = zeros<float>(3 * std::int64_t(N));
        loss_->crossentropy_forward(m.data(), st.data(), zl.data(), t.data(), sh.begin, N, V, ld);
        loss_->crossentropy_backward(zl.data(), m_in.data(), st_in.data(), t.data(), dl.data(),
                                     sh.begin, N, V, ld);
        return Results{down(m), down(st), down(zl)};
      });
      for (int n = 0; n < N; ++n) {  // the max is exact in any order; empty shard: lowest()
        const float want = V > 0 ? static_cast<float>(rowmax[sz(n)]) : -FLT_MAX;
        ASSERT_EQ(got[0][sz(n)], want) << n;
        ASSERT_EQ(got[1][2 * sz(N) + sz(n)], want) << "the shard's max kept, " << n;
      }
      expect_close("sums", std::vector<float>(got[1].begin(), got[1].begin() + N),
                   Vec(stats.begin(), stats.begin() + N), kTol);
      expect_close("target logit - max",
                   std::vector<float>(got[1].begin() + N, got[1].begin() + 2 * N),
                   Vec(stats.begin() + N, stats.end()), kTol);
      Vec dlogits = z;
      const Vec dld = widen(dlosses);
      crossentropy_backward(host(), dlogits.data(), rowmax.data(), bstats.data(), targets.data(),
                            dld.data(), sh.begin, N, V, ld);
      expect_bf16_close("dlogits (padding 0)", got[2], dlogits);
      for (int n = 0; n < N; ++n)
        for (int v = V; v < ld; ++v)
          ASSERT_EQ(got[2][sz(std::int64_t(n) * ld + v)], 0.0f) << "padding " << n << ", " << v;
    }
}

// Tensor parallelism: the vocabulary in three shards (one of padding only), each shard's fused
// forward on the backend, the group's max, each shard rescaled on the backend, the sums over
// the shards: the losses and the backward's dlogits of the whole vocabulary in double.
TEST_P(KernelOpsTest, CrossEntropyBf16FusedShardsCombine) {
  const Shape s = shape();
  const int N = s.B * s.T, V = s.V;
  const Tokens targets = random_tokens(sz(N), V, 56);
  const std::vector<Shard> shards{{0, V / 3}, {V / 3, V - V / 3}, {V, 0}};
  const auto values = to_floats(rounded(randn(sz(std::int64_t(N) * V), 57, 3.0)));
  const auto dlosses = randn(sz(N), 58);
  const auto shard_logits = [&](const Shard& sh, int ld) {
    std::vector<float> z(sz(std::int64_t(N) * ld), kNaN);
    for (int n = 0; n < N; ++n)
      std::copy_n(values.begin() + std::int64_t(n) * V + sh.begin, sh.width,
                  z.begin() + std::int64_t(n) * ld);
    return rounded(z);
  };
  const auto ld_of = [](const Shard& sh) {
    return static_cast<int>(logits_row_stride(sh.width + 1, LogitsRows::padded));
  };
  const auto got = deterministic([&] {
    auto t = up(targets);
    auto dl = up(dlosses), l = zeros<float>(N);
    std::vector<Buffer<bf16>> z;
    std::vector<Buffer<float>> m, st;
    for (const Shard& sh : shards) {
      z.push_back(up(shard_logits(sh, ld_of(sh))));
      m.push_back(zeros<float>(N)), st.push_back(zeros<float>(3 * std::int64_t(N)));
      loss_->crossentropy_forward(m.back().data(), st.back().data(), z.back().data(), t.data(),
                                  sh.begin, N, sh.width, ld_of(sh));
    }
    std::vector<float> group_max(sz(N), -FLT_MAX), sums(2 * sz(N), 0.0f);  // the collectives
    for (auto& mi : m) {
      const auto h = down(mi);
      for (int n = 0; n < N; ++n) group_max[sz(n)] = std::max(group_max[sz(n)], h[sz(n)]);
    }
    auto gm = up(group_max);
    for (std::size_t i = 0; i < shards.size(); ++i) {
      loss_->crossentropy_rescale(st[i].data(), gm.data(), t.data(), shards[i].begin, N,
                                  shards[i].width);
      const auto h = down(st[i]);
      for (std::size_t j = 0; j < sums.size(); ++j) sums[j] += h[j];
    }
    auto sum = up(sums);
    loss_->crossentropy_losses(l.data(), sum.data(), N);
    Results out{down(l)};
    for (std::size_t i = 0; i < shards.size(); ++i) {
      loss_->crossentropy_backward(z[i].data(), gm.data(), sum.data(), t.data(), dl.data(),
                                   shards[i].begin, N, shards[i].width, ld_of(shards[i]));
      out.push_back(dense_columns(down(z[i]), N, shards[i].width, ld_of(shards[i])));
    }
    return out;
  });
  const Vec z = widen(values), dld = widen(dlosses);
  Vec rowmax(sz(N)), stats(2 * sz(N)), losses(sz(N));
  crossentropy_rowmax(host(), rowmax.data(), z.data(), N, V, V);
  crossentropy_partials(host(), stats.data(), z.data(), rowmax.data(), targets.data(), 0, N, V, V);
  crossentropy_losses(host(), losses.data(), stats.data(), N);
  expect_close("losses", got[0], losses, kTol);
  Vec dlogits = z;
  crossentropy_backward(host(), dlogits.data(), rowmax.data(), stats.data(), targets.data(),
                        dld.data(), 0, N, V, V);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    Vec want(sz(std::int64_t(N) * shards[i].width));
    for (int n = 0; n < N; ++n)
      std::copy_n(dlogits.begin() + std::int64_t(n) * V + shards[i].begin, shards[i].width,
                  want.begin() + std::int64_t(n) * shards[i].width);
    expect_bf16_close("dlogits of shard " + std::to_string(i), got[1 + i], want);
  }
}

TEST_P(KernelOpsTest, SumLossesIsTheCpuLoopBitForBit) {
  const int n = shape().B * shape().T * 37;
  const auto losses = randn(sz(n), 52, 3.0, 5.0);
  double expected = 0.0;
  for (const float l : losses) expected += l;
  for (const int count : {n, 1, 0}) {
    auto l = up(losses);
    auto sum = up(std::vector<double>{-1.0});
    loss_->sum_losses(sum.data(), l.data(), count);
    double want = 0.0;
    for (int i = 0; i < count; ++i) want += losses[sz(i)];
    const double got = to_host(*device_, sum)[0];
    EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << count << ": " << got << " vs " << want;
  }
  EXPECT_NE(expected, 0.0);
}

std::string test_name(const ::testing::TestParamInfo<std::tuple<TestBackend, Shape>>& info) {
  return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(Backends, KernelOpsTest,
                         ::testing::Combine(::testing::ValuesIn(test_backends()),
                                            ::testing::ValuesIn(kShapes)),
                         test_name);

std::vector<TestBackend> backends_and_attention_families() {
  std::vector<TestBackend> all = test_backends();
  for (const TestBackend& b : attention_backends()) all.push_back(b);
  return all;
}
INSTANTIATE_TEST_SUITE_P(Backends, AttentionOpsTest,
                         ::testing::Combine(::testing::ValuesIn(backends_and_attention_families()),
                                            ::testing::ValuesIn(kShapes)),
                         test_name);

}  // namespace
}  // namespace pdtrain::kernels::testing
