// Fused causal attention (flash_attention.hpp): flash-attention tiling with the CPU's buffers
// (qkv[B,T,3C], out[B,T,C], dqkv += ...), after Dao's FlashAttention-2. Two families of
// kernels, by the element type of the shared-memory tiles; both are templates on the head size
// padded to a multiple of 16 (kHS; the padding columns are zeros and add nothing) and on G, the
// element type of qkv and out in global memory: float, or the project's bf16 (core/bf16.hpp)
// in bf16 runs whose activations are bf16, read into the tiles and written from the fp32
// results directly (no conversion pass). bf16 G always goes with bf16 tiles.
//
// bf16 tiles (namespace fa2 and the *_mma_kernel kernels, below): the FlashAttention-2 way on
// the tensor cores, mma.sync m16n8k16 with ldmatrix fragments and cp.async double buffering
// (mma_sm80.cuh), S, P, O and the gradients in registers; described where they are defined.
//
// fp32 tiles (fp32 runs: the same products on the CUDA cores in fp32), built from pieces each
// written once: KeyTile and QueryTile (a block's k/v rows, or its q/dout rows with their lse
// and D, loaded from global memory), for_each_key_tile (the causal loop over key tiles of the
// forward and dq), warp_scores (every score-shaped product: S, S^T, dP, dP^T),
// warp_accumulate (every product summed in registers across the loop: dv, dk, dq),
// probs_and_grads (P and dS from the scores, for dk/dv on the transposed tile) and add_rows
// (the gradients added to dqkv at the end). A warp owns 16 rows of a tile; its 16x16 products
// go through WarpTile<float>.
//
//  forward      block: a tile of queries of one (b,h); loops over the key/value tiles up to its
//               last query (causal). Per warp: S = q k^T into shared memory, the online softmax
//               one row at a time (lane j takes key j of the 32-key tile), the output rows
//               rescaled and O += P v. Writes out = O / l and lse = m + log l.
//  D            one warp per row: D = rowsum(dout * out) (= rowsum(P * dP)); both families.
//  dk, dv       block: a tile of keys; loops over the query tiles from the first that sees it.
//               Per warp: S^T = k q^T and dP^T = v dout^T, P^T = exp(scale S^T - lse),
//               dS^T = scale P^T (dP^T - D); dv += P^T dout and dk += dS^T q in registers;
//               added to dqkv once at the end.
//  dq           block: a tile of queries; loops over the key tiles up to its last query.
//               S, dP, P, dS as above, dq += dS k; added to dqkv at the end.
// In both families each output element is summed by one lane or warp in the loop order: no
// atomics, the same bits every run. Masked probabilities are exact zeros, as in the CPU's
// softmax.
#include <cuda_bf16.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "flash_attention.hpp"
#include "mma_sm80.cuh"

