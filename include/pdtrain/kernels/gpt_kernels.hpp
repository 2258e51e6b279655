#pragma once
// GPT-2 layer kernels after llm.c, each forward next to its backward.
//
// Conventions (shared by every kernel below):
//  * Row-major raw pointers, shapes as in llm.c: B batch, T sequence, C channels, NH heads,
//    HS = C / NH, N = B * T rows. Under tensor parallelism C and NH are the LOCAL width and
//    head count of this rank.
//  * `exec` is a Kokkos execution space instance; pointers must be accessible from it.
//    Kernels are enqueued on `exec` and may run asynchronously: fence `exec` before reading
//    results on the host. (matmul_* fence themselves before calling BLAS.)
//  * Every kernel is race-free and deterministic under a threaded backend: it parallelizes
//    over independent outputs only and loops sequentially, in a fixed order, over reduced
//    dimensions. No float atomics, no parallel reductions.
//  * Every backward ACCUMULATES (+=) into its gradient outputs, like llm.c, so the caller
//    zeroes gradients once per step. Scratch buffers (attention's dpreatt/datt) are overwritten.
//  * Pointers documented as "may be null" are skipped when null; all others are required.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "pdtrain/kernels/gemm.hpp"

namespace pdtrain::kernels {

using Index = std::int64_t;  // element offsets: B*NH*T*T and N*V can exceed int

// A parameter whose type follows Real instead of deducing it, so nullptr can be passed.
template <class Real>
using NotDeduced = std::type_identity_t<Real>;

namespace detail {

#if KOKKOS_VERSION >= 40000
using Kokkos::exp;
using Kokkos::log;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

template <class Exec>
using Range = Kokkos::RangePolicy<Exec, Kokkos::IndexType<Index>>;

// Runs body(i) for i in [0, n) on exec; each i must write only outputs no other i touches.
template <class Exec, class Body>
void for_each(const char* label, const Exec& exec, Index n, const Body& body) {
  Kokkos::parallel_for(label, Range<Exec>(exec, 0, n), body);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Fill

template <class Exec, class Real>
void fill_value(const Exec& exec, Real* ptr, Index n, NotDeduced<Real> value) {
  detail::for_each(
      "pdtrain::fill_value", exec, n, KOKKOS_LAMBDA(const Index i) { ptr[i] = value; });
}

template <class Exec, class Real>
void fill_zero(const Exec& exec, Real* ptr, Index n) {
  fill_value(exec, ptr, n, Real(0));
}

// ---------------------------------------------------------------------------------------------
// Encoder: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]

// Vocabulary-parallel: this rank holds wte rows [vocab_begin, vocab_end) (all rows with the
// defaults); tokens outside that range contribute 0, so summing the outputs of all vocabulary
// shards gives the full lookup. wpe may be null (only one shard adds the positions).
// out[B,T,C]; tokens[B,T]; wte[vocab_end - vocab_begin, C]; wpe[maxT,C] with maxT >= T.
template <class Exec, class Real>
void encoder_forward(const Exec& exec, Real* out, const std::int32_t* tokens, const Real* wte,
                     const Real* wpe, int B, int T, int C, int vocab_begin = 0,
                     int vocab_end = std::numeric_limits<int>::max()) {
  detail::for_each(
      "pdtrain::encoder_forward", exec, Index(B) * T * C, KOKKOS_LAMBDA(const Index i) {
        const Index bt = i / C, c = i % C, t = bt % T;
        const int tok = tokens[bt];
        const Real e = tok >= vocab_begin && tok < vocab_end
                           ? wte[Index(tok - vocab_begin) * C + c] : Real(0);
        out[i] = wpe != nullptr ? e + wpe[t * C + c] : e;
      });
}

// dwte[vocab rows,C] += scatter of dout by token (tokens of this shard only; may be null);
// dwpe[maxT,C] += dout summed over the batch (may be null).
// Repeated tokens write the same dwte row, so dwte is parallel over channels only and walks
// (b,t) in order; dwpe is parallel over (t,c) and walks b in order.
template <class Exec, class Real>
void encoder_backward(const Exec& exec, Real* dwte, Real* dwpe, const Real* dout,
                      const std::int32_t* tokens, int B, int T, int C, int vocab_begin = 0,
                      int vocab_end = std::numeric_limits<int>::max()) {
  const Index N = Index(B) * T;
  if (dwte != nullptr)
    detail::for_each(
        "pdtrain::encoder_backward_wte", exec, C, KOKKOS_LAMBDA(const Index c) {
          for (Index bt = 0; bt < N; ++bt) {
            const int tok = tokens[bt];
            if (tok >= vocab_begin && tok < vocab_end)
              dwte[Index(tok - vocab_begin) * C + c] += dout[bt * C + c];
          }
        });
  if (dwpe != nullptr)
    detail::for_each(
        "pdtrain::encoder_backward_wpe", exec, Index(T) * C, KOKKOS_LAMBDA(const Index tc) {
          Real sum = 0;
          for (Index b = 0; b < B; ++b) sum += dout[b * T * C + tc];
          dwpe[tc] += sum;
        });
}

// ---------------------------------------------------------------------------------------------
// LayerNorm over the last dimension, eps = 1e-5.

// out[N,C], mean[N], rstd[N] (saved for backward), inp[N,C], weight[C], bias[C].
template <class Exec, class Real>
void layernorm_forward(const Exec& exec, Real* out, Real* mean, Real* rstd, const Real* inp,
                       const Real* weight, const Real* bias, int N, int C) {
  detail::for_each(
      "pdtrain::layernorm_forward", exec, N, KOKKOS_LAMBDA(const Index n) {
        const Real* x = inp + n * C;
        Real m = 0;
        for (int i = 0; i < C; ++i) m += x[i];
        m /= C;
        Real var = 0;  // two-pass variance: no cancellation when |mean| >> std
        for (int i = 0; i < C; ++i) var += (x[i] - m) * (x[i] - m);
        var /= C;
        const Real s = Real(1) / detail::sqrt(var + Real(1e-5));
        Real* y = out + n * C;
        for (int i = 0; i < C; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
      });
}

// dinp[N,C] += ..., dweight[C] += ..., dbias[C] += ...
// dinp is parallel over rows; dweight/dbias are parallel over channels, sequential over rows.
template <class Exec, class Real>
void layernorm_backward(const Exec& exec, Real* dinp, Real* dweight, Real* dbias, const Real* dout,
                        const Real* inp, const Real* weight, const Real* mean, const Real* rstd,
                        int N, int C) {
  detail::for_each(
      "pdtrain::layernorm_backward_inp", exec, N, KOKKOS_LAMBDA(const Index n) {
        const Real* x = inp + n * C;
        const Real* dy = dout + n * C;
        const Real m = mean[n], s = rstd[n];
        Real dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int i = 0; i < C; ++i) {
          const Real dnorm = weight[i] * dy[i];
          dnorm_mean += dnorm;
          dnorm_norm_mean += dnorm * (x[i] - m) * s;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        Real* dx = dinp + n * C;
        for (int i = 0; i < C; ++i) {
          const Real norm = (x[i] - m) * s;
          dx[i] += (weight[i] * dy[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
      });
  detail::for_each(
      "pdtrain::layernorm_backward_params", exec, C, KOKKOS_LAMBDA(const Index i) {
        Real dw = 0, db = 0;
        for (Index n = 0; n < N; ++n) {
          const Real dy = dout[n * C + i];
          dw += (inp[n * C + i] - mean[n]) * rstd[n] * dy;
          db += dy;
        }
        dweight[i] += dw;
        dbias[i] += db;
      });
}

// ---------------------------------------------------------------------------------------------
// Matmul: out[N,OC] = inp[N,C] * weight[OC,C]^T + bias[OC], through gemm() (BLAS).

// bias may be null.
template <class Exec, class Real>
void matmul_forward(const Exec& exec, Real* out, const Real* inp, const Real* weight,
                    const NotDeduced<Real>* bias, int N, int C, int OC) {
  // Seed out with the bias and let the GEMM add onto it (beta = 1): one pass over out.
  if (bias != nullptr) {
    detail::for_each(
        "pdtrain::matmul_forward_bias", exec, Index(N) * OC,
        KOKKOS_LAMBDA(const Index i) { out[i] = bias[i % OC]; });
  }
  exec.fence();  // BLAS runs on the host, outside exec's queue
  gemm(false, true, N, OC, C, Real(1), inp, C, weight, C, bias != nullptr ? Real(1) : Real(0), out,
       OC);
}

// dinp[N,C] += dout * weight   (may be null: the first layer needs no input gradient)
// dweight[OC,C] += dout^T * inp
// dbias[OC] += column sums of dout (may be null), parallel over OC, sequential over rows.
template <class Exec, class Real>
void matmul_backward(const Exec& exec, NotDeduced<Real>* dinp, Real* dweight,
                     NotDeduced<Real>* dbias, const Real* dout, const Real* inp, const Real* weight,
                     int N, int C, int OC) {
  exec.fence();  // dout may still be being written on exec; BLAS reads it on the host
  if (dinp != nullptr) gemm(false, false, N, C, OC, Real(1), dout, OC, weight, C, Real(1), dinp, C);
  gemm(true, false, OC, C, N, Real(1), dout, OC, inp, C, Real(1), dweight, C);
  if (dbias != nullptr) {
    detail::for_each(
        "pdtrain::matmul_backward_bias", exec, OC, KOKKOS_LAMBDA(const Index o) {
          Real sum = 0;
          for (Index n = 0; n < N; ++n) sum += dout[n * OC + o];
          dbias[o] += sum;
        });
  }
}

// out[N,OC] += bias[OC]: the bias of a row-parallel layer, added once after the tensor-parallel
// sum of partial products. Its backward is matmul_backward's dbias (column sums of dout).
template <class Exec, class Real>
void bias_add_forward(const Exec& exec, Real* out, const Real* bias, int N, int OC) {
  detail::for_each(
      "pdtrain::bias_add_forward", exec, Index(N) * OC,
      KOKKOS_LAMBDA(const Index i) { out[i] += bias[i % OC]; });
}

// ---------------------------------------------------------------------------------------------
// Causal multi-head self-attention (naive llm.c loops; a later issue optimizes).
// qkv[B,T,3C]: per token [q of all heads | k of all heads | v of all heads], head h at h*HS.

// out[B,T,C]; preatt/att[B,NH,T,T] (saved for backward; masked entries t2 > t set to 0).
// Parallel over (b,t,h): each writes its own att row and out slice.
template <class Exec, class Real>
void attention_forward(const Exec& exec, Real* out, Real* preatt, Real* att, const Real* qkv, int B,
                       int T, int C, int NH) {
  const int HS = C / NH;
  const Index C3 = Index(3) * C;
  const Real scale = Real(1) / detail::sqrt(Real(HS));
  detail::for_each(
      "pdtrain::attention_forward", exec, Index(B) * T * NH, KOKKOS_LAMBDA(const Index bth) {
        const Index h = bth % NH, bt = bth / NH, t = bt % T, b = bt / T;
        const Real* q = qkv + bt * C3 + h * HS;
        const Real* tokens_b = qkv + b * T * C3;  // token 0 of this sequence
        Real* pre = preatt + ((b * NH + h) * T + t) * T;
        Real* a = att + ((b * NH + h) * T + t) * T;

        Real maxval = 0;
        for (Index t2 = 0; t2 <= t; ++t2) {
          const Real* k = tokens_b + t2 * C3 + C + h * HS;
          Real dot = 0;
          for (int i = 0; i < HS; ++i) dot += q[i] * k[i];
          pre[t2] = dot * scale;
          if (t2 == 0 || pre[t2] > maxval) maxval = pre[t2];
        }
        Real expsum = 0;
        for (Index t2 = 0; t2 <= t; ++t2) {
          a[t2] = detail::exp(pre[t2] - maxval);
          expsum += a[t2];
        }
        const Real inv = Real(1) / expsum;  // expsum >= 1: the max term is exp(0)
        for (Index t2 = 0; t2 < T; ++t2) {
          if (t2 <= t) {
            a[t2] *= inv;
          } else {
            a[t2] = 0;
            pre[t2] = 0;
          }
        }

        Real* y = out + bt * C + h * HS;
        for (int i = 0; i < HS; ++i) y[i] = 0;
        for (Index t2 = 0; t2 <= t; ++t2) {
          const Real* v = tokens_b + t2 * C3 + 2 * C + h * HS;
          for (int i = 0; i < HS; ++i) y[i] += a[t2] * v[i];
        }
      });
}

// dqkv[B,T,3C] += ...; dpreatt/datt[B,NH,T,T] are caller scratch, overwritten (need no zeroing).
// Parallel over (b,h), sequential over t: the k and v gradients of a token gather from every
// later query of the same head, so one (b,h) owns all of its dqkv slice.
template <class Exec, class Real>
void attention_backward(const Exec& exec, Real* dqkv, Real* dpreatt, Real* datt, const Real* dout,
                        const Real* qkv, const Real* att, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const Index C3 = Index(3) * C;
  const Real scale = Real(1) / detail::sqrt(Real(HS));
  detail::for_each(
      "pdtrain::attention_backward", exec, Index(B) * NH, KOKKOS_LAMBDA(const Index bh) {
        const Index b = bh / NH, h = bh % NH;
        const Real* tokens_b = qkv + b * T * C3;
        Real* dtokens_b = dqkv + b * T * C3;
        for (Index t = 0; t < T; ++t) {
          const Real* a = att + (bh * T + t) * T;
          Real* da = datt + (bh * T + t) * T;
          Real* dpre = dpreatt + (bh * T + t) * T;
          const Real* dy = dout + (b * T + t) * C + h * HS;

          // out = att . v
          for (Index t2 = 0; t2 <= t; ++t2) {
            const Real* v = tokens_b + t2 * C3 + 2 * C + h * HS;
            Real* dv = dtokens_b + t2 * C3 + 2 * C + h * HS;
            Real dot = 0;
            for (int i = 0; i < HS; ++i) {
              dot += v[i] * dy[i];
              dv[i] += a[t2] * dy[i];
            }
            da[t2] = dot;
          }
          // softmax: dpre[t3] = a[t3] * (da[t3] - sum_t2 a[t2] da[t2]), the O(T) form of llm.c's
          // double loop over a[t2] * (delta(t2,t3) - a[t3]) * da[t2]
          Real weighted = 0;
          for (Index t2 = 0; t2 <= t; ++t2) weighted += a[t2] * da[t2];
          for (Index t2 = 0; t2 < T; ++t2) {
            dpre[t2] = t2 <= t ? a[t2] * (da[t2] - weighted) : Real(0);
            if (t2 > t) da[t2] = 0;
          }
          // preatt = scale * q . k
          const Real* q = tokens_b + t * C3 + h * HS;
          Real* dq = dtokens_b + t * C3 + h * HS;
          for (Index t2 = 0; t2 <= t; ++t2) {
            const Real* k = tokens_b + t2 * C3 + C + h * HS;
            Real* dk = dtokens_b + t2 * C3 + C + h * HS;
            const Real g = dpre[t2] * scale;
            for (int i = 0; i < HS; ++i) {
              dq[i] += k[i] * g;
              dk[i] += q[i] * g;
            }
          }
        }
      });
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))

namespace detail {
constexpr double kGeluScaling = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
}  // namespace detail

template <class Exec, class Real>
void gelu_forward(const Exec& exec, Real* out, const Real* inp, Index n) {
  detail::for_each(
      "pdtrain::gelu_forward", exec, n, KOKKOS_LAMBDA(const Index i) {
        const Real x = inp[i];
        const Real u = Real(detail::kGeluScaling) * (x + Real(detail::kGeluCubic) * x * x * x);
        out[i] = Real(0.5) * x * (Real(1) + detail::tanh(u));
      });
}

// dinp += gelu'(inp) * dout
template <class Exec, class Real>
void gelu_backward(const Exec& exec, Real* dinp, const Real* inp, const Real* dout, Index n) {
  detail::for_each(
      "pdtrain::gelu_backward", exec, n, KOKKOS_LAMBDA(const Index i) {
        const Real x = inp[i];
        const Real u = Real(detail::kGeluScaling) * (x + Real(detail::kGeluCubic) * x * x * x);
        const Real th = detail::tanh(u);
        const Real sech2 = Real(1) - th * th;  // 1/cosh^2 without cosh overflowing
        const Real du_dx =
            Real(detail::kGeluScaling) * (Real(1) + Real(3 * detail::kGeluCubic) * x * x);
        const Real local_grad = Real(0.5) * (Real(1) + th) + Real(0.5) * x * sech2 * du_dx;
        dinp[i] += local_grad * dout[i];
      });
}

// ---------------------------------------------------------------------------------------------
// Residual: out = a + b. Its backward is add_inplace(da, dout) and add_inplace(db, dout).

template <class Exec, class Real>
void residual_forward(const Exec& exec, Real* out, const Real* a, const Real* b, Index n) {
  detail::for_each(
      "pdtrain::residual_forward", exec, n, KOKKOS_LAMBDA(const Index i) { out[i] = a[i] + b[i]; });
}

// dst += src
template <class Exec, class Real>
void add_inplace(const Exec& exec, Real* dst, const Real* src, Index n) {
  detail::for_each(
      "pdtrain::add_inplace", exec, n, KOKKOS_LAMBDA(const Index i) { dst[i] += src[i]; });
}

// ---------------------------------------------------------------------------------------------
// Softmax + cross-entropy, vocabulary-parallel. A rank holds the logits of V vocabulary
// columns starting at vocab_begin (V may be 0 on a shard that holds only padding rows). Three
// phases; between them the caller combines per-row statistics over the vocabulary shards (max
// after phase 1, sum after phase 2), so no rank ever materializes full-vocabulary logits. With
// one shard the combines are no-ops. The loss is log-sum-exp minus the target logit, so a tiny
// target probability never becomes log(0).

// Phase 1: rowmax[n] = max_v logits[n,v] (lowest float on an empty shard).
template <class Exec, class Real>
void crossentropy_rowmax(const Exec& exec, Real* rowmax, const Real* logits, int N, int V) {
  detail::for_each(
      "pdtrain::crossentropy_rowmax", exec, N, KOKKOS_LAMBDA(const Index n) {
        Real m = std::numeric_limits<Real>::lowest();
        for (int v = 0; v < V; ++v) m = logits[n * V + v] > m ? logits[n * V + v] : m;
        rowmax[n] = m;
      });
}

// Phase 2 (rowmax is the global max): probs[n,v] = exp(logits - rowmax) (unnormalized);
// stats[n] = this shard's sum of those; stats[N + n] = the target's logit minus rowmax if this
// shard holds the target column, else 0.
template <class Exec, class Real>
void crossentropy_partials(const Exec& exec, Real* stats, Real* probs, const Real* logits,
                           const Real* rowmax, const std::int32_t* targets, int vocab_begin, int N,
                           int V) {
  detail::for_each(
      "pdtrain::crossentropy_partials", exec, N, KOKKOS_LAMBDA(const Index n) {
        Real sum = 0;
        for (int v = 0; v < V; ++v) {
          probs[n * V + v] = detail::exp(logits[n * V + v] - rowmax[n]);
          sum += probs[n * V + v];
        }
        const int t = targets[n] - vocab_begin;
        stats[n] = sum;
        stats[N + n] = t >= 0 && t < V ? logits[n * V + t] - rowmax[n] : Real(0);
      });
}

// Phase 3 (stats summed over shards): losses[n] = log(sum) - (target logit - max);
// probs normalized in place.
template <class Exec, class Real>
void crossentropy_finish(const Exec& exec, Real* losses, Real* probs, const Real* stats, int N,
                         int V) {
  detail::for_each(
      "pdtrain::crossentropy_finish", exec, N, KOKKOS_LAMBDA(const Index n) {
        const Real inv = Real(1) / stats[n];
        for (int v = 0; v < V; ++v) probs[n * V + v] *= inv;
        losses[n] = detail::log(stats[n]) - stats[N + n];
      });
}

// All three phases on one shard holding every column: losses[N], probs[N,V], targets in [0, V).
template <class Exec, class Real>
void softmax_crossentropy_forward(const Exec& exec, Real* losses, Real* probs, const Real* logits,
                                  const std::int32_t* targets, int N, int V) {
  std::vector<Real> rowmax(static_cast<std::size_t>(N)), stats(2 * static_cast<std::size_t>(N));
  crossentropy_rowmax(exec, rowmax.data(), logits, N, V);
  crossentropy_partials(exec, stats.data(), probs, logits, rowmax.data(), targets, 0, N, V);
  crossentropy_finish(exec, losses, probs, stats.data(), N, V);
  exec.fence();  // the temporaries die here
}

// dlogits[N,V] += (probs - onehot(target)) * dlosses[n], with the target's column counted only
// on the shard that holds it.
template <class Exec, class Real>
void softmax_crossentropy_backward(const Exec& exec, Real* dlogits, const Real* probs,
                                   const std::int32_t* targets, const Real* dlosses, int N, int V,
                                   int vocab_begin = 0) {
  detail::for_each(
      "pdtrain::softmax_crossentropy_backward", exec, Index(N) * V, KOKKOS_LAMBDA(const Index i) {
        const Index n = i / V, v = i % V;
        const Real onehot = v == targets[n] - vocab_begin ? Real(1) : Real(0);
        dlogits[i] += (probs[i] - onehot) * dlosses[n];
      });
}

}  // namespace pdtrain::kernels
