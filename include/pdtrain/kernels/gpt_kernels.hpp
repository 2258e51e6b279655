#pragma once
// GPT-2 layer kernels after llm.c, each forward next to its backward.
//
// Conventions (shared by every kernel below):
//  * Row-major raw pointers, shapes as in llm.c: B batch, T sequence, C channels, NH heads,
//    HS = C / NH, N = B * T rows. Under tensor parallelism C and NH are the LOCAL width and
//    head count of this rank.
//  * `exec` is a Kokkos execution space instance; pointers must be accessible from it.
//    Kernels are enqueued on `exec` and may run asynchronously: fence `exec` before reading
//    results on the host. (matmul_* and attention_* call BLAS on the host between their
//    Kokkos parts and fence exec before each BLAS call.)
//  * Every kernel is race-free and deterministic under a threaded backend: it parallelizes
//    over independent outputs only and loops sequentially, in a fixed order, over reduced
//    dimensions. No float atomics, no parallel reductions. Reductions along a row use a fixed
//    number of interleaved partial sums (detail::kLanes), so the order depends on the length
//    only, never on threads or chunking.
//  * Every backward ACCUMULATES (+=) into its gradient outputs, like llm.c, so the caller
//    zeroes gradients once per step; where an input gradient's buffer would be zeroed just
//    before, a GradWrite::overwrite argument writes it instead (grad_write.hpp: the same bits,
//    no clear). Scratch buffers (attention's dpreatt/datt) are overwritten.
//  * Pointers documented as "may be null" are skipped when null; all others are required.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "pdtrain/kernels/gemm.hpp"
#include "pdtrain/kernels/grad_write.hpp"

