// Fused causal attention (flash_attention.hpp): flash-attention tiling with the CPU's buffers
// (qkv[B,T,3C], out[B,T,C], dqkv += ...), after Dao et al.'s FlashAttention-2 schedule.
//
// Every kernel is a template on the element type E of its shared-memory tiles: __nv_bfloat16
// (tile products on tensor cores, WMMA, fp32 accumulation) or float (the same products on the
// CUDA cores in fp32), and on the head size padded to a multiple of 16 (kHS; the padding
// columns are zeros and add nothing). A warp owns 16 rows of a tile; its 16x16 products go
// through WarpTile<E> below, the only place the two element types differ.
//
//  forward      block: a tile of queries of one (b,h); loops over the key/value tiles up to its
//               last query (causal). Per warp: S = q k^T into shared memory, the online softmax
//               one row at a time (lane j takes key j of the 32-key tile), the output rows
//               rescaled and O += P v. Writes out = O / l and lse = m + log l.
//  D            one warp per row: D = rowsum(dout * out) (= rowsum(P * dP)).
//  dk, dv       block: a tile of keys; loops over the query tiles from the first that sees it.
//               Per warp: S^T = k q^T and dP^T = v dout^T, P^T = exp(scale S^T - lse),
//               dS^T = scale P^T (dP^T - D); dv += P^T dout and dk += dS^T q in registers;
//               added to dqkv once at the end.
//  dq           block: a tile of queries; loops over the key tiles up to its last query.
//               S, dP, P, dS as above, dq += dS k; added to dqkv at the end.
// Each output element is summed by one warp in the loop order: no atomics, the same bits every
// run. Masked probabilities are exact zeros, as in the CPU's softmax.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "flash_attention.hpp"

namespace pdtrain::kernels::cuda {
namespace {

using bf16_t = __nv_bfloat16;

constexpr int kTile = 16;  // WMMA's m = n = k; rows a warp owns
constexpr int kKeys = 32;  // keys of a key tile (forward, dq): one per lane in the softmax
constexpr int kDkdvQueries = 32;  // queries of a query tile in the dk/dv kernel

// Warps of the forward and dq kernels' blocks (16 query rows each): four with bf16 tiles, two
// with fp32 tiles (twice the bytes; the tiles must fit in 48 KiB of static shared memory).
template <class E>
constexpr int kQueryWarps = std::is_same_v<E, bf16_t> ? 4 : 2;
constexpr int kDkdvWarps = 2;  // 16 keys each

template <class E>
__device__ __forceinline__ E to_element(float v) {
  if constexpr (std::is_same_v<E, bf16_t>)
    return __float2bfloat16(v);
  else
    return v;
}

// The probabilities' tile as E: a buffer of its own for bf16; for fp32 the scores' own buffer,
// overwritten in place (each element read and rewritten by the same lane).
template <class E, int N>
struct ScoresAs {
  E own[std::is_same_v<E, float> ? 1 : N];
  __device__ __forceinline__ E* in(float* scores) {
    if constexpr (std::is_same_v<E, float>)
      return scores;
    else
      return own;
  }
};

// ---------------------------------------------------------------------------------------------
// A warp's 16x16 fp32 accumulator tile. mma<kBT>: acc += A B with A [16 x K] row-major (lda)
// and B [K x 16] row-major (ldb), or with kBT B given transposed: B^T [16 x K] row-major, the
// layout of k and v tiles (keys as rows). load/store: shared memory, row-major, ld. All lanes
// of the warp call every member together; the caller orders shared memory written by other
// lanes with __syncwarp/__syncthreads as a GPU requires.
template <class E>
struct WarpTile;

template <>
struct WarpTile<bf16_t> {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, kTile, kTile, kTile, float> acc;