namespace pdtrain::kernels::cuda {
namespace {

using bf16_t = __nv_bfloat16;

constexpr int kTile = 16;  // rows a warp owns
constexpr int kKeys = 32;  // keys of a key tile (forward, dq): one per lane in the softmax
constexpr int kDkdvQueries = 32;  // queries of a query tile in the dk/dv kernel

// Warps of the fp32 forward and dq kernels' blocks (16 query rows each; the tiles must fit in
// 48 KiB of static shared memory).
template <class E>
constexpr int kQueryWarps = 2;
constexpr int kDkdvWarps = 2;  // 16 keys each

template <class E>
__device__ __forceinline__ E to_element(float v) {
  if constexpr (std::is_same_v<E, bf16_t>)
    return __float2bfloat16(v);
  else
    return v;
}

// A global element of qkv or out as fp32 (exact), and an fp32 result as one (bf16: core/bf16.hpp's
// rounding, the one every backend uses). stored_as returns the value rather than storing through
// a pointer: with the store inside, ptxas -v gave the forward with bf16 tiles, fp32 activations
// and 48-channel heads 12 registers more (110 -> 122).
__device__ __forceinline__ float load_value(float v) { return v; }
__device__ __forceinline__ float load_value(bf16 v) { return pdtrain::to_float(v); }
template <class G>
__device__ __forceinline__ G stored_as(float v) {
  if constexpr (std::is_same_v<G, bf16>)
    return pdtrain::to_bf16(v);
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

// fp32 (the only one: bf16 tiles run the fa2 kernels below): lane l holds elements l, l+32,
// ..., l+224 of the tile: column l % 16 of rows l / 16, l / 16 + 2, ..., l / 16 + 14. Each
// element is a dot product summed in k order. mma walks k outermost so that the lane's one B
// value of each k serves all its 8 rows (9 shared loads per k instead of 16), unrolled 4 times
// only: fully unrolled, nvcc hoisted the loads of every k at once and the fp32 kernels with
// 48- and 64-channel heads spilled (ptxas -v). Each sum is in k order either way: the same bits.
template <>
struct WarpTile<float> {
  static constexpr int kPerLane = kTile * kTile / kWarp;
  static constexpr int kRowStep = kWarp / kTile;  // rows between a lane's elements
  float x[kPerLane];

  __device__ __forceinline__ static int row(int i) {
    return static_cast<int>(threadIdx.x % kWarp) / kTile + kRowStep * i;
  }
  __device__ __forceinline__ static int col() { return static_cast<int>(threadIdx.x % kTile); }
  __device__ __forceinline__ void zero() {
    for (float& v : x) v = 0.0f;
  }
  __device__ __forceinline__ void load(const float* p, int ld) {
    for (int i = 0; i < kPerLane; ++i) x[i] = p[row(i) * ld + col()];
  }
  __device__ __forceinline__ void store(float* p, int ld) const {
    for (int i = 0; i < kPerLane; ++i) p[row(i) * ld + col()] = x[i];
  }
  template <bool kBT>
  __device__ __forceinline__ void mma(const float* a, int lda, const float* b, int ldb, int K) {
    const int c = col();
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
      const float bk = kBT ? b[c * ldb + k] : b[k * ldb + c];
      for (int i = 0; i < kPerLane; ++i) x[i] += a[row(i) * lda + k] * bk;
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The warp's products. Every product of these kernels is one of these two, over the warp's 16
// rows `a`: rows of the head's kHS channels, or of a 16 x K score tile.

// dst[16 x kCols] (ld kCols) = a b^T with b kCols rows of kHS channels (the k, v, q or dout
// rows of a tile): the scores S = q k^T, S^T = k q^T and their gradients dP = dout v^T,
// dP^T = v dout^T.
template <class E, int kHS, int kCols>
__device__ __forceinline__ void warp_scores(float* dst, const E* a, const E* b) {
  for (int j = 0; j < kCols / kTile; ++j) {
    WarpTile<E> acc;
    acc.zero();
    acc.template mma<true>(a, kHS, b + j * kTile * kHS, kHS, kHS);
    acc.store(dst + j * kTile, kCols);
  }
}

// acc[j] += a b[:, 16j ..] with `a` a 16 x K score tile (ld K), b K rows of kHS channels:
// dv += P^T dout, dk += dS^T q, dq += dS k, accumulated in registers across the loop's tiles.
template <class E, int kHS, int K>
__device__ __forceinline__ void warp_accumulate(WarpTile<E> (&acc)[kHS / kTile], const E* a,
                                                const E* b) {
#pragma unroll
  for (int j = 0; j < kHS / kTile; ++j) acc[j].template mma<false>(a, K, b + j * kTile, kHS, K);
}

template <class E, int kHS>
__device__ __forceinline__ void zero_all(WarpTile<E> (&acc)[kHS / kTile]) {
#pragma unroll
  for (int j = 0; j < kHS / kTile; ++j) acc[j].zero();
}

// ---------------------------------------------------------------------------------------------
// Tiles from global memory.

// The block's head, (b, h) = blockIdx.y: where its rows start in each array. qkv and dqkv are
// [B,T,3C] with q at +0, k at +C, v at +2C; out and dout [B,T,C]; lse and D [B*NH,T].
struct BlockHead {
  int T, C, HS;
  Index qkv_at, act_at, rows_at;  // (b, t = 0, head h) in qkv/dqkv, out/dout; (b, h, 0) in lse/D
};

__device__ __forceinline__ BlockHead block_head(int T, int C, int NH) {
  const int bh = static_cast<int>(blockIdx.y), b = bh / NH, h = bh % NH, HS = C / NH;
  return {T, C, HS, Index(b) * T * 3 * C + Index(h) * HS, Index(b) * T * C + Index(h) * HS,
          Index(bh) * T};
}

enum QkvPart { kPartQ = 0, kPartK = 1, kPartV = 2 };  // offsets in C of a qkv row

__device__ __forceinline__ int warp_index() { return static_cast<int>(threadIdx.x) / kWarp; }
__device__ __forceinline__ int lane_index() { return static_cast<int>(threadIdx.x) % kWarp; }

// The warp's 16 rows of a block's tile whose rows are ld elements.
template <class T>
__device__ __forceinline__ T* warp_rows(T* tile, int ld) {
  return tile + warp_index() * kTile * ld;
}

// dst[rows x kHS] (E, row-major) = rows row0 .. row0+rows-1 of src (G: float or bf16; row
// stride ld, HS columns), zeros for rows past T and columns past HS. The whole block calls it.
template <class E, int kHS, class G>
__device__ __forceinline__ void load_rows(E* dst, const G* src, Index ld, int row0, int rows,
                                          int T, int HS) {
  for (int i = static_cast<int>(threadIdx.x); i < rows * kHS; i += static_cast<int>(blockDim.x)) {
    const int r = i / kHS, d = i % kHS, t = row0 + r;
    dst[i] = to_element<E>(t < T && d < HS ? load_value(src[Index(t) * ld + d]) : 0.0f);
  }
}

// The head's q, k or v rows row0 .. of qkv.
template <class E, int kHS, class G>
__device__ __forceinline__ void load_qkv_rows(E* dst, const G* qkv, const BlockHead& hd,
                                              QkvPart part, int row0, int rows) {
  load_rows<E, kHS>(dst, qkv + hd.qkv_at + part * Index(hd.C), 3 * Index(hd.C), row0, rows, hd.T,
                    hd.HS);
}

// dst[rows] = src[row0 ..] of the head's row of lse or D (0 past T). The whole block calls it.
__device__ __forceinline__ void load_row_values(float* dst, const float* src, const BlockHead& hd,
                                                int row0, int rows) {
  for (int i = static_cast<int>(threadIdx.x); i < rows; i += static_cast<int>(blockDim.x))
    dst[i] = row0 + i < hd.T ? src[hd.rows_at + row0 + i] : 0.0f;
}

// A tile of kRows keys and their values in shared memory.
template <class E, int kHS, int kRows>
struct KeyTile {
  alignas(128) E k[kRows * kHS];
  alignas(128) E v[kRows * kHS];

  template <class G>
  __device__ __forceinline__ void load(const G* qkv, const BlockHead& hd, int k0) {
    load_qkv_rows<E, kHS>(k, qkv, hd, kPartK, k0, kRows);
    load_qkv_rows<E, kHS>(v, qkv, hd, kPartV, k0, kRows);
  }
};

// A tile of kRows queries with what the backward needs of them: dout, lse and D.
template <class E, int kHS, int kRows>
struct QueryTile {
  alignas(128) E q[kRows * kHS];
  alignas(128) E dout[kRows * kHS];
  float lse[kRows], D[kRows];

  template <class G>
  __device__ __forceinline__ void load(const G* qkv, const float* dout_, const float* lse_,
                                       const float* D_, const BlockHead& hd, int q0) {
    load_qkv_rows<E, kHS>(q, qkv, hd, kPartQ, q0, kRows);
    load_rows<E, kHS>(dout, dout_ + hd.act_at, hd.C, q0, kRows, hd.T, hd.HS);
    load_row_values(lse, lse_, hd, q0, kRows);
    load_row_values(D, D_, hd, q0, kRows);
  }
};

// The key tiles a block of the queries q0 .. q0+rows-1 sees (causal: none past its last query),
// loaded one after the other into `keys`; body(k0) then runs with the tile of keys k0 ...
template <class E, int kHS, class G, class Body>
__device__ __forceinline__ void for_each_key_tile(KeyTile<E, kHS, kKeys>& keys, const G* qkv,
                                                  const BlockHead& hd, int q0, int rows,
                                                  Body&& body) {
  const int keys_end = hd.T < q0 + rows ? hd.T : q0 + rows;
  for (int k0 = 0; k0 < keys_end; k0 += kKeys) {
    __syncthreads();  // every warp is done with the previous tile (and the block's own loads)
    keys.load(qkv, hd, k0);
    __syncthreads();
    body(k0);
  }
}

// dst[row0 + r, d] += acc[j][r, d - 16j] for the warp's 16 rows (rows < T, columns < HS), via
// `stage` (16x16 floats of the warp's shared memory). The whole warp calls it.
template <class E, int kHS>
__device__ __forceinline__ void add_rows(float* dst, const WarpTile<E> (&acc)[kHS / kTile],
                                         float* stage, const BlockHead& hd, int row0) {
  const Index ld = 3 * Index(hd.C);
#pragma unroll
  for (int j = 0; j < kHS / kTile; ++j) {
    __syncwarp();  // stage may still be read
    acc[j].store(stage, kTile);
    __syncwarp();
    for (int i = lane_index(); i < kTile * kTile; i += kWarp) {
      const int r = row0 + i / kTile, d = j * kTile + i % kTile;
      if (r < hd.T && d < hd.HS) dst[Index(r) * ld + d] += stage[i];
    }
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
  KeyTile<E, kHS, kKeys> keys;
  alignas(128) float s[kRows * kKeys];
  alignas(128) float o[kRows * kHS];
  alignas(128) ScoresAs<E, kRows * kKeys> p;
};

// The online softmax over one key tile for the warp's 16 rows, one row at a time (lane = key):
// m and l, the rows' running max and sum (the same in every lane), take in the tile's scores s;
// p = exp(scale s - m) goes to p as E, and the output rows o are rescaled to the new max.
template <class E, int kHS>
__device__ __forceinline__ void online_softmax(float (&m)[kTile], float (&l)[kTile], E* p,
                                               float* o, const float* s, int row0, int k0, int T,
                                               float scale) {
  const int lane = lane_index(), key = k0 + lane;
#pragma unroll
  for (int r = 0; r < kTile; ++r) {
    const bool seen = visible(row0 + r, key, T);  // none in the rows past T: never written
    const float x = seen ? s[r * kKeys + lane] * scale : -FLT_MAX;
    const float m_new = fmaxf(m[r], warp_max(x));
    const float e = seen ? expf(x - m_new) : 0.0f;
    // 0 at the first tile (m = -FLT_MAX, m_new finite: key 0 is seen), 1 where no key is seen
    const float alpha = expf(m[r] - m_new);
    l[r] = alpha * l[r] + warp_sum(e);
    m[r] = m_new;
    p[r * kKeys + lane] = to_element<E>(e);
    for (int d = lane; d < kHS; d += kWarp) o[r * kHS + d] *= alpha;
  }
}

// O += P v for the warp's 16 rows, O in shared memory (the softmax rescales it by row there).
template <class E, int kHS>
__device__ __forceinline__ void add_pv(float* o, const E* p, const E* v) {
  for (int j = 0; j < kHS / kTile; ++j) {
    WarpTile<E> acc;
    acc.load(o + j * kTile, kHS);
    acc.template mma<false>(p, kKeys, v + j * kTile, kHS, kKeys);
    acc.store(o + j * kTile, kHS);
  }
}

// out = O / l (as G: bf16 rounds once) and lse = m + log l for the warp's rows below T.
template <int kHS, class G>
__device__ __forceinline__ void write_rows(G* out, float* lse, const float* o,
                                           const float (&m)[kTile], const float (&l)[kTile],
                                           const BlockHead& hd, int row0) {
  const int lane = lane_index();
#pragma unroll
  for (int r = 0; r < kTile; ++r) {
    const int t = row0 + r;
    if (t >= hd.T) break;  // the same t in every lane
    const float inv = 1.0f / l[r];  // l >= 1: the max term is exp(0)
    for (int d = lane; d < hd.HS; d += kWarp)
      out[hd.act_at + Index(t) * hd.C + d] = stored_as<G>(o[r * kHS + d] * inv);
    if (lane == 0) lse[hd.rows_at + t] = m[r] + logf(l[r]);
  }
}

template <class E, int kHS, class G>
__global__ void __launch_bounds__(kQueryWarps<E>* kWarp)
    flash_forward_kernel(G* __restrict__ out, float* __restrict__ lse, const G* __restrict__ qkv,
                         int T, int C, int NH, float scale) {
  using Shared = ForwardShared<E, kHS>;
  constexpr int kRows = Shared::kRows;
  __shared__ Shared sh;
  const BlockHead hd = block_head(T, C, NH);
  const int q0 = static_cast<int>(blockIdx.x) * kRows;

  load_qkv_rows<E, kHS>(sh.q, qkv, hd, kPartQ, q0, kRows);
  for (int i = static_cast<int>(threadIdx.x); i < kRows * kHS; i += static_cast<int>(blockDim.x))
    sh.o[i] = 0.0f;
  const E* q_w = warp_rows(sh.q, kHS);
  float* s_w = warp_rows(sh.s, kKeys);
  E* p_w = warp_rows(sh.p.in(sh.s), kKeys);
  float* o_w = warp_rows(sh.o, kHS);
  const int row0 = q0 + warp_index() * kTile;  // the warp's first query

  float m[kTile], l[kTile];
#pragma unroll
  for (int r = 0; r < kTile; ++r) m[r] = -FLT_MAX, l[r] = 0.0f;

  for_each_key_tile(sh.keys, qkv, hd, q0, kRows, [&](int k0) {
    warp_scores<E, kHS, kKeys>(s_w, q_w, sh.keys.k);  // S = q k^T (unscaled)
    __syncwarp();
    online_softmax<E, kHS>(m, l, p_w, o_w, s_w, row0, k0, T, scale);
    __syncwarp();
    add_pv<E, kHS>(o_w, p_w, sh.keys.v);
  });
  __syncwarp();
  write_rows<kHS>(out, lse, o_w, m, l, hd, row0);
}

// ---------------------------------------------------------------------------------------------
// Forward with bf16 tiles, the FlashAttention-2 way (Dao, 2023): mma.sync m16n8k16 on the
// tensor cores (mma_sm80.cuh), S, P and O in registers. grid (query tiles of 128, B*NH), 8
// warps; warp w owns the block's query rows 16w .. 16w+15 and walks the key tiles of 64 keys up
// to the block's last query (causal: no later tile is loaded, and a warp skips the tiles all
// past its last row). Per tile: S = q k^T (q's fragments loaded once by ldmatrix, k's by
// ldmatrix from the tile), masked only in the tiles that cross the diagonal; the online softmax
// in base 2 (log2 e folded into the scale: one exp2f per score) with each row's max and sum
// reduced over the 4 lanes that hold it (2 shuffles each, the sum only at the end); P rounded
// to bf16 straight from S's accumulators into mma's A fragments (the two layouts coincide);
// O += P v with v's fragments by ldmatrix.trans. The next k/v tile is in flight (16-byte
// cp.async into the other of two buffers) while this one is multiplied.
//
// Shared memory (dynamic, cudaFuncSetAttribute: 54 KiB at 64 channels): q [128 x kLd], k and v
// [2][64 x kLd], bf16, kLd = kHS + 8 elements per row. No bank conflicts, by construction: a
// 16-byte access of a warp is served in 4 phases of 8 lanes, an ldmatrix row address per lane,
// and 8 lanes touching 8 different 16-byte columns of the 128-byte bank line are one wavefront.
// Every access of these kernels has its 8 lanes of a phase on 8 consecutive rows at the same
// column (ldmatrix: a matrix's 8 rows; the cp.async mapping of load_tile below), and the row
// stride kLd * 2 bytes = 16 (kHS / 8 + 1) bytes is an odd number of 16-byte units (kHS is a
// multiple of 16), so 8 consecutive rows land on 8 distinct 16-byte columns mod 128 bytes.
// load_tile's fp32 path stores each chunk as one 16-byte store (not 2 or 4 narrower ones, whose
// 16- or 32-lane phases would span rows and collide), in the cp.async mapping. The backward's
// 4-byte reads of lse and D (probs_and_grads_mma) ask a warp for at most 8 distinct words in 8
// distinct banks (the lanes of one word share it), and every lane reads them, seen or not: a
// load skipped by some lanes would pair the others' next shared access with theirs in the
// emulation's counts.
namespace fa2 {

constexpr int kWarps = 8;
constexpr int kQueries = kTile * kWarps;  // a block's query tile: 128
constexpr int kKeys = 64;                 // a key/value tile
constexpr int kThreads = kWarps * kWarp;

// The head's part (q, k or v) of qkv, rows 3C apart.
template <class G>
__device__ __forceinline__ const G* head_part(const G* qkv, const BlockHead& hd, QkvPart part) {
  return qkv + hd.qkv_at + part * Index(hd.C);
}
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int kHS>
struct Layout {
  static constexpr int kLd = kHS + 8;  // elements per shared row (an odd number of 16 bytes)
  static constexpr int kQ = 0, kK = kQueries * kLd, kV = kK + 2 * kKeys * kLd;  // in elements
  static constexpr int kBuffer = kKeys * kLd;  // one of the two k (v) buffers
  static constexpr std::size_t kBytes = std::size_t(kV + 2 * kBuffer) * sizeof(bf16_t);
  static_assert(kHS % 16 == 0 && (kLd * 2 / 16) % 2 == 1, "the conflict-free row stride");
};

using u32 = std::uint32_t;

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
  return u32{pdtrain::to_bf16(lo).bits} | u32{pdtrain::to_bf16(hi).bits} << 16;
}

// Elements 8c .. 8c+7 of row t (at src + t ld) as 8 bf16, zeros past T and past HS: fp32 ones
// by two 16-byte loads where the 8 are real and 16-byte aligned (one 32-byte sector, where 8
// loads of 4 bytes each ask for a sector), else element by element.
template <class G>
__device__ __forceinline__ uint4 bf16_chunk(const G* src, Index ld, int t, int c,
                                            const BlockHead& hd) {
  if constexpr (std::is_same_v<G, float>) {
    const float* from = t < hd.T && 8 * c + 8 <= hd.HS ? src + Index(t) * ld + 8 * c : nullptr;
    if (from != nullptr && reinterpret_cast<std::uintptr_t>(from) % 16 == 0) {
      const float4 lo = load4(from, 0), hi = load4(from, 1);
      return make_uint4(pack_bf16x2(lo.x, lo.y), pack_bf16x2(lo.z, lo.w),
                        pack_bf16x2(hi.x, hi.y), pack_bf16x2(hi.z, hi.w));
    }
  }
  const auto value = [&](int d) {
    return t < hd.T && d < hd.HS ? load_value(src[Index(t) * ld + d]) : 0.0f;
  };
  u32 w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) w[e] = pack_bf16x2(value(8 * c + 2 * e), value(8 * c + 2 * e + 1));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Rows row0 .. row0+kRows-1 of one head's [T x HS] slice of a global array (row t at src +
// t ld: q, k or v of qkv, or dout) into dst [kRows x kLd] as bf16, zeros past T and past HS.
// With `async` (bf16 elements, HS and ld multiples of 8, 16-byte aligned) each 16-byte chunk
// is one cp.async, landing at the cp_async_wait that covers the caller's next commit; else
// read by bf16_chunk (fp32 rounded to bf16) and stored 16 bytes at a time, synchronous. The
// 8 threads of a phase take one 16-byte column of 8 consecutive rows (conflict-free, above).
// kThreads threads call it.
template <int kHS, int kRows, int kThreads, class G>
__device__ __forceinline__ void load_tile(bf16_t* dst, const G* src, Index ld, int row0,
                                          const BlockHead& hd, bool async) {
  constexpr int kChunks = kHS / 8, kLd = Layout<kHS>::kLd;
  static_assert(kRows % 8 == 0);
  for (int i = static_cast<int>(threadIdx.x); i < kRows * kChunks; i += kThreads) {
    const int r = i / (8 * kChunks) * 8 + i % 8, c = i / 8 % kChunks, t = row0 + r;
    bf16_t* to = dst + r * kLd + c * 8;
    if constexpr (std::is_same_v<G, bf16>) {
      if (async) {
        const bool real = t < hd.T && c * 8 < hd.HS;
        sm80::cp_async_16(to, real ? src + Index(t) * ld + c * 8 : src, real ? 16 : 0);
        continue;
      }
    }
    const uint4 chunk = bf16_chunk(src, ld, t, c, hd);
    PDTRAIN_CUDA_EMU_VECTOR_ACCESS(to, 16, true);  // one 16-byte store, as one cp.async
    *reinterpret_cast<uint4*>(to) = chunk;
  }
}

// The warp's A fragments of its 16 q rows (at q_w, ld kLd), one per 16 channels: ldmatrix.x4 of
// the 8x8 matrices (rows 0-7, 8-15) x (channels 0-7, 8-15) = a0a1, a2a3, a4a5, a6a7.
template <int kHS>
__device__ __forceinline__ void load_a_fragments(u32 (&a)[kHS / 16][4], const bf16_t* q_w) {
  constexpr int kLd = Layout<kHS>::kLd;
  const int lane = lane_index();
  const bf16_t* row = q_w + (lane % 16) * kLd + lane / 16 * 8;
#pragma unroll
  for (int kk = 0; kk < kHS / 16; ++kk) sm80::ldmatrix<4, false>(a[kk], row + 16 * kk);
}

// s [16 x 64] = q k^T: s[n] holds keys 8n + 2 (lane % 4), +1 of rows lane / 4 (s[n][0..1]) and
// lane / 4 + 8 (s[n][2..3]). k's B fragments by ldmatrix.x4 of (keys 0-7, 8-15 of 16) x
// (channels 0-7, 8-15 of 16): b0b1, b2b3 of key block 2np, then of 2np + 1.
template <int kHS>
__device__ __forceinline__ void scores(float (&s)[kKeys / 8][4], const u32 (&qa)[kHS / 16][4],
                                       const bf16_t* k) {
  constexpr int kLd = Layout<kHS>::kLd;
  const int lane = lane_index();
  const bf16_t* row = k + (lane / 16 * 8 + lane % 8) * kLd + lane / 8 % 2 * 8;
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kHS / 16; ++kk)
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      u32 b[4];
      sm80::ldmatrix<4, false>(b, row + 16 * np * kLd + 16 * kk);
      sm80::mma_m16n8k16_bf16(s[2 * np], qa[kk], {b[0], b[1]}, s[2 * np]);
      sm80::mma_m16n8k16_bf16(s[2 * np + 1], qa[kk], {b[2], b[3]}, s[2 * np + 1]);
    }
}

// The online softmax of one tile for the lane's two rows (h = 0: row0 + lane/4, h = 1: +8):
// s becomes p = 2^(s scale_log2 - m) (0 where the key is past the row's query: only tiles
// that cross the diagonal check), m the rows' running max (base 2, the same in the row's 4
// lanes), l this lane's part of the rows' running sums, o rescaled to the new max.
template <int kHS>
__device__ __forceinline__ void softmax_tile(float (&s)[kKeys / 8][4], float (&m)[2], float (&l)[2],
                                             float (&o)[kHS / 8][4], int row0, int k0,
                                             float scale_log2) {
  const int lane = lane_index(), g = lane / 4, key_in_pair = 2 * (lane % 4);
  const bool crosses = k0 + kKeys - 1 > row0;  // some key past some query of the warp
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = k0 + 8 * n + key_in_pair + i % 2, query = row0 + g + 8 * (i / 2);
      s[n][i] = crosses && key > query ? -INFINITY : s[n][i] * scale_log2;
      mx[i / 2] = fmaxf(mx[i / 2], s[n][i]);
    }
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 2));
    // Finite: key 0 of the first tile is seen by every row. 0 at the first tile (m = -inf).
    alpha[h] = exp2f(m[h] - mx[h]);
    m[h] = mx[h];
    l[h] *= alpha[h];
  }
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[n][i] = exp2f(s[n][i] - m[i / 2]);  // exp2(-inf) = 0 exactly
      l[i / 2] += s[n][i];
    }
