// The GPT-2 kernels: forward results against naive references, every backward against central
// finite differences of its forward (in double), float against double, and accumulation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "pdtrain/core/rng.hpp"
#include "pdtrain/kernels/gpt_kernels.hpp"

namespace pdtrain::kernels {
namespace {

using Vec = std::vector<double>;
using Tokens = std::vector<std::int32_t>;

// Small shapes: every gradient element is checked, so these stay tiny. OC != C and V is odd
// so a swapped dimension or transpose cannot go unnoticed.
constexpr int B = 2, T = 5, C = 8, NH = 2, V = 11, OC = 12, kMaxT = 7;
constexpr int N = B * T;

Kokkos::DefaultHostExecutionSpace host() { return {}; }

// Normal random values, rounded to float so float and double kernels see identical inputs.
Vec random_vec(std::size_t n, std::uint64_t seed, double scale = 1.0, double offset = 0.0) {
  Vec v(n);
  const std::uint64_t key = rng_key(0x6b65726e656c73ull, seed);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(offset + scale * rng_normal(key, i));
  return v;
}

Tokens random_tokens(std::size_t n, int below, std::uint64_t seed) {
  Tokens t(n);
  const std::uint64_t key = rng_key(0x746f6b656e73ull, seed);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>(rng_below(key, i, below));
  return t;
}

template <class Real>
std::vector<Real> as(const Vec& v) {
  return std::vector<Real>(v.begin(), v.end());
}

template <class Real>
Vec to_vec(const std::vector<Real>& v) {
  host().fence();  // kernels may be asynchronous; results are read on the host
  return Vec(v.begin(), v.end());
}

// The cross-entropy's forward phases on one shard holding every column (targets in [0, V),
// dense rows); rowmax [N] and stats [2N] are what its backward takes.
template <class Real>
void softmax_crossentropy_forward(Real* losses, Real* rowmax, Real* stats, const Real* logits,
                                  const std::int32_t* targets, int N, int V) {
  crossentropy_rowmax(host(), rowmax, logits, N, V, V);
  crossentropy_partials(host(), stats, logits, rowmax, targets, 0, N, V, V);
  crossentropy_losses(host(), losses, stats, N);
  host().fence();
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Expects |actual - expected| <= tol * max(1, |expected|) elementwise; reports the first few.
void expect_close(const std::string& what, const Vec& actual, const Vec& expected, double tol) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double bound = tol * std::max(1.0, std::abs(expected[i]));
    if (!(std::abs(actual[i] - expected[i]) <= bound) && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << actual[i] << " vs expected " << expected[i];
  }
  EXPECT_EQ(failures, 0) << what << ": elements out of tolerance " << tol;
}

// ---------------------------------------------------------------------------------------------
// Kernel cases. Each holds its inputs in double and runs its forward/backward in either
// precision. forward<Real>() returns `out`, of which the test loss is L = sum(out .* R);
// backward<Real>(R, calls) runs the backward `calls` times on zeroed gradients with dout = R
// and returns the gradients in the order of params(), the inputs L is differentiated by.

struct Param {
  const char* name;
  Vec* value;
};

struct EncoderCase {
  static constexpr const char* kName = "Encoder";
  Tokens tokens = {3, 1, 3, 3, 0, 7, 1, 10, 3, 3};  // repeats within and across sequences
  Vec wte = random_vec(V * C, 1), wpe = random_vec(kMaxT * C, 2);

  std::vector<Param> params() { return {{"dwte", &wte}, {"dwpe", &wpe}}; }

  template <class Real>
  Vec forward() const {
    auto w = as<Real>(wte), p = as<Real>(wpe);
    std::vector<Real> out(N * C);
    encoder_forward(host(), out.data(), tokens.data(), w.data(), p.data(), B, T, C);
    return to_vec(out);
  }
  template <class Real>
  std::vector<Vec> backward(const Vec& R, int calls) const {
    auto dout = as<Real>(R);
    std::vector<Real> dwte(wte.size()), dwpe(wpe.size());
    for (int k = 0; k < calls; ++k)
      encoder_backward(host(), dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    return {to_vec(dwte), to_vec(dwpe)};
  }
};

struct LayerNormCase {
  static constexpr const char* kName = "LayerNorm";
  Vec inp = random_vec(N * C, 3, 1.0, 2.0);  // offset mean: the mean term must matter
  Vec weight = random_vec(C, 4, 0.5, 1.0), bias = random_vec(C, 5);