namespace pdtrain::kernels {

using Index = std::int64_t;  // element offsets: B*NH*T*T and N*V can exceed int

// A parameter whose type follows Real instead of deducing it, so nullptr can be passed.
template <class Real>
using NotDeduced = std::type_identity_t<Real>;

// A kernel's result stored as Out: the value itself, or rounded to bf16 (to nearest even) where a
// kernel writes the bf16 input of a mixed-precision matmul directly (one pass, no fp32 copy).
template <class Out, class Real>
KOKKOS_INLINE_FUNCTION Out to_out(Real v) {
  if constexpr (std::is_same_v<Out, bf16>)
    return to_bf16(static_cast<float>(v));
  else
    return static_cast<Out>(v);
}

namespace detail {

#if KOKKOS_VERSION >= 40000
using Kokkos::exp;
using Kokkos::log;
using Kokkos::sqrt;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
#endif

template <class Exec>
using Range = Kokkos::RangePolicy<Exec, Kokkos::IndexType<Index>>;

// Runs body(i) for i in [0, n) on exec; each i must write only outputs no other i touches.
template <class Exec, class Body>
void for_each(const char* label, const Exec& exec, Index n, const Body& body) {
  Kokkos::parallel_for(label, Range<Exec>(exec, 0, n), body);
}

// Element-wise work in chunks: body(begin, end) over [0, n) cut into pieces of kChunk elements,
// each a plain loop the compiler vectorizes (a per-element functor call often defeats that).
constexpr Index kChunk = 2048;
template <class Exec, class Body>
void for_each_chunk(const char* label, const Exec& exec, Index n, const Body& body) {
  const Index chunks = (n + kChunk - 1) / kChunk;
  Kokkos::parallel_for(
      label, Range<Exec>(exec, 0, chunks), KOKKOS_LAMBDA(const Index k) {
        const Index begin = k * kChunk;
        body(begin, begin + kChunk < n ? begin + kChunk : n);
      });
}

// Column reductions (sums over rows of a row-major [rows, cols] array) are parallel over
// column panels of kPanel columns; each panel walks the rows in order with contiguous,
// vectorizable inner loops. Per column, the sum is the same sequence of additions as a plain
// loop over the rows: the panel width never changes a result.
constexpr int kPanel = 64;

// Row reductions in kLanes interleaved partial sums, combined in a fixed tree at the end:
// vectorizable without -ffast-math, and deterministic (the order depends on n only).
constexpr int kLanes = 8;

template <class Real>
KOKKOS_INLINE_FUNCTION Real combine_lanes(const Real* acc) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// acc[i % kLanes] += x[i]: the lanes of sum() (a longer sum fed in pieces of a multiple of
// kLanes elements, the last one any length, gets sum()'s bits).
template <class Real>
KOKKOS_INLINE_FUNCTION void add_to_lanes(Real* acc, const Real* x, Index n) {
  Index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  for (int j = 0; i + j < n; ++j) acc[j] += x[i + j];
}

// sum_i x[i]
template <class Real>
KOKKOS_INLINE_FUNCTION Real sum(const Real* x, Index n) {
  Real acc[kLanes] = {};
  add_to_lanes(acc, x, n);
  return combine_lanes(acc);
}

// sum_i x[i] * y[i]
template <class Real>
KOKKOS_INLINE_FUNCTION Real dot(const Real* x, const Real* y, Index n) {
  Real acc[kLanes] = {};
  Index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j] * y[i + j];
  for (int j = 0; i + j < n; ++j) acc[j] += x[i + j] * y[i + j];
  return combine_lanes(acc);
}

// sum_i (x[i] - m)^2
template <class Real>
KOKKOS_INLINE_FUNCTION Real sum_sq_dev(const Real* x, Real m, Index n) {
  Real acc[kLanes] = {};
  Index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += (x[i + j] - m) * (x[i + j] - m);
  for (int j = 0; i + j < n; ++j) acc[j] += (x[i + j] - m) * (x[i + j] - m);
  return combine_lanes(acc);
}

// max_i x[i] (lowest() for n = 0). Exact in any order.
template <class Real>
KOKKOS_INLINE_FUNCTION Real max(const Real* x, Index n) {
  Real acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = std::numeric_limits<Real>::lowest();
  Index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  for (int j = 0; i + j < n; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  for (int j = 1; j < kLanes; ++j) acc[0] = acc[j] > acc[0] ? acc[j] : acc[0];
  return acc[0];
}

// exp for the kernels. Double: the library's. Float: Cephes' expf (range reduction by ln 2 in
// two parts, degree-6 polynomial, 2^n through the exponent bits), within 1 ulp of the
// correctly rounded value over [-87, 88] (tested); exp(x) = 0 below -87.3 (no subnormal
// results) and +inf above 88.37.
KOKKOS_INLINE_FUNCTION double vexp(double x) { return exp(x); }

namespace expf_consts {
constexpr float kHi = 88.3762626647949f, kLo = -87.3365447504f;
constexpr float kLog2e = 1.44269504088896341f, kC1 = 0.693359375f, kC2 = -2.12194440e-4f;
constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: (x + kShift) - kShift rounds x to an integer
// Polynomial coefficients (scalars, not an array: usable in device code without flags).
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
}  // namespace expf_consts

KOKKOS_INLINE_FUNCTION float vexp(float x) {
  using namespace expf_consts;
  float xc = x < kLo ? kLo : x;
  xc = xc > kHi ? kHi : xc;
  const float n = (xc * kLog2e + kShift) - kShift;  // round(x / ln 2), -126 <= n <= 127
  const float r = (xc - n * kC1) - n * kC2;          // x - n ln 2, |r| <= ln(2) / 2
  float y = kP0;
  y = y * r + kP1;
  y = y * r + kP2;
  y = y * r + kP3;
  y = y * r + kP4;
  y = y * r + kP5;
  y = y * r * r + r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float e = y * scale;
  return x < kLo ? 0.0f : (x > kHi ? std::numeric_limits<float>::infinity() : e);
}

// GELU (tanh form, computed as x sigmoid(2u), see gelu_forward) and its derivative.
template <class Real>
KOKKOS_INLINE_FUNCTION Real gelu_value(Real x) {
  constexpr Real kS = Real(0.7978845608028654), kCubic = Real(0.044715);  // sqrt(2/pi)
  const Real u = kS * (x + kCubic * x * x * x);
  return x / (Real(1) + vexp(Real(-2) * u));  // 0.5 x (1 + tanh u) = x sigmoid(2u)
}
template <class Real>
KOKKOS_INLINE_FUNCTION Real gelu_grad(Real x) {
  constexpr Real kS = Real(0.7978845608028654), kCubic = Real(0.044715);
  const Real u = kS * (x + kCubic * x * x * x);
  const Real s = Real(1) / (Real(1) + vexp(Real(-2) * u));  // sigmoid(2u); 0 when exp = inf
  const Real du_dx = kS * (Real(1) + Real(3) * kCubic * x * x);
  return s + Real(2) * x * s * (Real(1) - s) * du_dx;
}

// Span helpers for the exp-heavy loops. GCC does not vectorize a loop over the scalar vexp
// (under the default -ftrapping-math it will not if-convert its range selects), so the float
// versions below are explicit SIMD where the compiler allows it.
// out[i] = exp(in[i] - shift)
template <class Real>
KOKKOS_INLINE_FUNCTION void exp_shifted(Real* out, const Real* in, Real shift, Index n) {
  for (Index i = 0; i < n; ++i) out[i] = vexp(in[i] - shift);
}
// out[i] = gelu(in[i])
template <class Real>
KOKKOS_INLINE_FUNCTION void gelu_span(Real* out, const Real* in, Index n) {
  for (Index i = 0; i < n; ++i) out[i] = gelu_value(in[i]);
}
// dinp[i] += gelu'(inp[i]) * dout[i] (overwrite: dinp[i] = 0 + ..., dinp not read)
template <class Real>
KOKKOS_INLINE_FUNCTION void gelu_grad_span(Real* dinp, const Real* inp, const Real* dout,
                                           Index n, bool overwrite) {
  for (Index i = 0; i < n; ++i)
    dinp[i] = (overwrite ? Real(0) : dinp[i]) + gelu_grad(inp[i]) * dout[i];
}

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && \
    !defined(__HIP_DEVICE_COMPILE__) && !defined(__SYCL_DEVICE_ONLY__)
#define PDTRAIN_KERNELS_VECTOR_SPANS 1
// The float spans on the host (src/kernels/vector_spans.cpp): GCC/Clang vector extensions,
// 8 lanes (AVX2) where the CPU has them, else 4 (SSE2 on x86-64). Every lane performs the
// scalar function's operations in the same order (no FMA contraction), and the tails use the
// scalar functions, so each element gets exactly the scalar functions' bits, on any CPU.
void exp_shifted(float* out, const float* in, float shift, Index n);
void gelu_span(float* out, const float* in, Index n);
void gelu_grad_span(float* dinp, const float* inp, const float* dout, Index n, bool overwrite);
// The lane count the float spans use now (8 or 4). For tests: set_vector_lanes(4) forces the
// 4-lane code, 8 the 8-lane code where the CPU supports it, 0 the automatic choice; it returns
// the lane count in use afterwards.
int vector_lanes();
int set_vector_lanes(int lanes);
#endif

// sum_i exp(x[i] - shift) without storing the exponentials: the same bits as exp_shifted into
// an array and sum() over it (pieces of kExpChunk, a multiple of kLanes, through a stack buffer).
constexpr Index kExpChunk = 256;
static_assert(kExpChunk % kLanes == 0, "pieces must keep sum()'s lanes");
template <class Real>
KOKKOS_INLINE_FUNCTION Real sum_exp_shifted(const Real* x, Real shift, Index n) {
  Real acc[kLanes] = {};
  Real e[kExpChunk];
  for (Index begin = 0; begin < n; begin += kExpChunk) {
    const Index len = n - begin < kExpChunk ? n - begin : kExpChunk;
    exp_shifted(e, x + begin, shift, len);
    add_to_lanes(acc, e, len);
  }
  return combine_lanes(acc);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Fill

template <class Exec, class Real>
void fill_value(const Exec& exec, Real* ptr, Index n, NotDeduced<Real> value) {
  detail::for_each_chunk(
      "pdtrain::fill_value", exec, n, KOKKOS_LAMBDA(const Index begin, const Index end) {
        for (Index i = begin; i < end; ++i) ptr[i] = value;
      });
}


// ---------------------------------------------------------------------------------------------
// Encoder: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]

// Vocabulary-parallel: this rank holds wte rows [vocab_begin, vocab_end) (all rows with the
// defaults); tokens outside that range contribute 0, so summing the outputs of all vocabulary
// shards gives the full lookup. wpe may be null (only one shard adds the positions).
// out[B,T,C]; tokens[B,T]; wte[vocab_end - vocab_begin, C]; wpe[maxT,C] with maxT >= T.
// Parallel over tokens (b,t).
template <class Exec, class Real>
void encoder_forward(const Exec& exec, Real* out, const std::int32_t* tokens, const Real* wte,
                     const Real* wpe, int B, int T, int C, int vocab_begin = 0,
                     int vocab_end = std::numeric_limits<int>::max()) {
  detail::for_each(
      "pdtrain::encoder_forward", exec, Index(B) * T, KOKKOS_LAMBDA(const Index bt) {
        const Index t = bt % T;
        const int tok = tokens[bt];
        const bool here = tok >= vocab_begin && tok < vocab_end;
        const Real* e = wte + Index(here ? tok - vocab_begin : 0) * C;
        const Real* p = wpe != nullptr ? wpe + t * C : nullptr;
        Real* y = out + bt * C;
        if (here && p != nullptr) {
          for (int c = 0; c < C; ++c) y[c] = e[c] + p[c];
        } else if (here) {
          for (int c = 0; c < C; ++c) y[c] = e[c];
        } else if (p != nullptr) {
          for (int c = 0; c < C; ++c) y[c] = Real(0) + p[c];
        } else {
          for (int c = 0; c < C; ++c) y[c] = Real(0);
        }
      });
}

// dwte[vocab rows,C] += scatter of dout by token (tokens of this shard only; may be null);
// dwpe[maxT,C] += dout summed over the batch (may be null).
// Repeated tokens write the same dwte row, so dwte is parallel over channel panels only and
// walks (b,t) in order; dwpe is parallel over (t, channel panel) and walks b in order.
template <class Exec, class Real>
void encoder_backward(const Exec& exec, Real* dwte, Real* dwpe, const Real* dout,
                      const std::int32_t* tokens, int B, int T, int C, int vocab_begin = 0,
                      int vocab_end = std::numeric_limits<int>::max()) {
  const Index N = Index(B) * T;
  constexpr int P = detail::kPanel;
  const Index panels = (C + P - 1) / P;
  if (dwte != nullptr)
    detail::for_each(
        "pdtrain::encoder_backward_wte", exec, panels, KOKKOS_LAMBDA(const Index k) {
          const Index c0 = k * P, w = c0 + P < C ? P : C - c0;
          for (Index bt = 0; bt < N; ++bt) {
            const int tok = tokens[bt];
            if (tok < vocab_begin || tok >= vocab_end) continue;
            Real* d = dwte + Index(tok - vocab_begin) * C + c0;
            const Real* g = dout + bt * C + c0;
            for (Index j = 0; j < w; ++j) d[j] += g[j];
          }
        });
  if (dwpe != nullptr)
    detail::for_each(
        "pdtrain::encoder_backward_wpe", exec, Index(T) * panels, KOKKOS_LAMBDA(const Index tk) {
          const Index t = tk / panels, c0 = (tk % panels) * P, w = c0 + P < C ? P : C - c0;
          Real acc[P] = {};
          for (Index b = 0; b < B; ++b) {
            const Real* g = dout + (b * T + t) * C + c0;
            for (Index j = 0; j < w; ++j) acc[j] += g[j];
          }
          Real* d = dwpe + t * C + c0;
          for (Index j = 0; j < w; ++j) d[j] += acc[j];
        });
}

// ---------------------------------------------------------------------------------------------
// LayerNorm over the last dimension, eps = 1e-5.

// out[N,C], mean[N], rstd[N] (saved for backward), inp[N,C], weight[C], bias[C].
// Parallel over rows; a row is read in cache three times (mean, two-pass variance, output).
// Out = Real, or bf16 for the input of a bf16 matmul (statistics stay in Real).
template <class Exec, class Real, class Out>
void layernorm_forward(const Exec& exec, Out* out, Real* mean, Real* rstd, const Real* inp,
                       const Real* weight, const Real* bias, int N, int C) {
  detail::for_each(
      "pdtrain::layernorm_forward", exec, N, KOKKOS_LAMBDA(const Index n) {
        const Real* x = inp + n * C;
        const Real m = detail::sum(x, C) / C;
        // two-pass variance: no cancellation when |mean| >> std
        const Real var = detail::sum_sq_dev(x, m, C) / C;
        const Real s = Real(1) / detail::sqrt(var + Real(1e-5));
        Out* y = out + n * C;
        for (int i = 0; i < C; ++i) y[i] = to_out<Out>((x[i] - m) * s * weight[i] + bias[i]);
        mean[n] = m;
        rstd[n] = s;
      });
}

// dinp[N,C] += ... (or = with GradWrite::overwrite), dweight[C] += ..., dbias[C] += ...
// dinp is parallel over rows; dweight/dbias are parallel over channel panels, sequential over
// rows.
template <class Exec, class Real>
void layernorm_backward(const Exec& exec, Real* dinp, Real* dweight, Real* dbias, const Real* dout,
                        const Real* inp, const Real* weight, const Real* mean, const Real* rstd,
                        int N, int C, GradWrite dinp_write = GradWrite::accumulate) {
  const bool overwrite = dinp_write == GradWrite::overwrite;
  detail::for_each(
      "pdtrain::layernorm_backward_inp", exec, N, KOKKOS_LAMBDA(const Index n) {
        const Real* x = inp + n * C;
        const Real* dy = dout + n * C;
        const Real m = mean[n], s = rstd[n];
        constexpr int L = detail::kLanes;
        Real a1[L] = {}, a2[L] = {};  // sums of dnorm and dnorm * norm in lanes
        Index i = 0;
        for (; i + L <= C; i += L)
          for (int j = 0; j < L; ++j) {
            const Real dnorm = weight[i + j] * dy[i + j];
            a1[j] += dnorm;
            a2[j] += dnorm * (x[i + j] - m) * s;
          }
        for (int j = 0; i + j < C; ++j) {
          const Real dnorm = weight[i + j] * dy[i + j];
          a1[j] += dnorm;
          a2[j] += dnorm * (x[i + j] - m) * s;
        }
        const Real dnorm_mean = detail::combine_lanes(a1) / C;
        const Real dnorm_norm_mean = detail::combine_lanes(a2) / C;
        Real* dx = dinp + n * C;
        for (int i = 0; i < C; ++i) {
          const Real norm = (x[i] - m) * s;
          dx[i] = (overwrite ? Real(0) : dx[i]) +
                  (weight[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
      });
  constexpr int P = detail::kPanel;
  detail::for_each(
      "pdtrain::layernorm_backward_params", exec, (C + P - 1) / P, KOKKOS_LAMBDA(const Index k) {
        const Index c0 = k * P, w = c0 + P < C ? P : C - c0;
        Real dw[P] = {}, db[P] = {};
        for (Index n = 0; n < N; ++n) {
          const Real* dy = dout + n * C + c0;
          const Real* x = inp + n * C + c0;
          const Real m = mean[n], s = rstd[n];
          for (Index j = 0; j < w; ++j) {
            dw[j] += (x[j] - m) * s * dy[j];
            db[j] += dy[j];
          }
        }
        for (Index j = 0; j < w; ++j) {
          dweight[c0 + j] += dw[j];
          dbias[c0 + j] += db[j];
        }
      });
}

// ---------------------------------------------------------------------------------------------
// Matmul: out[N,OC] = inp[N,C] * weight[OC,C]^T + bias[OC], through gemm() (BLAS). out's (and
// in backward dout's) rows are ld apart; ld = 0 means OC (dense rows). A wider ld (the
// classifier's padded logits rows) leaves the columns OC..ld-1 of out untouched and unread.

// out[n,:] = bias, the seed a product with bias adds onto (beta = 1): one pass over out.
template <class Exec, class Real>
void bias_fill(const Exec& exec, Real* out, const NotDeduced<Real>* bias, int N, int OC, int ld) {
  detail::for_each(
      "pdtrain::matmul_forward_bias", exec, N, KOKKOS_LAMBDA(const Index n) {
        Real* y = out + n * ld;
        for (int o = 0; o < OC; ++o) y[o] = bias[o];
      });
}

// bias may be null.
template <class Exec, class Real>
void matmul_forward(const Exec& exec, Real* out, const Real* inp, const Real* weight,
                    const NotDeduced<Real>* bias, int N, int C, int OC, int ld = 0) {
  if (ld == 0) ld = OC;
  if (bias != nullptr) bias_fill(exec, out, bias, N, OC, ld);
  exec.fence();  // BLAS runs on the host, outside exec's queue
  gemm(false, true, N, OC, C, Real(1), inp, C, weight, C, bias != nullptr ? Real(1) : Real(0), out,
       ld);
}

// dbias[OC] += column sums of dout[N,OC] (rows ld apart), parallel over column panels,
// sequential over rows.
template <class Exec, class Real>
void column_sums_add(const Exec& exec, Real* dbias, const Real* dout, int N, int OC, int ld = 0) {
  if (ld == 0) ld = OC;
  constexpr int P = detail::kPanel;
  detail::for_each(
      "pdtrain::matmul_backward_bias", exec, (OC + P - 1) / P, KOKKOS_LAMBDA(const Index k) {
        const Index o0 = k * P, w = o0 + P < OC ? P : OC - o0;
        Real acc[P] = {};
        for (Index n = 0; n < N; ++n) {
          const Real* g = dout + n * ld + o0;
          for (Index j = 0; j < w; ++j) acc[j] += g[j];
        }
        for (Index j = 0; j < w; ++j) dbias[o0 + j] += acc[j];
      });
}

// dinp[N,C] += dout * weight   (may be null: the first layer needs no input gradient; with
//                               GradWrite::overwrite: =, beta = 0)
// dweight[OC,C] += dout^T * inp
// dbias[OC] += column sums of dout (may be null), parallel over OC, sequential over rows.
template <class Exec, class Real>
void matmul_backward(const Exec& exec, NotDeduced<Real>* dinp, Real* dweight,
                     NotDeduced<Real>* dbias, const Real* dout, const Real* inp, const Real* weight,
                     int N, int C, int OC, GradWrite dinp_write = GradWrite::accumulate,
                     int ld = 0) {
  if (ld == 0) ld = OC;
  exec.fence();  // dout may still be being written on exec; BLAS reads it on the host
  const Real beta = dinp_write == GradWrite::overwrite ? Real(0) : Real(1);
  if (dinp != nullptr) gemm(false, false, N, C, OC, Real(1), dout, ld, weight, C, beta, dinp, C);
  gemm(true, false, OC, C, N, Real(1), dout, ld, inp, C, Real(1), dweight, C);
  if (dbias != nullptr) column_sums_add(exec, dbias, dout, N, OC, ld);
}

// Mixed precision (train.precision = "bf16"): the same products with bf16 inputs and weights,
// fp32 accumulation and fp32 outputs/gradients. dout is rounded to bf16 once (into
// dout_bf16, N*ld, the same row stride) for both backward products; bias gradients use the fp32
// dout. dout's padding columns OC..ld-1 are rounded too: they must be finite (the classifier's
// backward writes them 0).
template <class Exec>
void matmul_forward(const Exec& exec, float* out, const bf16* inp, const bf16* weight,
                    const float* bias, int N, int C, int OC, int ld = 0) {
  if (ld == 0) ld = OC;
  if (bias != nullptr) bias_fill(exec, out, bias, N, OC, ld);
  exec.fence();
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, bias != nullptr ? 1.0f : 0.0f, out, ld);
}

template <class Exec>
void matmul_backward(const Exec& exec, float* dinp, float* dweight, float* dbias,
                     const float* dout, bf16* dout_bf16, const bf16* inp, const bf16* weight,
                     int N, int C, int OC, GradWrite dinp_write = GradWrite::accumulate,
                     int ld = 0) {
  if (ld == 0) ld = OC;
  exec.fence();
  to_bf16(dout, dout_bf16, static_cast<std::int64_t>(N) * ld);
  const float beta = dinp_write == GradWrite::overwrite ? 0.0f : 1.0f;
  if (dinp != nullptr) gemm(false, false, N, C, OC, 1.0f, dout_bf16, ld, weight, C, beta, dinp, C);
  gemm(true, false, OC, C, N, 1.0f, dout_bf16, ld, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) column_sums_add(exec, dbias, dout, N, OC, ld);
}

// out[N,OC] += bias[OC]: the bias of a row-parallel layer, added once after the tensor-parallel
// sum of partial products. Its backward is matmul_backward's dbias (column sums of dout).
template <class Exec, class Real>
void bias_add_forward(const Exec& exec, Real* out, const Real* bias, int N, int OC) {
  detail::for_each(
      "pdtrain::bias_add_forward", exec, N, KOKKOS_LAMBDA(const Index n) {
        Real* y = out + n * OC;
        for (int o = 0; o < OC; ++o) y[o] += bias[o];
      });
}

// ---------------------------------------------------------------------------------------------
// Causal multi-head self-attention: per (b,h) the score and value products are GEMMs on
// strided views of qkv (row stride 3C), the causal softmax between them a row kernel.
// qkv[B,T,3C]: per token [q of all heads | k of all heads | v of all heads], head h at h*HS.
// The GEMMs run over the full T x T square; the masked (upper) scores are never read and the
// masked probabilities are 0, so they contribute exact zeros.

// out[B,T,C]; preatt/att[B,NH,T,T] (saved for backward; masked entries t2 > t set to 0).
template <class Exec, class Real>
void attention_forward(const Exec& exec, Real* out, Real* preatt, Real* att, const Real* qkv, int B,
                       int T, int C, int NH) {
  const int HS = C / NH, C3 = 3 * C;
  const Index TT = Index(T) * T, BH = Index(B) * NH;
  const Real scale = Real(1) / detail::sqrt(Real(HS));
  exec.fence();  // qkv may still be being written on exec; BLAS reads it on the host
  for (Index bh = 0; bh < BH; ++bh) {  // preatt = scale * q k^T
    const Real* q = qkv + (bh / NH) * T * C3 + (bh % NH) * HS;
    gemm(false, true, T, T, HS, scale, q, C3, q + C, C3, Real(0), preatt + bh * TT, T);
  }
  // Causal softmax, parallel over rows (b,h,t).
  detail::for_each(
      "pdtrain::attention_softmax", exec, BH * T, KOKKOS_LAMBDA(const Index row) {
        const Index n = row % T + 1;  // keys 0..t
        Real* pre = preatt + row * T;
        Real* a = att + row * T;
        const Real maxval = detail::max(pre, n);
        detail::exp_shifted(a, pre, maxval, n);
        const Real inv = Real(1) / detail::sum(a, n);  // sum >= 1: the max term is exp(0)
        for (Index t2 = 0; t2 < n; ++t2) a[t2] *= inv;
        for (Index t2 = n; t2 < T; ++t2) a[t2] = pre[t2] = Real(0);
      });
  exec.fence();
  for (Index bh = 0; bh < BH; ++bh) {  // out = att v
    const Index b = bh / NH, h = bh % NH;
    const Real* v = qkv + b * T * C3 + 2 * C + h * HS;
    gemm(false, false, T, HS, T, Real(1), att + bh * TT, T, v, C3, Real(0), out + b * T * C + h * HS,
         C);
  }
}

// dqkv[B,T,3C] += ...; dpreatt/datt[B,NH,T,T] are caller scratch, overwritten (need no zeroing):
// datt = d(att), dpreatt = scale * d(preatt), both 0 at masked entries.
template <class Exec, class Real>
void attention_backward(const Exec& exec, Real* dqkv, Real* dpreatt, Real* datt, const Real* dout,
                        const Real* qkv, const Real* att, int B, int T, int C, int NH) {
  const int HS = C / NH, C3 = 3 * C;
  const Index TT = Index(T) * T, BH = Index(B) * NH;
  const Real scale = Real(1) / detail::sqrt(Real(HS));
  exec.fence();  // dout may still be being written on exec
  for (Index bh = 0; bh < BH; ++bh) {
    const Index b = bh / NH, h = bh % NH;
    const Index head = b * T * C3 + h * HS;
    const Real* dy = dout + b * T * C + h * HS;
    // out = att v:  datt = dy v^T,  dv += att^T dy
    gemm(false, true, T, T, HS, Real(1), dy, C, qkv + head + 2 * C, C3, Real(0), datt + bh * TT,
         T);
    gemm(true, false, T, HS, T, Real(1), att + bh * TT, T, dy, C, Real(1), dqkv + head + 2 * C, C3);
  }
  // softmax: dpre[t2] = a[t2] * (da[t2] - sum_t3 a[t3] da[t3]), times the score scale.
  detail::for_each(
      "pdtrain::attention_softmax_backward", exec, BH * T, KOKKOS_LAMBDA(const Index row) {
        const Index n = row % T + 1;
        const Real* a = att + row * T;
        Real* da = datt + row * T;
        Real* dpre = dpreatt + row * T;
        const Real weighted = detail::dot(a, da, n);
        for (Index t2 = 0; t2 < n; ++t2) dpre[t2] = scale * (a[t2] * (da[t2] - weighted));
        for (Index t2 = n; t2 < T; ++t2) dpre[t2] = da[t2] = Real(0);
      });
  exec.fence();
  for (Index bh = 0; bh < BH; ++bh) {
    const Index head = (bh / NH) * T * C3 + (bh % NH) * HS;
    // preatt = scale q k^T:  dq += dpre k,  dk += dpre^T q  (dpre already holds the scale)
    gemm(false, false, T, HS, T, Real(1), dpreatt + bh * TT, T, qkv + head + C, C3, Real(1),
         dqkv + head, C3);
    gemm(true, false, T, HS, T, Real(1), dpreatt + bh * TT, T, qkv + head, C3, Real(1),
         dqkv + head + C, C3);
  }
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed
// as x * sigmoid(2u) = x / (1 + exp(-2u)) (the same function: 0.5 (1 + tanh u) = sigmoid(2u)),
// one vectorizable exp instead of a scalar tanh.

template <class Exec, class Real>
void gelu_forward(const Exec& exec, Real* out, const Real* inp, Index n) {
  detail::for_each_chunk(
      "pdtrain::gelu_forward", exec, n, KOKKOS_LAMBDA(const Index begin, const Index end) {
        detail::gelu_span(out + begin, inp + begin, end - begin);
      });
}

// GELU written as bf16 (the input of the bf16 MLP projection): computed in float over
// cache-sized pieces and rounded there, so the output is one bf16 pass, with exactly the bits
// of rounding gelu_forward's float result.
template <class Exec>
void gelu_forward(const Exec& exec, bf16* out, const float* inp, Index n) {
  detail::for_each_chunk(
      "pdtrain::gelu_forward_bf16", exec, n, KOKKOS_LAMBDA(const Index begin, const Index end) {
        constexpr Index piece = 512;
        float tmp[piece];
        for (Index i = begin; i < end; i += piece) {
          const Index len = end - i < piece ? end - i : piece;
          detail::gelu_span(tmp, inp + i, len);
          for (Index j = 0; j < len; ++j) out[i + j] = to_bf16(tmp[j]);
        }
      });
}

// dinp += gelu'(inp) * dout (or = with GradWrite::overwrite), gelu'(x) = s + 2 x s (1 - s)
// du/dx with s = sigmoid(2u) (= 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx).
template <class Exec, class Real>
void gelu_backward(const Exec& exec, Real* dinp, const Real* inp, const Real* dout, Index n,
                   GradWrite write = GradWrite::accumulate) {
  const bool overwrite = write == GradWrite::overwrite;
  detail::for_each_chunk(
      "pdtrain::gelu_backward", exec, n, KOKKOS_LAMBDA(const Index begin, const Index end) {
        detail::gelu_grad_span(dinp + begin, inp + begin, dout + begin, end - begin, overwrite);
      });
}

// ---------------------------------------------------------------------------------------------
// Residual: out = a + b. Its backward adds dout into both branches' gradients unchanged.

template <class Exec, class Real>
void residual_forward(const Exec& exec, Real* out, const Real* a, const Real* b, Index n) {
  detail::for_each_chunk(
      "pdtrain::residual_forward", exec, n, KOKKOS_LAMBDA(const Index begin, const Index end) {
        for (Index i = begin; i < end; ++i) out[i] = a[i] + b[i];
      });
}


// ---------------------------------------------------------------------------------------------
// Softmax + cross-entropy, vocabulary-parallel, with no probability array. A rank holds the
// logits of V vocabulary columns starting at vocab_begin (V may be 0 on a shard that holds only
// padding rows), rows ld apart (kernel_ops.hpp's logits_row_stride: V, or on a GPU V padded to
// a multiple of 64 so a row starts aligned for tensor-core GEMMs; columns V..ld-1 are not
// logits). Forward: two passes over
// the logits, between them the caller combines per-row statistics over the vocabulary shards
// (max after the first, sums after the second), so no rank ever materializes full-vocabulary
// logits (with one shard the combines are no-ops); then the losses from the statistics alone.
// Backward: one pass recomputes the softmax and writes dlogits in place of the logits. The loss
// is log-sum-exp minus the target logit, so a tiny target probability never becomes log(0).
// Every phase is parallel over rows.

// Forward 1: rowmax[n] = max_v logits[n,v] (lowest float on an empty shard).
template <class Exec, class Real>
void crossentropy_rowmax(const Exec& exec, Real* rowmax, const Real* logits, int N, int V,
                         int ld) {
  detail::for_each(
      "pdtrain::crossentropy_rowmax", exec, N,
      KOKKOS_LAMBDA(const Index n) { rowmax[n] = detail::max(logits + n * ld, V); });
}

// Forward 2 (rowmax is the global max): stats[n] = this shard's sum of exp(logits - rowmax);
// stats[N + n] = the target's logit minus rowmax if this shard holds the target column, else 0.
template <class Exec, class Real>
void crossentropy_partials(const Exec& exec, Real* stats, const Real* logits, const Real* rowmax,
                           const std::int32_t* targets, int vocab_begin, int N, int V, int ld) {
  detail::for_each(
      "pdtrain::crossentropy_partials", exec, N, KOKKOS_LAMBDA(const Index n) {
        const Real* z = logits + n * ld;
        const Real m = rowmax[n];
        const int t = targets[n] - vocab_begin;
        stats[n] = detail::sum_exp_shifted(z, m, Index(V));
        stats[N + n] = t >= 0 && t < V ? z[t] - m : Real(0);
      });
}

// Forward 3 (stats summed over shards): losses[n] = log(sum) - (target logit - max).
template <class Exec, class Real>
void crossentropy_losses(const Exec& exec, Real* losses, const Real* stats, int N) {
  detail::for_each(
      "pdtrain::crossentropy_losses", exec, N,
      KOKKOS_LAMBDA(const Index n) { losses[n] = detail::log(stats[n]) - stats[N + n]; });
}

// Backward, in place: logits[n,v] becomes dlogits = (softmax - onehot(target)) * dlosses[n],
// softmax = exp(logit - rowmax) / sum from the forward's (combined) rowmax and stats; the target
// column counts only on the shard that holds it; columns V..ld-1 become 0.
template <class Exec, class Real>
void crossentropy_backward(const Exec& exec, Real* logits, const Real* rowmax, const Real* stats,
                           const std::int32_t* targets, const Real* dlosses, int vocab_begin,
                           int N, int V, int ld) {
  detail::for_each(
      "pdtrain::crossentropy_backward", exec, N, KOKKOS_LAMBDA(const Index n) {
        Real* z = logits + n * ld;
        const Real inv = Real(1) / stats[n], dl = dlosses[n];
        const int t = targets[n] - vocab_begin;
        detail::exp_shifted(z, z, rowmax[n], Index(V));
        for (int v = 0; v < V; ++v) {
          const Real p = z[v] * inv;
          z[v] = (v == t ? p - Real(1) : p) * dl;
        }
        for (int v = V; v < ld; ++v) z[v] = Real(0);
      });
}

}  // namespace pdtrain::kernels