#pragma unroll
  for (int d = 0; d < kHS / 8; ++d)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[d][i] *= alpha[i / 2];
}

// o [16 x kHS] += p v. p's accumulators of key blocks 2kk, 2kk + 1 are mma's A fragment of keys
// 16kk .. 16kk+15 (rounded to bf16); v's B fragments by ldmatrix.x4.trans of (keys 0-7, 8-15
// of 16) x (channels 0-7, 8-15 of 16): b0b1, b2b3 of channel block 2dp, then of 2dp + 1.
template <int kHS>
__device__ __forceinline__ void add_pv_mma(float (&o)[kHS / 8][4], const float (&p)[kKeys / 8][4],
                                           const bf16_t* v) {
  constexpr int kLd = Layout<kHS>::kLd;
  const int lane = lane_index();
  const bf16_t* row = v + (lane / 8 % 2 * 8 + lane % 8) * kLd + lane / 16 * 8;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const u32 a[4] = {pack_bf16x2(p[2 * kk][0], p[2 * kk][1]),
                      pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                      pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                      pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < kHS / 16; ++dp) {
      u32 b[4];
      sm80::ldmatrix<4, true>(b, row + 16 * kk * kLd + 16 * dp);
      sm80::mma_m16n8k16_bf16(o[2 * dp], a, {b[0], b[1]}, o[2 * dp]);
      sm80::mma_m16n8k16_bf16(o[2 * dp + 1], a, {b[2], b[3]}, o[2 * dp + 1]);
    }
  }
}