  std::vector<Param> params() { return {{"dinp", &inp}, {"dweight", &weight}, {"dbias", &bias}}; }

  template <class Real>
  struct Saved {
    std::vector<Real> out = std::vector<Real>(N * C), mean = std::vector<Real>(N),
                      rstd = std::vector<Real>(N);
  };
  template <class Real>
  Saved<Real> run(const std::vector<Real>& x, const std::vector<Real>& w,
                  const std::vector<Real>& b) const {
    Saved<Real> s;
    layernorm_forward(host(), s.out.data(), s.mean.data(), s.rstd.data(), x.data(), w.data(),
                      b.data(), N, C);
    return s;
  }
  template <class Real>
  Vec forward() const {
    return to_vec(run(as<Real>(inp), as<Real>(weight), as<Real>(bias)).out);
  }
  template <class Real>
  std::vector<Vec> backward(const Vec& R, int calls) const {
    auto x = as<Real>(inp), w = as<Real>(weight), b = as<Real>(bias), dout = as<Real>(R);
    const Saved<Real> s = run(x, w, b);
    std::vector<Real> dinp(inp.size()), dweight(C), dbias(C);
    for (int k = 0; k < calls; ++k)
      layernorm_backward(host(), dinp.data(), dweight.data(), dbias.data(), dout.data(), x.data(),
                         w.data(), s.mean.data(), s.rstd.data(), N, C);
    return {to_vec(dinp), to_vec(dweight), to_vec(dbias)};
  }
};

template <bool kWithBias>
struct MatmulCase {
  static constexpr const char* kName = kWithBias ? "MatmulWithBias" : "MatmulNoBias";
  Vec inp = random_vec(N * C, 6), weight = random_vec(OC * C, 7), bias = random_vec(OC, 8);

  std::vector<Param> params() {
    if (kWithBias) return {{"dinp", &inp}, {"dweight", &weight}, {"dbias", &bias}};
    return {{"dinp", &inp}, {"dweight", &weight}};
  }

  template <class Real>
  Vec forward() const {
    auto x = as<Real>(inp), w = as<Real>(weight), b = as<Real>(bias);
    std::vector<Real> out(N * OC);
    matmul_forward(host(), out.data(), x.data(), w.data(), kWithBias ? b.data() : nullptr, N, C,
                   OC);
    return to_vec(out);
  }
  template <class Real>
  std::vector<Vec> backward(const Vec& R, int calls) const {
    auto x = as<Real>(inp), w = as<Real>(weight), dout = as<Real>(R);
    std::vector<Real> dinp(inp.size()), dweight(weight.size()), dbias(OC);
    for (int k = 0; k < calls; ++k)
      matmul_backward(host(), dinp.data(), dweight.data(), kWithBias ? dbias.data() : nullptr,
                      dout.data(), x.data(), w.data(), N, C, OC);
    if (kWithBias) return {to_vec(dinp), to_vec(dweight), to_vec(dbias)};
    return {to_vec(dinp), to_vec(dweight)};
  }
};

struct AttentionCase {
  static constexpr const char* kName = "Attention";
  Vec qkv = random_vec(N * 3 * C, 9);

  std::vector<Param> params() { return {{"dqkv", &qkv}}; }

  template <class Real>
  struct Saved {
    std::vector<Real> out = std::vector<Real>(N * C), preatt = std::vector<Real>(B * NH * T * T),
                      att = std::vector<Real>(B * NH * T * T);
  };
  template <class Real>
  Saved<Real> run(const std::vector<Real>& x) const {
    Saved<Real> s;
    attention_forward(host(), s.out.data(), s.preatt.data(), s.att.data(), x.data(), B, T, C, NH);
    return s;
  }
  template <class Real>
  Vec forward() const {
    return to_vec(run(as<Real>(qkv)).out);
  }
  template <class Real>
  std::vector<Vec> backward(const Vec& R, int calls) const {
    auto x = as<Real>(qkv), dout = as<Real>(R);
    const Saved<Real> s = run(x);
    std::vector<Real> dqkv(qkv.size());
    // Scratch starts as garbage: the kernel must overwrite it, not accumulate into it.
    std::vector<Real> dpreatt(s.att.size(), Real(123)), datt(s.att.size(), Real(-7));
    for (int k = 0; k < calls; ++k)
      attention_backward(host(), dqkv.data(), dpreatt.data(), datt.data(), dout.data(), x.data(),
                         s.att.data(), B, T, C, NH);
    return {to_vec(dqkv)};
  }
};

struct GeluCase {
  static constexpr const char* kName = "Gelu";
  Vec inp = random_vec(N * 4 * C, 10, 2.0);