  __device__ __forceinline__ void zero() { nvcuda::wmma::fill_fragment(acc, 0.0f); }
  __device__ __forceinline__ void load(const float* p, int ld) {
    nvcuda::wmma::load_matrix_sync(acc, p, ld, nvcuda::wmma::mem_row_major);
  }
  __device__ __forceinline__ void store(float* p, int ld) const {
    nvcuda::wmma::store_matrix_sync(p, acc, ld, nvcuda::wmma::mem_row_major);
  }
  template <bool kBT>
  __device__ __forceinline__ void mma(const bf16_t* a, int lda, const bf16_t* b, int ldb, int K) {
    using LayoutB = std::conditional_t<kBT, nvcuda::wmma::col_major, nvcuda::wmma::row_major>;
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, kTile, kTile, kTile, bf16_t,
                           nvcuda::wmma::row_major> fa;
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, kTile, kTile, kTile, bf16_t, LayoutB> fb;
    for (int k0 = 0; k0 < K; k0 += kTile) {
      nvcuda::wmma::load_matrix_sync(fa, a + k0, lda);
      nvcuda::wmma::load_matrix_sync(fb, kBT ? b + k0 : b + k0 * ldb, ldb);
      nvcuda::wmma::mma_sync(acc, fa, fb, acc);
    }
  }
};

// fp32: lane l holds elements l, l+32, ..., l+224 of the tile (row e/16, column e%16), each a
// dot product summed in k order.
template <>
struct WarpTile<float> {
  static constexpr int kPerLane = kTile * kTile / kWarp;
  float x[kPerLane];