// out = o / l (rows below T, columns below HS; as G) and lse = ln(2) m + ln l (natural log, as
// the backward reads it). l's four lane parts are summed in a fixed butterfly: the same bits
// in the row's 4 lanes.
template <int kHS, class G>
__device__ __forceinline__ void write_rows_mma(G* out, float* lse, const float (&o)[kHS / 8][4],
                                               const float (&m)[2], float (&l)[2],
                                               const BlockHead& hd, int row0) {
  const int lane = lane_index(), g = lane / 4, col = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(kFullMask, l[h], 1);
    l[h] += __shfl_xor_sync(kFullMask, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = row0 + g + 8 * h;
    if (t >= hd.T) continue;
    const float inv = 1.0f / l[h];  // l >= 1: the max term is 2^0
    G* row = out + hd.act_at + Index(t) * hd.C;
#pragma unroll
    for (int d = 0; d < kHS / 8; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * d + col + e < hd.HS) store1(row, 8 * d + col + e, o[d][2 * h + e] * inv);
    if (lane % 4 == 0) lse[hd.rows_at + t] = m[h] * kLn2 + logf(l[h]);
  }
}

}  // namespace fa2

template <int kHS, class G>
__global__ void __launch_bounds__(fa2::kThreads)
    flash_forward_mma_kernel(G* __restrict__ out, float* __restrict__ lse,
                             const G* __restrict__ qkv, int T, int C, int NH, float scale_log2,
                             bool async) {
  using L = fa2::Layout<kHS>;
  PDTRAIN_DYNAMIC_SHARED(bf16_t, sh);
  const BlockHead hd = block_head(T, C, NH);
  // The longest rows first: block x takes the x-th query tile from the end.
  const int q0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * fa2::kQueries;
  const int row0 = q0 + warp_index() * kTile;  // the warp's first query
  const int last = (T < q0 + fa2::kQueries ? T : q0 + fa2::kQueries) - 1;  // the block's
  const int tiles = last / fa2::kKeys + 1;

  const Index ld = 3 * Index(C);
  const G *q = fa2::head_part(qkv, hd, kPartQ), *k = fa2::head_part(qkv, hd, kPartK),
          *v = fa2::head_part(qkv, hd, kPartV);
  fa2::load_tile<kHS, fa2::kQueries, fa2::kThreads>(sh + L::kQ, q, ld, q0, hd, async);
  fa2::load_tile<kHS, fa2::kKeys, fa2::kThreads>(sh + L::kK, k, ld, 0, hd, async);
  fa2::load_tile<kHS, fa2::kKeys, fa2::kThreads>(sh + L::kV, v, ld, 0, hd, async);
  sm80::cp_async_commit();

  fa2::u32 qa[kHS / 16][4];
  float o[kHS / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int j = 0; j < tiles; ++j) {
    const int buffer = j % 2 * L::kBuffer;
    if (j + 1 < tiles) {  // the next tile into the other buffer, freed by the last barrier
      const int next = (j + 1) % 2 * L::kBuffer;
      const int k_next = (j + 1) * fa2::kKeys;
      fa2::load_tile<kHS, fa2::kKeys, fa2::kThreads>(sh + L::kK + next, k, ld, k_next, hd, async);
      fa2::load_tile<kHS, fa2::kKeys, fa2::kThreads>(sh + L::kV + next, v, ld, k_next, hd, async);
      sm80::cp_async_commit();
      sm80::cp_async_wait<1>();  // this tile's group (and q's) landed, the next in flight
    } else {
      sm80::cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of this tile landed
    if (j == 0) fa2::load_a_fragments<kHS>(qa, sh + L::kQ + warp_index() * kTile * L::kLd);
    const int k0 = j * fa2::kKeys;
    if (row0 < T && k0 <= row0 + kTile - 1) {  // the warp sees some key of the tile
      float s[fa2::kKeys / 8][4];
      fa2::scores<kHS>(s, qa, sh + L::kK + buffer);
      fa2::softmax_tile<kHS>(s, m, l, o, row0, k0, scale_log2);
      fa2::add_pv_mma<kHS>(o, s, sh + L::kV + buffer);
    }
    __syncthreads();  // every warp is done with this buffer before the next load into it
  }
  fa2::write_rows_mma<kHS>(out, lse, o, m, l, hd, row0);
}

// ---------------------------------------------------------------------------------------------
// Backward with bf16 tiles, the same way: two passes whose every output element is summed by
// one lane in a fixed order (no atomics: the same bits every run) and added once to dqkv.
//  dk, dv  block: 64 keys (4 warps of 16, their k and v fragments loaded once); walks the query
//          tiles of 64 from the first that sees its keys, the next tile's q (cp.async), dout
//          (fp32 rounded to bf16), lse and D loaded while this one is multiplied. Per warp:
//          S^T = k q^T, dP^T = v dout^T, P^T = 2^(S^T scale log2e - lse log2e), dS^T = scale P^T
//          (dP^T - D), dv += P^T dout, dk += dS^T q (P^T and dS^T from the accumulators as A
//          fragments, q and dout by ldmatrix.trans).
//  dq      block: 128 queries (8 warps); walks the key tiles of 64 up to its last query as the
//          forward does: S = q k^T, dP = dout v^T, P, dS, dq += dS k.
// 7 products of T^2 HS per head (each halved by causality), as the WMMA kernels did:
// FlashAttention-2 does 5 by adding dq from the dk/dv pass with atomics, in an order that
// changes run to run; a deterministic dq without T^2 scratch recomputes S and dP per query
// tile instead (2 more).
namespace fa2 {

constexpr int kDkdvWarps = 4;
constexpr int kDkdvKeys = kTile * kDkdvWarps;  // 64: a dk/dv block's keys
constexpr int kDkdvThreads = kDkdvWarps * kWarp;
constexpr int kDkdvQueries = kKeys;  // its query tiles: the 64 columns of a score tile

template <int kHS>
struct DkdvLayout {
  static constexpr int kLd = Layout<kHS>::kLd, kBuffer = kDkdvQueries * kLd;
  static constexpr int kK = 0, kV = kDkdvKeys * kLd, kQ = 2 * kV, kDout = kQ + 2 * kBuffer;
  static constexpr int kElements = kDout + 2 * kBuffer;  // then lse [2][64], D [2][64]
  static constexpr std::size_t kBytes =
      std::size_t(kElements) * sizeof(bf16_t) + 4 * kDkdvQueries * sizeof(float);
};

template <int kHS>
struct DqLayout {
  static constexpr int kLd = Layout<kHS>::kLd, kBuffer = kKeys * kLd;
  static constexpr int kQ = 0, kDout = kQueries * kLd, kK = 2 * kDout, kV = kK + 2 * kBuffer;
  static constexpr int kElements = kV + 2 * kBuffer;  // then lse [128], D [128]
  static constexpr std::size_t kBytes =
      std::size_t(kElements) * sizeof(bf16_t) + 2 * kQueries * sizeof(float);
};

// P and dS of a warp's [16 x 64] tile of scores s and their gradients dp, in place: s becomes
// P = 2^(s scale_log2 - lse log2e) where the query sees the key (else 0), dp becomes
// dS = scale P (dp - D). The tile's rows are keys and its columns queries with kKeyRows (dk/dv's
// S^T), else the other way round; lse and D hold the values of the queries from `first` on.
template <bool kKeyRows>
__device__ __forceinline__ void probs_and_grads_mma(float (&s)[kKeys / 8][4],
                                                    float (&dp)[kKeys / 8][4], const float* lse,
                                                    const float* D, int first, int row0,
                                                    int col0, int T, float scale_log2,
                                                    float scale) {
  const int lane = lane_index(), g = lane / 4, pair = 2 * (lane % 4);
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row0 + g + 8 * (i / 2), c = col0 + 8 * n + pair + i % 2;
      const int query = kKeyRows ? c : r, key = kKeyRows ? r : c;
      const bool seen = key <= query && query < T;
      // exp2f(-inf) = +0 where the key is not seen: a select, not a branch that would skip the
      // read of lse in some lanes (the conflict-free argument above the forward kernel).
      const float x = s[n][i] * scale_log2 - lse[query - first] * kLog2e;
      const float p = exp2f(seen ? x : -INFINITY);
      s[n][i] = p;
      dp[n][i] = scale * (p * (dp[n][i] - D[query - first]));
    }
}

// dst[t, d] += acc of the warp's rows t = row0 + lane/4 (+8) below T, columns d below HS (dst:
// row 0 of the head's part of dqkv, rows 3C apart). Each element by one lane.
template <int kHS>
__device__ __forceinline__ void add_rows_mma(float* dst, const float (&acc)[kHS / 8][4],
                                             const BlockHead& hd, int row0) {
  const int lane = lane_index(), g = lane / 4, col = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = row0 + g + 8 * h;
    if (t >= hd.T) continue;
    float* row = dst + Index(t) * 3 * hd.C;
#pragma unroll
    for (int d = 0; d < kHS / 8; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (8 * d + col + e < hd.HS) row[8 * d + col + e] += acc[d][2 * h + e];
  }
}

}  // namespace fa2