  std::vector<Param> params() { return {{"dinp", &inp}}; }

  template <class Real>
  Vec forward() const {
    auto x = as<Real>(inp);
    std::vector<Real> out(x.size());
    gelu_forward(host(), out.data(), x.data(), Index(x.size()));
    return to_vec(out);
  }
  template <class Real>
  std::vector<Vec> backward(const Vec& R, int calls) const {
    auto x = as<Real>(inp), dout = as<Real>(R);
    std::vector<Real> dinp(x.size());
    for (int k = 0; k < calls; ++k)
      gelu_backward(host(), dinp.data(), x.data(), dout.data(), Index(x.size()));
    return {to_vec(dinp)};
  }
};

// The residual's backward adds dout into both branches.
struct ResidualCase {
  static constexpr const char* kName = "Residual";
  Vec a = random_vec(N * C, 11), b = random_vec(N * C, 12);

  std::vector<Param> params() { return {{"da", &a}, {"db", &b}}; }

  template <class Real>
  Vec forward() const {
    auto x = as<Real>(a), y = as<Real>(b);
    std::vector<Real> out(x.size());
    residual_forward(host(), out.data(), x.data(), y.data(), Index(x.size()));
    return to_vec(out);
  }
  template <class Real>
  std::vector<Vec> backward(const Vec& R, int calls) const {
    auto dout = as<Real>(R);
    std::vector<Real> da(a.size()), db(b.size());
    for (int k = 0; k < calls; ++k) {
      for (std::size_t i = 0; i < dout.size(); ++i) da[i] += dout[i], db[i] += dout[i];
    }
    return {to_vec(da), to_vec(db)};
  }
};

struct CrossEntropyCase {
  static constexpr const char* kName = "CrossEntropy";
  Vec logits = random_vec(N * V, 13, 2.0);
  Tokens targets = random_tokens(N, V, 14);

  std::vector<Param> params() { return {{"dlogits", &logits}}; }