  __device__ __forceinline__ static int element(int i) {
    return static_cast<int>(threadIdx.x % kWarp) + kWarp * i;
  }
  __device__ __forceinline__ void zero() {
    for (float& v : x) v = 0.0f;
  }
  __device__ __forceinline__ void load(const float* p, int ld) {
    for (int i = 0; i < kPerLane; ++i) x[i] = p[element(i) / kTile * ld + element(i) % kTile];
  }
  __device__ __forceinline__ void store(float* p, int ld) const {
    for (int i = 0; i < kPerLane; ++i) p[element(i) / kTile * ld + element(i) % kTile] = x[i];
  }
  template <bool kBT>
  __device__ __forceinline__ void mma(const float* a, int lda, const float* b, int ldb, int K) {
    for (int i = 0; i < kPerLane; ++i) {
      const int r = element(i) / kTile, c = element(i) % kTile;
      float s = x[i];
      for (int k = 0; k < K; ++k) s += a[r * lda + k] * (kBT ? b[c * ldb + k] : b[k * ldb + c]);
      x[i] = s;
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Tiles from global memory.

// dst[rows x kHS] (E, row-major) = rows row0 .. row0+rows-1 of src (row stride ld, HS columns),
// zeros for rows past T and columns past HS. The whole block calls it.
template <class E, int kHS>
__device__ __forceinline__ void load_rows(E* dst, const float* src, Index ld, int row0, int rows,
                                          int T, int HS) {
  for (int i = static_cast<int>(threadIdx.x); i < rows * kHS; i += static_cast<int>(blockDim.x)) {
    const int r = i / kHS, d = i % kHS, t = row0 + r;
    dst[i] = to_element<E>(t < T && d < HS ? src[Index(t) * ld + d] : 0.0f);
  }
}

// dst[rows] = src[row0 ..] (0 past T). The whole block calls it.
__device__ __forceinline__ void load_row_values(float* dst, const float* src, int row0, int rows,
                                                int T) {
  for (int i = static_cast<int>(threadIdx.x); i < rows; i += static_cast<int>(blockDim.x))
    dst[i] = row0 + i < T ? src[row0 + i] : 0.0f;
}

// dst[row0 + r, d] += acc[r, d - col0] for the warp's 16x16 tile (rows < T, columns < HS), via
// `stage` (16x16 floats of the warp's shared memory). The whole warp calls it.
template <class E>
__device__ __forceinline__ void add_tile(float* dst, Index ld, const WarpTile<E>& acc, float* stage,
                                         int row0, int col0, int T, int HS) {
  __syncwarp();  // stage may still be read
  acc.store(stage, kTile);
  __syncwarp();
  for (int i = static_cast<int>(threadIdx.x % kWarp); i < kTile * kTile; i += kWarp) {
    const int r = row0 + i / kTile, d = col0 + i % kTile;
    if (r < T && d < HS) dst[Index(r) * ld + d] += stage[i];
  }
}

// The causal mask: query t sees key t2 when t2 <= t (and both are real rows).
__device__ __forceinline__ bool visible(int t, int t2, int T) { return t2 <= t && t < T; }

// ---------------------------------------------------------------------------------------------
// Forward. grid (query tiles, B*NH), kQueryWarps<E> warps.

template <class E, int kHS>
struct ForwardShared {
  static constexpr int kRows = kTile * kQueryWarps<E>;
  alignas(128) E q[kRows * kHS];
  alignas(128) E k[kKeys * kHS];
  alignas(128) E v[kKeys * kHS];
  alignas(128) float s[kRows * kKeys];
  alignas(128) float o[kRows * kHS];
  alignas(128) ScoresAs<E, kRows * kKeys> p;
};

template <class E, int kHS>
__global__ void __launch_bounds__(kQueryWarps<E>* kWarp)
    flash_forward_kernel(float* __restrict__ out, float* __restrict__ lse,
                         const float* __restrict__ qkv, int T, int C, int NH, float scale) {
  using Shared = ForwardShared<E, kHS>;
  constexpr int kRows = Shared::kRows;
  __shared__ Shared sh;
  const int HS = C / NH, bh = static_cast<int>(blockIdx.y), b = bh / NH, h = bh % NH;
  const Index C3 = 3 * Index(C);
  const int q0 = static_cast<int>(blockIdx.x) * kRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const float* seq = qkv + Index(b) * T * C3 + Index(h) * HS;

  load_rows<E, kHS>(sh.q, seq, C3, q0, kRows, T, HS);
  for (int i = static_cast<int>(threadIdx.x); i < kRows * kHS; i += static_cast<int>(blockDim.x))
    sh.o[i] = 0.0f;
  const E* q_w = sh.q + warp * kTile * kHS;
  float* s_w = sh.s + warp * kTile * kKeys;
  E* p_w = sh.p.in(sh.s) + warp * kTile * kKeys;
  float* o_w = sh.o + warp * kTile * kHS;
  const int row0 = q0 + warp * kTile;  // the warp's first query

  float m[kTile], l[kTile];  // running max and sum of the warp's rows (the same in every lane)
#pragma unroll
  for (int r = 0; r < kTile; ++r) m[r] = -FLT_MAX, l[r] = 0.0f;

  const int keys_end = T < q0 + kRows ? T : q0 + kRows;  // no query of the block sees a later key
  for (int k0 = 0; k0 < keys_end; k0 += kKeys) {
    __syncthreads();  // every warp is done with the previous k and v tiles
    load_rows<E, kHS>(sh.k, seq + C, C3, k0, kKeys, T, HS);
    load_rows<E, kHS>(sh.v, seq + 2 * C, C3, k0, kKeys, T, HS);
    __syncthreads();
    for (int j = 0; j < kKeys / kTile; ++j) {  // S = q k^T (unscaled)
      WarpTile<E> acc;
      acc.zero();
      acc.template mma<true>(q_w, kHS, sh.k + j * kTile * kHS, kHS, kHS);
      acc.store(s_w + j * kTile, kKeys);
    }
    __syncwarp();
    const int key = k0 + lane;
#pragma unroll
    for (int r = 0; r < kTile; ++r) {  // online softmax, lane = key
      const bool seen = visible(row0 + r, key, T);  // none in the rows past T: never written
      const float s = seen ? s_w[r * kKeys + lane] * scale : -FLT_MAX;
      const float m_new = fmaxf(m[r], warp_max(s));
      const float p = seen ? expf(s - m_new) : 0.0f;
      // 0 at the first tile (m = -FLT_MAX, m_new finite: key 0 is seen), 1 where no key is seen
      const float alpha = expf(m[r] - m_new);
      l[r] = alpha * l[r] + warp_sum(p);
      m[r] = m_new;
      p_w[r * kKeys + lane] = to_element<E>(p);
      for (int d = lane; d < kHS; d += kWarp) o_w[r * kHS + d] *= alpha;
    }
    __syncwarp();
    for (int j = 0; j < kHS / kTile; ++j) {  // O += P v
      WarpTile<E> acc;
      acc.load(o_w + j * kTile, kHS);
      acc.template mma<false>(p_w, kKeys, sh.v + j * kTile, kHS, kKeys);
      acc.store(o_w + j * kTile, kHS);
    }
  }
  __syncwarp();
  float* out_seq = out + Index(b) * T * C + Index(h) * HS;
#pragma unroll
  for (int r = 0; r < kTile; ++r) {
    const int t = row0 + r;
    if (t >= T) break;  // the same t in every lane
    const float inv = 1.0f / l[r];  // l >= 1: the max term is exp(0)
    for (int d = lane; d < HS; d += kWarp) out_seq[Index(t) * C + d] = o_w[r * kHS + d] * inv;
    if (lane == 0) lse[Index(bh) * T + t] = m[r] + logf(l[r]);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 1: D[bh*T + t] = sum_d dout * out over the row's head (one warp per row).

__global__ void flash_backward_rowdot_kernel(float* __restrict__ D, const float* __restrict__ dout,
                                             const float* __restrict__ out, Index rows, int T,
                                             int C, int NH) {
  const Index row = Index(blockIdx.x) * (kBlock / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp
  const int lane = static_cast<int>(threadIdx.x % kWarp), HS = C / NH;
  const Index t = row % T, bh = row / T, b = bh / NH, h = bh % NH;
  const Index at = (b * T + t) * C + h * HS;
  float sum = 0.0f;
  for (int d = lane; d < HS; d += kWarp) sum += dout[at + d] * out[at + d];
  sum = warp_sum(sum);
  if (lane == 0) D[row] = sum;
}

// The probability and its score gradient for one element of a tile: p = exp(scale s - lse)
// where the query sees the key (else 0), ds = scale p (dp - D).
struct ProbAndGrad {
  float p, ds;
};
__device__ __forceinline__ ProbAndGrad prob_and_grad(bool seen, float s, float dp, float lse,
                                                     float D, float scale) {
  const float p = seen ? expf(s * scale - lse) : 0.0f;
  return {p, scale * (p * (dp - D))};
}

// ---------------------------------------------------------------------------------------------
// Backward, step 2: dk and dv. grid (key tiles of 16 * kDkdvWarps, B*NH).

template <class E, int kHS>
struct DkdvShared {
  static constexpr int kKeyRows = kTile * kDkdvWarps, kQ = kDkdvQueries;
  alignas(128) E k[kKeyRows * kHS];
  alignas(128) E v[kKeyRows * kHS];
  alignas(128) E q[kQ * kHS];
  alignas(128) E dout[kQ * kHS];
  alignas(128) float st[kKeyRows * kQ];   // S^T, then P^T for fp32
  alignas(128) float dpt[kKeyRows * kQ];  // dP^T, then dS^T for fp32
  alignas(128) ScoresAs<E, kKeyRows * kQ> pt, dst;
  float lse[kQ], D[kQ];
};

template <class E, int kHS>
__global__ void __launch_bounds__(kDkdvWarps* kWarp)
    flash_backward_dkdv_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                               const float* __restrict__ qkv, const float* __restrict__ lse,
                               const float* __restrict__ D, int T, int C, int NH, float scale) {
  using Shared = DkdvShared<E, kHS>;
  constexpr int kKeyRows = Shared::kKeyRows, kQ = Shared::kQ;
  __shared__ Shared sh;
  const int HS = C / NH, bh = static_cast<int>(blockIdx.y), b = bh / NH, h = bh % NH;
  const Index C3 = 3 * Index(C);
  const int k0 = static_cast<int>(blockIdx.x) * kKeyRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const float* seq = qkv + Index(b) * T * C3 + Index(h) * HS;
  const float* dout_seq = dout + Index(b) * T * C + Index(h) * HS;

  load_rows<E, kHS>(sh.k, seq + C, C3, k0, kKeyRows, T, HS);
  load_rows<E, kHS>(sh.v, seq + 2 * C, C3, k0, kKeyRows, T, HS);
  const E* k_w = sh.k + warp * kTile * kHS;
  const E* v_w = sh.v + warp * kTile * kHS;
  float* st_w = sh.st + warp * kTile * kQ;
  float* dpt_w = sh.dpt + warp * kTile * kQ;
  E* pt_w = sh.pt.in(sh.st) + warp * kTile * kQ;
  E* dst_w = sh.dst.in(sh.dpt) + warp * kTile * kQ;
  const int key0 = k0 + warp * kTile;  // the warp's first key

  WarpTile<E> dk[kHS / kTile], dv[kHS / kTile];
#pragma unroll
  for (int j = 0; j < kHS / kTile; ++j) dk[j].zero(), dv[j].zero();

  for (int q0 = k0 / kQ * kQ; q0 < T; q0 += kQ) {  // earlier queries see none of the keys
    __syncthreads();  // every warp is done with the previous query tile
    load_rows<E, kHS>(sh.q, seq, C3, q0, kQ, T, HS);
    load_rows<E, kHS>(sh.dout, dout_seq, C, q0, kQ, T, HS);
    load_row_values(sh.lse, lse + Index(bh) * T, q0, kQ, T);
    load_row_values(sh.D, D + Index(bh) * T, q0, kQ, T);
    __syncthreads();
    for (int j = 0; j < kQ / kTile; ++j) {  // S^T = k q^T, dP^T = v dout^T
      WarpTile<E> s, dp;
      s.zero();
      s.template mma<true>(k_w, kHS, sh.q + j * kTile * kHS, kHS, kHS);
      s.store(st_w + j * kTile, kQ);
      dp.zero();
      dp.template mma<true>(v_w, kHS, sh.dout + j * kTile * kHS, kHS, kHS);
      dp.store(dpt_w + j * kTile, kQ);
    }
    __syncwarp();
    for (int i = lane; i < kTile * kQ; i += kWarp) {
      const int r = i / kQ, c = i % kQ;
      const ProbAndGrad g =
          prob_and_grad(visible(q0 + c, key0 + r, T), st_w[i], dpt_w[i], sh.lse[c], sh.D[c], scale);
      pt_w[i] = to_element<E>(g.p);
      dst_w[i] = to_element<E>(g.ds);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kHS / kTile; ++j) {  // dv += P^T dout, dk += dS^T q
      dv[j].template mma<false>(pt_w, kQ, sh.dout + j * kTile, kHS, kQ);
      dk[j].template mma<false>(dst_w, kQ, sh.q + j * kTile, kHS, kQ);
    }
  }
  float* dseq = dqkv + Index(b) * T * C3 + Index(h) * HS;
#pragma unroll
  for (int j = 0; j < kHS / kTile; ++j) {
    add_tile(dseq + C, C3, dk[j], st_w, key0, j * kTile, T, HS);
    add_tile(dseq + 2 * C, C3, dv[j], st_w, key0, j * kTile, T, HS);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 3: dq. grid (query tiles, B*NH), kQueryWarps<E> warps.

template <class E, int kHS>
struct DqShared {
  static constexpr int kRows = kTile * kQueryWarps<E>;
  alignas(128) E q[kRows * kHS];
  alignas(128) E dout[kRows * kHS];
  alignas(128) E k[kKeys * kHS];
  alignas(128) E v[kKeys * kHS];
  alignas(128) float s[kRows * kKeys];
  alignas(128) float dp[kRows * kKeys];  // dP, then dS for fp32
  alignas(128) ScoresAs<E, kRows * kKeys> ds;
  float lse[kRows], D[kRows];
};

template <class E, int kHS>
__global__ void __launch_bounds__(kQueryWarps<E>* kWarp)
    flash_backward_dq_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                             const float* __restrict__ qkv, const float* __restrict__ lse,
                             const float* __restrict__ D, int T, int C, int NH, float scale) {
  using Shared = DqShared<E, kHS>;
  constexpr int kRows = Shared::kRows;
  __shared__ Shared sh;
  const int HS = C / NH, bh = static_cast<int>(blockIdx.y), b = bh / NH, h = bh % NH;
  const Index C3 = 3 * Index(C);
  const int q0 = static_cast<int>(blockIdx.x) * kRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const float* seq = qkv + Index(b) * T * C3 + Index(h) * HS;

  load_rows<E, kHS>(sh.q, seq, C3, q0, kRows, T, HS);
  load_rows<E, kHS>(sh.dout, dout + Index(b) * T * C + Index(h) * HS, C, q0, kRows, T, HS);
  load_row_values(sh.lse, lse + Index(bh) * T, q0, kRows, T);
  load_row_values(sh.D, D + Index(bh) * T, q0, kRows, T);
  const E* q_w = sh.q + warp * kTile * kHS;
  const E* dout_w = sh.dout + warp * kTile * kHS;
  float* s_w = sh.s + warp * kTile * kKeys;
  float* dp_w = sh.dp + warp * kTile * kKeys;
  E* ds_w = sh.ds.in(sh.dp) + warp * kTile * kKeys;
  const int row0 = q0 + warp * kTile;

  WarpTile<E> dq[kHS / kTile];
#pragma unroll
  for (int j = 0; j < kHS / kTile; ++j) dq[j].zero();

  const int keys_end = T < q0 + kRows ? T : q0 + kRows;
  for (int k0 = 0; k0 < keys_end; k0 += kKeys) {
    __syncthreads();  // every warp is done with the previous k and v tiles (and q, dout loaded)
    load_rows<E, kHS>(sh.k, seq + C, C3, k0, kKeys, T, HS);
    load_rows<E, kHS>(sh.v, seq + 2 * C, C3, k0, kKeys, T, HS);
    __syncthreads();
    for (int j = 0; j < kKeys / kTile; ++j) {  // S = q k^T, dP = dout v^T
      WarpTile<E> s, dp;
      s.zero();
      s.template mma<true>(q_w, kHS, sh.k + j * kTile * kHS, kHS, kHS);
      s.store(s_w + j * kTile, kKeys);
      dp.zero();
      dp.template mma<true>(dout_w, kHS, sh.v + j * kTile * kHS, kHS, kHS);
      dp.store(dp_w + j * kTile, kKeys);
    }
    __syncwarp();
    for (int i = lane; i < kTile * kKeys; i += kWarp) {
      const int r = i / kKeys, c = i % kKeys;
      const float row_lse = sh.lse[warp * kTile + r], row_D = sh.D[warp * kTile + r];
      const ProbAndGrad g =
          prob_and_grad(visible(row0 + r, k0 + c, T), s_w[i], dp_w[i], row_lse, row_D, scale);
      ds_w[i] = to_element<E>(g.ds);
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kHS / kTile; ++j)  // dq += dS k
      dq[j].template mma<false>(ds_w, kKeys, sh.k + j * kTile, kHS, kKeys);
  }
  float* dseq = dqkv + Index(b) * T * C3 + Index(h) * HS;
#pragma unroll
  for (int j = 0; j < kHS / kTile; ++j) add_tile(dseq, C3, dq[j], s_w, row0, j * kTile, T, HS);
}

// ---------------------------------------------------------------------------------------------
// Host side.

struct Shape {
  int B, T, C, NH;
  float scale;
  unsigned bh;
};

Shape shape_of(int B, int T, int C, int NH) {
  if (!flash_attention_supported(C, NH))
    fatal_abort(ExitCode::runtime,
                where(__FILE__, __LINE__) + ": flash attention with C = " + std::to_string(C) +
                    ", NH = " + std::to_string(NH) + ": heads of C / NH <= " +
                    std::to_string(kFlashMaxHeadSize) + " channels only (callers check "
                    "flash_attention_supported)");
  return {B, T, C, NH, 1.0f / std::sqrt(static_cast<float>(C / NH)), unsigned(B) * unsigned(NH)};
}

template <class E, int kHS>
void forward(cudaStream_t stream, float* out, float* lse, const float* qkv, const Shape& s) {
  constexpr int rows = kTile * kQueryWarps<E>;
  const dim3 grid(static_cast<unsigned>(ceil_div(s.T, rows)), s.bh);
  PDTRAIN_LAUNCH((flash_forward_kernel<E, kHS>), grid, rows * kWarp / kTile, 0, stream)(
      out, lse, qkv, s.T, s.C, s.NH, s.scale);
  CUDA_CHECK_LAUNCH();
}

template <class E, int kHS>
void backward(cudaStream_t stream, float* dqkv, const float* D, const float* dout,
              const float* qkv, const float* lse, const Shape& s) {
  constexpr int key_rows = kTile * kDkdvWarps, rows = kTile * kQueryWarps<E>;
  const dim3 dkdv_grid(static_cast<unsigned>(ceil_div(s.T, key_rows)), s.bh);
  PDTRAIN_LAUNCH((flash_backward_dkdv_kernel<E, kHS>), dkdv_grid, kDkdvWarps * kWarp, 0, stream)(
      dqkv, dout, qkv, lse, D, s.T, s.C, s.NH, s.scale);
  CUDA_CHECK_LAUNCH();
  const dim3 dq_grid(static_cast<unsigned>(ceil_div(s.T, rows)), s.bh);
  PDTRAIN_LAUNCH((flash_backward_dq_kernel<E, kHS>), dq_grid, kQueryWarps<E> * kWarp, 0, stream)(
      dqkv, dout, qkv, lse, D, s.T, s.C, s.NH, s.scale);
  CUDA_CHECK_LAUNCH();
}

// Calls f.template operator()<E, kHS>() for the element type and the head size padded to 16.
template <class F>
void dispatch(bool bf16_inputs, int HS, F&& f) {
  const int padded = (HS + kTile - 1) / kTile * kTile;
  const auto with = [&]<class E>() {
    switch (padded) {
      case 16: return f.template operator()<E, 16>();
      case 32: return f.template operator()<E, 32>();
      case 48: return f.template operator()<E, 48>();
      default: return f.template operator()<E, 64>();
    }
  };
  if (bf16_inputs)
    with.template operator()<bf16_t>();
  else
    with.template operator()<float>();
}

}  // namespace

bool flash_attention_supported(int C, int NH) {
  return NH > 0 && C > 0 && C % NH == 0 && C / NH <= kFlashMaxHeadSize;
}

Index flash_attention_saved_floats(int B, int T, int NH) { return Index(B) * NH * T; }
Index flash_attention_scratch_floats(int B, int T, int NH) { return Index(B) * NH * T; }

void flash_attention_forward(cudaStream_t stream, float* out, float* lse, const float* qkv, int B,
                             int T, int C, int NH, bool bf16_inputs) {
  if (B <= 0 || T <= 0) return;
  const Shape s = shape_of(B, T, C, NH);
  dispatch(bf16_inputs, C / NH, [&]<class E, int kHS>() {
    forward<E, kHS>(stream, out, lse, qkv, s);
  });
}

void flash_attention_backward(cudaStream_t stream, float* dqkv, float* scratch, const float* dout,
                              const float* qkv, const float* out, const float* lse, int B, int T,
                              int C, int NH, bool bf16_inputs) {
  if (B <= 0 || T <= 0) return;
  const Shape s = shape_of(B, T, C, NH);
  const Index rows = Index(B) * NH * T;
  PDTRAIN_LAUNCH(flash_backward_rowdot_kernel,
                 static_cast<unsigned>(ceil_div(rows, kBlock / kWarp)), kBlock, 0, stream)(
      scratch, dout, out, rows, T, C, NH);
  CUDA_CHECK_LAUNCH();
  dispatch(bf16_inputs, C / NH, [&]<class E, int kHS>() {
    backward<E, kHS>(stream, dqkv, scratch, dout, qkv, lse, s);
  });
}

}  // namespace pdtrain::kernels::cuda