template <int kHS, class G>
__global__ void __launch_bounds__(fa2::kDkdvThreads)
    flash_backward_dkdv_mma_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                                   const G* __restrict__ qkv, const float* __restrict__ lse,
                                   const float* __restrict__ D, int T, int C, int NH,
                                   float scale, bool async) {
  using L = fa2::DkdvLayout<kHS>;
  constexpr int kQ = fa2::kDkdvQueries;
  PDTRAIN_DYNAMIC_SHARED(bf16_t, sh);
  float* lse_s = reinterpret_cast<float*>(sh + L::kElements);  // [2][64]
  float* D_s = lse_s + 2 * kQ;                                  // [2][64]
  const BlockHead hd = block_head(T, C, NH);
  const int k0 = static_cast<int>(blockIdx.x) * fa2::kDkdvKeys;
  const int key0 = k0 + warp_index() * kTile;  // the warp's first key
  const Index ld = 3 * Index(C);
  const G* q = fa2::head_part(qkv, hd, kPartQ);
  const float* dout_h = dout + hd.act_at;
  const float scale_log2 = scale * fa2::kLog2e;

  // Query tile j (queries k0 + 64 j ..: earlier ones see none of the keys) into buffer b.
  const auto load_queries = [&](int j, int b) {
    const int q0 = k0 + j * kQ;
    fa2::load_tile<kHS, kQ, fa2::kDkdvThreads>(sh + L::kQ + b * L::kBuffer, q, ld, q0, hd, async);
    fa2::load_tile<kHS, kQ, fa2::kDkdvThreads>(sh + L::kDout + b * L::kBuffer, dout_h, C, q0, hd,
                                               false);
    load_row_values(lse_s + b * kQ, lse, hd, q0, kQ);
    load_row_values(D_s + b * kQ, D, hd, q0, kQ);
  };
  fa2::load_tile<kHS, fa2::kDkdvKeys, fa2::kDkdvThreads>(
      sh + L::kK, fa2::head_part(qkv, hd, kPartK), ld, k0, hd, async);
  fa2::load_tile<kHS, fa2::kDkdvKeys, fa2::kDkdvThreads>(
      sh + L::kV, fa2::head_part(qkv, hd, kPartV), ld, k0, hd, async);
  load_queries(0, 0);
  sm80::cp_async_commit();

  const int tiles = (T - k0 + kQ - 1) / kQ;
  fa2::u32 ka[kHS / 16][4], va[kHS / 16][4];
  float dk[kHS / 8][4] = {}, dv[kHS / 8][4] = {};
  for (int j = 0; j < tiles; ++j) {
    const int b = j % 2, q0 = k0 + j * kQ;
    if (j + 1 < tiles) {  // the next tile into the other buffers, freed by the last barrier
      load_queries(j + 1, 1 - b);
      sm80::cp_async_commit();
      sm80::cp_async_wait<1>();
    } else {
      sm80::cp_async_wait<0>();
    }
    __syncthreads();
    if (j == 0) {
      fa2::load_a_fragments<kHS>(ka, sh + L::kK + warp_index() * kTile * L::kLd);
      fa2::load_a_fragments<kHS>(va, sh + L::kV + warp_index() * kTile * L::kLd);
    }
    if (key0 < T && q0 + kQ - 1 >= key0) {  // some query of the tile sees some key of the warp
      const bf16_t *qt = sh + L::kQ + b * L::kBuffer, *dt = sh + L::kDout + b * L::kBuffer;
      float st[fa2::kKeys / 8][4], dpt[fa2::kKeys / 8][4];
      fa2::scores<kHS>(st, ka, qt);   // S^T = k q^T
      fa2::scores<kHS>(dpt, va, dt);  // dP^T = v dout^T
      fa2::probs_and_grads_mma<true>(st, dpt, lse_s + b * kQ, D_s + b * kQ, q0, key0, q0, T,
                                     scale_log2, scale);
      fa2::add_pv_mma<kHS>(dv, st, dt);   // dv += P^T dout
      fa2::add_pv_mma<kHS>(dk, dpt, qt);  // dk += dS^T q
    }
    __syncthreads();  // every warp is done with these buffers before the next load into them
  }
  float* dseq = dqkv + hd.qkv_at;
  fa2::add_rows_mma<kHS>(dseq + kPartK * Index(C), dk, hd, key0);
  fa2::add_rows_mma<kHS>(dseq + kPartV * Index(C), dv, hd, key0);
}