  template <class Real>
  struct Saved {
    std::vector<Real> losses = std::vector<Real>(N), rowmax = std::vector<Real>(N),
                      stats = std::vector<Real>(2 * N);
  };
  template <class Real>
  Saved<Real> run(const std::vector<Real>& z) const {
    Saved<Real> s;
    softmax_crossentropy_forward(s.losses.data(), s.rowmax.data(), s.stats.data(), z.data(),
                                 targets.data(), N, V);
    return s;
  }
  template <class Real>
  Vec forward() const {
    return to_vec(run(as<Real>(logits)).losses);
  }
  template <class Real>
  std::vector<Vec> backward(const Vec& R, int calls) const {
    const std::vector<Real> z = as<Real>(logits);
    const Saved<Real> s = run(z);
    auto dlosses = as<Real>(R);
    // The backward writes dlogits over the logits: each call on a fresh copy, the results
    // summed here (so "accumulates" checks that every call gives the same gradient).
    Vec dlogits(logits.size(), 0.0);
    for (int k = 0; k < calls; ++k) {
      std::vector<Real> d = z;
      crossentropy_backward(host(), d.data(), s.rowmax.data(), s.stats.data(), targets.data(),
                            dlosses.data(), 0, N, V, V);
      const Vec got = to_vec(d);
      for (std::size_t i = 0; i < got.size(); ++i) dlogits[i] += got[i];
    }
    return {dlogits};
  }
};

// ---------------------------------------------------------------------------------------------
// The three checks every case goes through.

template <class Case>
class KernelPair : public ::testing::Test {};

using Cases = ::testing::Types<EncoderCase, LayerNormCase, MatmulCase<true>, MatmulCase<false>,
                               AttentionCase, GeluCase, ResidualCase, CrossEntropyCase>;

struct CaseName {
  template <class Case>
  static std::string GetName(int) {
    return Case::kName;
  }
};
TYPED_TEST_SUITE(KernelPair, Cases, CaseName);

// Analytic gradients from the backward against (L(x+h) - L(x-h)) / 2h for every element of
// every input, in double. With h = 1e-6 the truncation error is ~h^2 |L'''| ~ 1e-12 and the
// rounding error ~1e-16 |L| / h ~ 1e-9, so the tolerance 1e-6 * max(1, |grad|) leaves room
// for both while any wrong sign, factor or index (errors of order the gradient) fails.
TYPED_TEST(KernelPair, BackwardMatchesFiniteDifferences) {
  TypeParam k;
  const Vec R = random_vec(k.template forward<double>().size(), 99);
  const std::vector<Vec> analytic = k.template backward<double>(R, 1);
  std::vector<Param> params = k.params();
  ASSERT_EQ(analytic.size(), params.size());

  constexpr double h = 1e-6, tol = 1e-6;
  for (std::size_t p = 0; p < params.size(); ++p) {
    Vec& x = *params[p].value;
    Vec numeric(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = dot(k.template forward<double>(), R);
      x[i] = saved - h;
      const double down = dot(k.template forward<double>(), R);
      x[i] = saved;
      numeric[i] = (up - down) / (2 * h);
    }
    // A gradient that is zero everywhere would make the comparison vacuous.
    EXPECT_GT(max_abs(numeric), 1e-2) << params[p].name;
    expect_close(params[p].name, analytic[p], numeric, tol);
  }
}

// Same inputs (exactly representable in float): float results within 1e-5 * max(1, |ref|)
// of double, i.e. a few hundred float ulps over reductions of at most a few dozen terms.
TYPED_TEST(KernelPair, FloatMatchesDouble) {
  const TypeParam k;
  expect_close("forward", k.template forward<float>(), k.template forward<double>(), 1e-5);
  const Vec R = random_vec(k.template forward<double>().size(), 98);
  const std::vector<Vec> single = k.template backward<float>(R, 1);
  const std::vector<Vec> dbl = k.template backward<double>(R, 1);
  ASSERT_EQ(single.size(), dbl.size());
  for (std::size_t p = 0; p < dbl.size(); ++p)
    expect_close("backward gradient " + std::to_string(p), single[p], dbl[p], 1e-5);
}

// Backward accumulates into its gradients: two calls give twice one call.
TYPED_TEST(KernelPair, BackwardAccumulates) {
  const TypeParam k;
  const Vec R = random_vec(k.template forward<double>().size(), 97);
  const std::vector<Vec> once = k.template backward<double>(R, 1);
  const std::vector<Vec> twice = k.template backward<double>(R, 2);
  ASSERT_EQ(once.size(), twice.size());
  for (std::size_t p = 0; p < once.size(); ++p) {
    Vec doubled = once[p];
    for (double& g : doubled) g *= 2;
    EXPECT_GT(max_abs(once[p]), 0.0);
    expect_close("gradient " + std::to_string(p), twice[p], doubled, 1e-12);
  }
}

// ---------------------------------------------------------------------------------------------
// Forward results against naive references written independently of the kernels.

TEST(KernelForward, EncoderAddsTokenAndPositionRows) {
  const EncoderCase k;
  const Vec out = k.forward<double>();
  for (int bt = 0; bt < N; ++bt)
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(out[bt * C + c], k.wte[k.tokens[bt] * C + c] + k.wpe[(bt % T) * C + c]);
}

TEST(KernelForward, LayerNormMatchesReference) {
  const LayerNormCase k;
  Vec expected(N * C);
  for (int n = 0; n < N; ++n) {
    const double* x = &k.inp[n * C];
    double mean = 0, var = 0;
    for (int i = 0; i < C; ++i) mean += x[i] / C;
    for (int i = 0; i < C; ++i) var += (x[i] - mean) * (x[i] - mean) / C;
    for (int i = 0; i < C; ++i)
      expected[n * C + i] = (x[i] - mean) / std::sqrt(var + 1e-5) * k.weight[i] + k.bias[i];
  }
  expect_close("layernorm", k.forward<double>(), expected, 1e-12);
}

TEST(KernelForward, MatmulMatchesReference) {
  const MatmulCase<true> k;
  Vec expected(N * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = k.bias[o];
      for (int c = 0; c < C; ++c) s += k.inp[n * C + c] * k.weight[o * C + c];
      expected[n * OC + o] = s;
    }
  expect_close("matmul", k.forward<double>(), expected, 1e-12);
}

TEST(KernelForward, MatmulBackwardWithoutInputGradient) {
  const MatmulCase<true> k;
  const Vec R = random_vec(N * OC, 96);
  const Vec full = k.backward<double>(R, 1)[1];
  std::vector<double> dweight(OC * C), dout(R);
  matmul_backward(host(), nullptr, dweight.data(), nullptr, dout.data(), k.inp.data(),
                  k.weight.data(), N, C, OC);
  expect_close("dweight", to_vec(dweight), full, 1e-14);
}

TEST(KernelForward, AttentionMatchesReference) {
  const AttentionCase k;
  const int HS = C / NH;
  Vec expected(N * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        auto at = [&](int tok, int part, int i) {
          return k.qkv[(b * T + tok) * 3 * C + part * C + h * HS + i];
        };
        Vec w(t + 1);
        double sum = 0;
        for (int u = 0; u <= t; ++u) {
          double s = 0;
          for (int i = 0; i < HS; ++i) s += at(t, 0, i) * at(u, 1, i);
          w[u] = std::exp(s / std::sqrt(double(HS)));
          sum += w[u];
        }
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < HS; ++i)
            expected[(b * T + t) * C + h * HS + i] += w[u] / sum * at(u, 2, i);
      }
  expect_close("attention", k.forward<double>(), expected, 1e-12);