template <int kHS, class G>
__global__ void __launch_bounds__(fa2::kThreads)
    flash_backward_dq_mma_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                                 const G* __restrict__ qkv, const float* __restrict__ lse,
                                 const float* __restrict__ D, int T, int C, int NH, float scale,
                                 bool async) {
  using L = fa2::DqLayout<kHS>;
  PDTRAIN_DYNAMIC_SHARED(bf16_t, sh);
  float* lse_s = reinterpret_cast<float*>(sh + L::kElements);  // [128]
  float* D_s = lse_s + fa2::kQueries;                           // [128]
  const BlockHead hd = block_head(T, C, NH);
  const int q0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * fa2::kQueries;  // longest first
  const int row0 = q0 + warp_index() * kTile;
  const int last = (T < q0 + fa2::kQueries ? T : q0 + fa2::kQueries) - 1;
  const int tiles = last / fa2::kKeys + 1;
  const Index ld = 3 * Index(C);
  const G *k = fa2::head_part(qkv, hd, kPartK), *v = fa2::head_part(qkv, hd, kPartV);
  const float scale_log2 = scale * fa2::kLog2e;

  fa2::load_tile<kHS, fa2::kQueries, fa2::kThreads>(sh + L::kQ, fa2::head_part(qkv, hd, kPartQ),
                                                    ld, q0, hd, async);
  fa2::load_tile<kHS, fa2::kQueries, fa2::kThreads>(sh + L::kDout, dout + hd.act_at, C, q0, hd,
                                                    false);
  load_row_values(lse_s, lse, hd, q0, fa2::kQueries);
  load_row_values(D_s, D, hd, q0, fa2::kQueries);
  fa2::load_tile<kHS, fa2::kKeys, fa2::kThreads>(sh + L::kK, k, ld, 0, hd, async);
  fa2::load_tile<kHS, fa2::kKeys, fa2::kThreads>(sh + L::kV, v, ld, 0, hd, async);
  sm80::cp_async_commit();

  fa2::u32 qa[kHS / 16][4], da[kHS / 16][4];
  float dq[kHS / 8][4] = {};
  for (int j = 0; j < tiles; ++j) {
    const int buffer = j % 2 * L::kBuffer;
    if (j + 1 < tiles) {
      const int next = (j + 1) % 2 * L::kBuffer, k_next = (j + 1) * fa2::kKeys;
      fa2::load_tile<kHS, fa2::kKeys, fa2::kThreads>(sh + L::kK + next, k, ld, k_next, hd, async);
      fa2::load_tile<kHS, fa2::kKeys, fa2::kThreads>(sh + L::kV + next, v, ld, k_next, hd, async);
      sm80::cp_async_commit();
      sm80::cp_async_wait<1>();
    } else {
      sm80::cp_async_wait<0>();
    }
    __syncthreads();
    if (j == 0) {
      fa2::load_a_fragments<kHS>(qa, sh + L::kQ + warp_index() * kTile * L::kLd);
      fa2::load_a_fragments<kHS>(da, sh + L::kDout + warp_index() * kTile * L::kLd);
    }
    const int k0 = j * fa2::kKeys;
    if (row0 < T && k0 <= row0 + kTile - 1) {
      float s[fa2::kKeys / 8][4], dp[fa2::kKeys / 8][4];
      fa2::scores<kHS>(s, qa, sh + L::kK + buffer);   // S = q k^T
      fa2::scores<kHS>(dp, da, sh + L::kV + buffer);  // dP = dout v^T
      fa2::probs_and_grads_mma<false>(s, dp, lse_s, D_s, q0, row0, k0, T, scale_log2, scale);
      fa2::add_pv_mma<kHS>(dq, dp, sh + L::kK + buffer);  // dq += dS k
    }
    __syncthreads();
  }
  fa2::add_rows_mma<kHS>(dqkv + hd.qkv_at, dq, hd, row0);
}

// ---------------------------------------------------------------------------------------------
// Backward, step 1: D[bh*T + t] = sum_d dout * out over the row's head (one warp per row).

template <class G>
__global__ void flash_backward_rowdot_kernel(float* __restrict__ D, const float* __restrict__ dout,
                                             const G* __restrict__ out, Index rows, int T, int C,
                                             int NH) {
  const Index row = Index(blockIdx.x) * (kBlock / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp
  const int lane = static_cast<int>(threadIdx.x % kWarp), HS = C / NH;
  const Index t = row % T, bh = row / T, b = bh / NH, h = bh % NH;
  const Index at = (b * T + t) * C + h * HS;
  float sum = 0.0f;
  for (int d = lane; d < HS; d += kWarp) sum += dout[at + d] * load_value(out[at + d]);
  sum = warp_sum(sum);
  if (lane == 0) D[row] = sum;
}

// The probabilities and score gradients of the warp's 16 x kCols tile of scores s and their
// gradients dp: p = exp(scale s - lse) where the query sees the key (else 0), ds = scale p (dp -
// D), as E into p (skipped when null: dq needs only ds) and ds, which may be s and dp themselves
// (each element is read and rewritten by one lane). The tile's rows are keys and its columns
// queries with kKeyRows (the dk/dv kernel's S^T), else the other way round; lse and D are the
// values of the tile's queries, from query 0 of the tile.
template <class E, int kCols, bool kKeyRows>
__device__ __forceinline__ void probs_and_grads(E* p, E* ds, const float* s, const float* dp,
                                                const float* lse, const float* D, int row0,
                                                int col0, int T, float scale) {
  for (int i = lane_index(); i < kTile * kCols; i += kWarp) {
    const int r = i / kCols, c = i % kCols, query = kKeyRows ? c : r;
    const bool seen = kKeyRows ? visible(col0 + c, row0 + r, T) : visible(row0 + r, col0 + c, T);
    const float prob = seen ? expf(s[i] * scale - lse[query]) : 0.0f;
    const float grad = scale * (prob * (dp[i] - D[query]));
    if (p != nullptr) p[i] = to_element<E>(prob);
    ds[i] = to_element<E>(grad);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 2: dk and dv. grid (key tiles of 16 * kDkdvWarps, B*NH).

template <class E, int kHS>
struct DkdvShared {
  static constexpr int kKeyRows = kTile * kDkdvWarps, kQ = kDkdvQueries;
  KeyTile<E, kHS, kKeyRows> keys;
  QueryTile<E, kHS, kQ> queries;
  alignas(128) float st[kKeyRows * kQ];   // S^T, then P^T for fp32
  alignas(128) float dpt[kKeyRows * kQ];  // dP^T, then dS^T for fp32
  alignas(128) ScoresAs<E, kKeyRows * kQ> pt, dst;
};

template <class E, int kHS, class G>
__global__ void __launch_bounds__(kDkdvWarps* kWarp)
    flash_backward_dkdv_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                               const G* __restrict__ qkv, const float* __restrict__ lse,
                               const float* __restrict__ D, int T, int C, int NH, float scale) {
  using Shared = DkdvShared<E, kHS>;
  constexpr int kKeyRows = Shared::kKeyRows, kQ = Shared::kQ;
  __shared__ Shared sh;
  const BlockHead hd = block_head(T, C, NH);
  const int k0 = static_cast<int>(blockIdx.x) * kKeyRows;

  sh.keys.load(qkv, hd, k0);
  const E* k_w = warp_rows(sh.keys.k, kHS);
  const E* v_w = warp_rows(sh.keys.v, kHS);
  float* st_w = warp_rows(sh.st, kQ);
  float* dpt_w = warp_rows(sh.dpt, kQ);
  E* pt_w = warp_rows(sh.pt.in(sh.st), kQ);
  E* dst_w = warp_rows(sh.dst.in(sh.dpt), kQ);
  const int key0 = k0 + warp_index() * kTile;  // the warp's first key

  WarpTile<E> dk[kHS / kTile], dv[kHS / kTile];
  zero_all<E, kHS>(dk);
  zero_all<E, kHS>(dv);
  for (int q0 = k0 / kQ * kQ; q0 < T; q0 += kQ) {  // earlier queries see none of the keys
    __syncthreads();  // every warp is done with the previous query tile
    sh.queries.load(qkv, dout, lse, D, hd, q0);
    __syncthreads();
    warp_scores<E, kHS, kQ>(st_w, k_w, sh.queries.q);      // S^T = k q^T
    warp_scores<E, kHS, kQ>(dpt_w, v_w, sh.queries.dout);  // dP^T = v dout^T
    __syncwarp();
    probs_and_grads<E, kQ, true>(pt_w, dst_w, st_w, dpt_w, sh.queries.lse, sh.queries.D, key0, q0,
                                 T, scale);
    __syncwarp();
    warp_accumulate<E, kHS, kQ>(dv, pt_w, sh.queries.dout);  // dv += P^T dout
    warp_accumulate<E, kHS, kQ>(dk, dst_w, sh.queries.q);    // dk += dS^T q
  }
  float* dseq = dqkv + hd.qkv_at;
  add_rows<E, kHS>(dseq + kPartK * Index(C), dk, st_w, hd, key0);
  add_rows<E, kHS>(dseq + kPartV * Index(C), dv, st_w, hd, key0);
}

// ---------------------------------------------------------------------------------------------
// Backward, step 3: dq. grid (query tiles, B*NH), kQueryWarps<E> warps.

template <class E, int kHS>
struct DqShared {
  static constexpr int kRows = kTile * kQueryWarps<E>;
  QueryTile<E, kHS, kRows> queries;
  KeyTile<E, kHS, kKeys> keys;
  alignas(128) float s[kRows * kKeys];
  alignas(128) float dp[kRows * kKeys];  // dP, then dS for fp32
  alignas(128) ScoresAs<E, kRows * kKeys> ds;
};

template <class E, int kHS, class G>
__global__ void __launch_bounds__(kQueryWarps<E>* kWarp)
    flash_backward_dq_kernel(float* __restrict__ dqkv, const float* __restrict__ dout,
                             const G* __restrict__ qkv, const float* __restrict__ lse,
                             const float* __restrict__ D, int T, int C, int NH, float scale) {
  using Shared = DqShared<E, kHS>;
  constexpr int kRows = Shared::kRows;
  __shared__ Shared sh;
  const BlockHead hd = block_head(T, C, NH);
  const int q0 = static_cast<int>(blockIdx.x) * kRows;

  sh.queries.load(qkv, dout, lse, D, hd, q0);
  const E* q_w = warp_rows(sh.queries.q, kHS);
  const E* dout_w = warp_rows(sh.queries.dout, kHS);
  const float* lse_w = warp_rows(sh.queries.lse, 1);
  const float* D_w = warp_rows(sh.queries.D, 1);
  float* s_w = warp_rows(sh.s, kKeys);
  float* dp_w = warp_rows(sh.dp, kKeys);
  E* ds_w = warp_rows(sh.ds.in(sh.dp), kKeys);
  const int row0 = q0 + warp_index() * kTile;

  WarpTile<E> dq[kHS / kTile];
  zero_all<E, kHS>(dq);
  for_each_key_tile(sh.keys, qkv, hd, q0, kRows, [&](int k0) {
    warp_scores<E, kHS, kKeys>(s_w, q_w, sh.keys.k);      // S = q k^T
    warp_scores<E, kHS, kKeys>(dp_w, dout_w, sh.keys.v);  // dP = dout v^T
    __syncwarp();
    probs_and_grads<E, kKeys, false>(nullptr, ds_w, s_w, dp_w, lse_w, D_w, row0, k0, T, scale);
    __syncwarp();
    warp_accumulate<E, kHS, kKeys>(dq, ds_w, sh.keys.k);  // dq += dS k
  });
  add_rows<E, kHS>(dqkv + hd.qkv_at, dq, s_w, hd, row0);
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

// Whether the bf16 tiles' kernels load qkv with 16-byte cp.async: bf16 qkv whose head rows are
// whole 16-byte chunks (HS and C multiples of 8, 16-byte aligned); else element loads.
template <class G>
bool async_loads(const G* qkv, const Shape& s) {
  return std::is_same_v<G, bf16> && (s.C / s.NH) % 8 == 0 && s.C % 8 == 0 && aligned(qkv, 16);
}

// The bf16 tiles' forward (flash_forward_mma_kernel).
template <int kHS, class G>
void forward_mma(cudaStream_t stream, G* out, float* lse, const G* qkv, const Shape& s) {
  constexpr std::size_t bytes = fa2::Layout<kHS>::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(flash_forward_mma_kernel<kHS, G>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
  const bool async = async_loads(qkv, s);
  const dim3 grid(static_cast<unsigned>(ceil_div(s.T, fa2::kQueries)), s.bh);
  PDTRAIN_LAUNCH_FUNC((flash_forward_mma_kernel<kHS, G>), grid, fa2::kThreads, bytes, stream)(
      out, lse, qkv, s.T, s.C, s.NH, s.scale * fa2::kLog2e, async);
  CUDA_CHECK_LAUNCH();
}

template <class E, int kHS, class G>
void forward(cudaStream_t stream, G* out, float* lse, const G* qkv, const Shape& s) {
  if constexpr (std::is_same_v<E, bf16_t>) {
    forward_mma<kHS>(stream, out, lse, qkv, s);
  } else {  // fp32 tiles: the CUDA cores' kernel
    constexpr int rows = kTile * kQueryWarps<E>;
    const dim3 grid(static_cast<unsigned>(ceil_div(s.T, rows)), s.bh);
    PDTRAIN_LAUNCH((flash_forward_kernel<E, kHS, G>), grid, rows * kWarp / kTile, 0, stream)(
        out, lse, qkv, s.T, s.C, s.NH, s.scale);
    CUDA_CHECK_LAUNCH();
  }
}

template <class E, int kHS, class G>
void backward_cuda_cores(cudaStream_t stream, float* dqkv, const float* D, const float* dout,
                         const G* qkv, const float* lse, const Shape& s) {
  constexpr int key_rows = kTile * kDkdvWarps, rows = kTile * kQueryWarps<E>;
  const dim3 dkdv_grid(static_cast<unsigned>(ceil_div(s.T, key_rows)), s.bh);
  PDTRAIN_LAUNCH((flash_backward_dkdv_kernel<E, kHS, G>), dkdv_grid, kDkdvWarps * kWarp, 0, stream)(
      dqkv, dout, qkv, lse, D, s.T, s.C, s.NH, s.scale);
  CUDA_CHECK_LAUNCH();
  const dim3 dq_grid(static_cast<unsigned>(ceil_div(s.T, rows)), s.bh);
  PDTRAIN_LAUNCH((flash_backward_dq_kernel<E, kHS, G>), dq_grid, kQueryWarps<E> * kWarp, 0, stream)(
      dqkv, dout, qkv, lse, D, s.T, s.C, s.NH, s.scale);
  CUDA_CHECK_LAUNCH();
}

// The bf16 tiles' backward: the dk/dv pass, then the dq pass (both += into dqkv).
template <int kHS, class G>
void backward_mma(cudaStream_t stream, float* dqkv, const float* D, const float* dout,
                  const G* qkv, const float* lse, const Shape& s) {
  constexpr std::size_t dkdv_bytes = fa2::DkdvLayout<kHS>::kBytes;
  constexpr std::size_t dq_bytes = fa2::DqLayout<kHS>::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(flash_backward_dkdv_mma_kernel<kHS, G>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(dkdv_bytes)));
  CUDA_CHECK(cudaFuncSetAttribute(flash_backward_dq_mma_kernel<kHS, G>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(dq_bytes)));
  const bool async = async_loads(qkv, s);
  const dim3 dkdv_grid(static_cast<unsigned>(ceil_div(s.T, fa2::kDkdvKeys)), s.bh);
  PDTRAIN_LAUNCH_FUNC((flash_backward_dkdv_mma_kernel<kHS, G>), dkdv_grid, fa2::kDkdvThreads,
                 dkdv_bytes, stream)(dqkv, dout, qkv, lse, D, s.T, s.C, s.NH, s.scale, async);
  CUDA_CHECK_LAUNCH();
  const dim3 dq_grid(static_cast<unsigned>(ceil_div(s.T, fa2::kQueries)), s.bh);
  PDTRAIN_LAUNCH_FUNC((flash_backward_dq_mma_kernel<kHS, G>), dq_grid, fa2::kThreads, dq_bytes,
                 stream)(dqkv, dout, qkv, lse, D, s.T, s.C, s.NH, s.scale, async);
  CUDA_CHECK_LAUNCH();
}

template <class E, int kHS, class G>
void backward(cudaStream_t stream, float* dqkv, const float* D, const float* dout, const G* qkv,
              const float* lse, const Shape& s) {
  if constexpr (std::is_same_v<E, bf16_t>) {
    backward_mma<kHS>(stream, dqkv, D, dout, qkv, lse, s);
  } else {  // fp32 tiles: the CUDA cores' kernels
    backward_cuda_cores<E, kHS>(stream, dqkv, D, dout, qkv, lse, s);
  }
}

// Calls f.template operator()<E, kHS>() for the head size padded to 16.
template <class E, class F>
void dispatch_head_size(int HS, F&& f) {
  switch ((HS + kTile - 1) / kTile * kTile) {
    case 16: return f.template operator()<E, 16>();
    case 32: return f.template operator()<E, 32>();
    case 48: return f.template operator()<E, 48>();
    default: return f.template operator()<E, 64>();
  }
}

// The tiles' element type of a call: bf16 for bf16 activations (G) or in a bf16 run, else fp32;
// then the head size.
template <class G, class F>
void dispatch(bool bf16_inputs, int HS, F&& f) {
  if constexpr (std::is_same_v<G, bf16>)
    dispatch_head_size<bf16_t>(HS, f);
  else if (bf16_inputs)
    dispatch_head_size<bf16_t>(HS, f);
  else
    dispatch_head_size<float>(HS, f);
}

template <class G>
void forward_any(cudaStream_t stream, G* out, float* lse, const G* qkv, int B, int T, int C,
                 int NH, bool bf16_inputs) {
  if (B <= 0 || T <= 0) return;
  const Shape s = shape_of(B, T, C, NH);
  dispatch<G>(bf16_inputs, C / NH, [&]<class E, int kHS>() {
    forward<E, kHS>(stream, out, lse, qkv, s);
  });
}

template <class G>
void backward_any(cudaStream_t stream, float* dqkv, float* scratch, const float* dout,
                  const G* qkv, const G* out, const float* lse, int B, int T, int C, int NH,
                  bool bf16_inputs) {
  if (B <= 0 || T <= 0) return;
  const Shape s = shape_of(B, T, C, NH);
  const Index rows = Index(B) * NH * T;
  PDTRAIN_LAUNCH(flash_backward_rowdot_kernel<G>,
                 static_cast<unsigned>(ceil_div(rows, kBlock / kWarp)), kBlock, 0, stream)(
      scratch, dout, out, rows, T, C, NH);
  CUDA_CHECK_LAUNCH();
  dispatch<G>(bf16_inputs, C / NH, [&]<class E, int kHS>() {
    backward<E, kHS>(stream, dqkv, scratch, dout, qkv, lse, s);
  });
}

}  // namespace

bool flash_attention_supported(int C, int NH) {
  return NH > 0 && C > 0 && C % NH == 0 && C / NH <= kFlashMaxHeadSize;
}

Index flash_attention_saved_floats(int B, int T, int NH) { return Index(B) * NH * T; }
Index flash_attention_scratch_floats(int B, int T, int NH) { return Index(B) * NH * T; }

void flash_attention_forward(cudaStream_t stream, float* out, float* lse, const float* qkv, int B,
                             int T, int C, int NH, bool bf16_inputs) {
  forward_any(stream, out, lse, qkv, B, T, C, NH, bf16_inputs);
}

void flash_attention_forward(cudaStream_t stream, bf16* out, float* lse, const bf16* qkv, int B,
                             int T, int C, int NH, bool bf16_inputs) {
  forward_any(stream, out, lse, qkv, B, T, C, NH, bf16_inputs);
}

void flash_attention_backward(cudaStream_t stream, float* dqkv, float* scratch, const float* dout,
                              const float* qkv, const float* out, const float* lse, int B, int T,
                              int C, int NH, bool bf16_inputs) {
  backward_any(stream, dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, bf16_inputs);
}

void flash_attention_backward(cudaStream_t stream, float* dqkv, float* scratch, const float* dout,
                              const bf16* qkv, const bf16* out, const float* lse, int B, int T,
                              int C, int NH, bool bf16_inputs) {
  backward_any(stream, dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, bf16_inputs);
}

}  // namespace pdtrain::kernels::cuda