  // Probabilities: causal rows summing to one.
  const auto s = k.run(as<double>(k.qkv));
  host().fence();
  for (int row = 0; row < B * NH * T; ++row) {
    const int t = row % T;
    double total = 0;
    for (int u = 0; u < T; ++u) {
      if (u > t) EXPECT_EQ(s.att[row * T + u], 0.0);
      total += s.att[row * T + u];
    }
    EXPECT_NEAR(total, 1.0, 1e-12);
  }
}

TEST(KernelForward, GeluKnownValues) {
  const std::vector<double> x = {0.0, 1.0, -1.0, 2.5};
  std::vector<double> out(x.size());
  gelu_forward(host(), out.data(), x.data(), Index(x.size()));
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated in Python.
  expect_close("gelu", to_vec(out),
               {0.0, 0.8411919906082768, -0.15880800939172324, 2.484915733910001}, 1e-14);
}

TEST(KernelForward, CrossEntropyMatchesReferenceAndIsStable) {
  const CrossEntropyCase k;
  Vec expected(N);
  for (int n = 0; n < N; ++n) {
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(k.logits[n * V + v]);
    expected[n] = -std::log(std::exp(k.logits[n * V + k.targets[n]]) / sum);
  }
  expect_close("losses", k.forward<double>(), expected, 1e-12);

  // Huge logits: a kernel without the max subtraction overflows exp() to inf / NaN; in float,
  // a target probability that underflows must still give a finite loss.
  const std::vector<float> logits = {1000.f, 999.f, 998.f, 1000.f, 0.f, -1000.f};
  const Tokens targets = {0, 2};
  std::vector<float> losses(2), rowmax(2), stats(4);
  softmax_crossentropy_forward(losses.data(), rowmax.data(), stats.data(), logits.data(),
                               targets.data(), 2, 3);
  const Vec got = to_vec(losses);
  EXPECT_NEAR(got[0], 0.4076059644443804, 1e-6);  // log(1 + e^-1 + e^-2)
  EXPECT_NEAR(got[1], 2000.0, 1e-3);
}

TEST(KernelForward, FillAndResidual) {
  std::vector<float> a(37, 5.f);
  fill_value(host(), a.data(), Index(a.size()), 0.0f);
  EXPECT_EQ(max_abs(to_vec(a)), 0.0);
  fill_value(host(), a.data(), Index(a.size()), 2.5f);
  std::vector<float> sum(a.size());
  residual_forward(host(), sum.data(), a.data(), a.data(), Index(a.size()));
  for (double s : to_vec(sum)) EXPECT_EQ(s, 5.0);
}


// Vocabulary parallelism: the lookup and the cross-entropy computed on shards of the vocabulary
// and combined (sum of lookups; max, then sums of statistics) equal the one-shard results, and
// each shard's logit gradient is its slice of the full one. Shard 2 holds only padding rows.
// Shard rows are padded (row stride w + 5): the padding is NaN in forward, never read, and the
// backward writes it 0.
TEST(KernelVocabParallel, ShardsCombineToTheFullResult) {
  const int bounds[] = {0, 4, 11, 16};  // three shards of a 16-row (padded) vocabulary of 11
  constexpr int kPad = 5;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Vec logits = random_vec(N * V, 21, 3.0);
  const Tokens targets = random_tokens(N, V, 22);
  std::vector<double> losses(N), full_max(N), full_stats(2 * N);
  softmax_crossentropy_forward(losses.data(), full_max.data(), full_stats.data(), logits.data(),
                               targets.data(), N, V);
  std::vector<double> rowmax(N, std::numeric_limits<double>::lowest()), stats(2 * N, 0.0);
  std::vector<std::vector<double>> shard_logits(3);
  int width[3];
  for (int s = 0; s < 3; ++s) {
    const int w = width[s] = std::max(0, std::min(bounds[s + 1], V) - bounds[s]), ld = w + kPad;
    shard_logits[s].assign(static_cast<std::size_t>(N * ld), nan);
    for (int n = 0; n < N; ++n)
      for (int v = 0; v < w; ++v) shard_logits[s][n * ld + v] = logits[n * V + bounds[s] + v];
    std::vector<double> m(N);
    crossentropy_rowmax(host(), m.data(), shard_logits[s].data(), N, w, ld);
    for (int n = 0; n < N; ++n) rowmax[n] = std::max(rowmax[n], m[n]);  // the max combine
  }
  for (int s = 0; s < 3; ++s) {
    std::vector<double> part(2 * N);
    crossentropy_partials(host(), part.data(), shard_logits[s].data(), rowmax.data(),
                          targets.data(), bounds[s], N, width[s], width[s] + kPad);
    for (int i = 0; i < 2 * N; ++i) stats[i] += part[i];  // the sum combine
  }
  std::vector<double> shard_losses(N);
  crossentropy_losses(host(), shard_losses.data(), stats.data(), N);
  const Vec dl = random_vec(N, 23);
  std::vector<double> dfull(logits.begin(), logits.end());
  crossentropy_backward(host(), dfull.data(), full_max.data(), full_stats.data(), targets.data(),
                        dl.data(), 0, N, V, V);
  for (int s = 0; s < 3; ++s) {
    const int w = width[s], ld = w + kPad;
    std::vector<double>& d = shard_logits[s];
    crossentropy_backward(host(), d.data(), rowmax.data(), stats.data(), targets.data(),
                          dl.data(), bounds[s], N, w, ld);
    for (int n = 0; n < N; ++n) {
      for (int v = 0; v < w; ++v) EXPECT_NEAR(d[n * ld + v], dfull[n * V + bounds[s] + v], 1e-12);
      for (int v = w; v < ld; ++v) EXPECT_EQ(d[n * ld + v], 0.0) << "padding " << n << "," << v;
    }
  }
  expect_close("sharded losses", Vec(shard_losses.begin(), shard_losses.end()),
               Vec(losses.begin(), losses.end()), 1e-12);

  // The lookup: shards' partial embeddings (positions added on shard 0 only) sum to the full one.
  const Vec wte = random_vec(16 * C, 24), wpe = random_vec(kMaxT * C, 25);
  const Tokens tokens = random_tokens(N, V, 26);
  std::vector<double> full(N * C), sum(N * C, 0.0), part(N * C);
  encoder_forward(host(), full.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int s = 0; s < 3; ++s) {
    encoder_forward(host(), part.data(), tokens.data(), wte.data() + bounds[s] * C,
                    s == 0 ? wpe.data() : nullptr, B, T, C, bounds[s], bounds[s + 1]);
    for (int i = 0; i < N * C; ++i) sum[i] += part[i];
  }
  for (int i = 0; i < N * C; ++i) EXPECT_EQ(sum[i], full[i]) << i;
}

}  // namespace
}  // namespace pdtrain::kernels
