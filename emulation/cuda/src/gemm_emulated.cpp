// The emulated GEMMs' arithmetic (the summation orders are described in gemm_emulated.hpp) and
// what cublas.cpp and cublaslt.cpp share. Loop order: op(B) is packed once per batch as K-long
// columns; op(A) is packed eight rows at a time (a tile, p-major: the tile's eight values of
// product p side by side); each tile then meets every column of op(B), its eight sums held side
// by side (fixed-size inner loops over the tile's rows, which the compiler vectorizes at -O2
// without changing any one element's order of additions).
#include "gemm_emulated.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emulator.hpp"

namespace cuda_emu::blas {
namespace {

constexpr int kTile = 8;  // rows of op(A) summed side by side

// The summation kernels read only the packed copies (pack_b, pack_tile: buffers of run(), never the
// caller's memory), so the sanitizers' checks there would find nothing and cost a tenfold
// slowdown: they are compiled without them.
#define PDTRAIN_EMU_HOT_LOOP __attribute__((no_sanitize("address", "undefined")))

inline float to_f(float x) { return x; }
inline float to_f(std::uint16_t h) { return widen_bf16(h); }

const char* byte_ptr(const void* p, Elem t, std::int64_t elems) {
  return static_cast<const char*>(p) + elems * static_cast<std::int64_t>(elem_bytes(t));
}

inline float load(const void* base, Elem t, std::int64_t i) {
  return t == Elem::f32 ? static_cast<const float*>(base)[i]
                        : widen_bf16(static_cast<const std::uint16_t*>(base)[i]);
}

inline void store(void* base, Elem t, std::int64_t i, float v) {
  if (t == Elem::f32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<std::uint16_t*>(base)[i] = round_bf16(v);
  }
}

// out[p + j*K] = op(B)(p, j) for p < K, j < n.
template <class T>
void pack_b(const T* B, std::int64_t ldb, bool trans, std::int64_t K, std::int64_t n, float* out) {
  for (std::int64_t j = 0; j < n; ++j) {
    float* col = out + j * K;
    if (!trans) {  // B is K x n: (p, j) at p + j*ldb
      const T* src = B + j * ldb;
      for (std::int64_t p = 0; p < K; ++p) col[p] = to_f(src[p]);
    } else {  // B is n x K: (p, j) at j + p*ldb
      for (std::int64_t p = 0; p < K; ++p) col[p] = to_f(B[j + p * ldb]);
    }
  }
}

// out[p*kTile + v] = op(A)(i0 + v, p) for v < rows (<= kTile), p < K; 0 for v >= rows.
template <class T>
void pack_tile(const T* A, std::int64_t lda, bool trans, std::int64_t i0, std::int64_t rows,
               std::int64_t K, float* out) {
  if (rows < kTile) std::fill_n(out, K * kTile, 0.0f);
  if (!trans) {  // A is m x K: (i, p) at i + p*lda
    for (std::int64_t p = 0; p < K; ++p) {
      const T* src = A + p * lda + i0;
      for (std::int64_t v = 0; v < rows; ++v) out[p * kTile + v] = to_f(src[v]);
    }
  } else {  // A is K x m: (i, p) at p + i*lda
    for (std::int64_t v = 0; v < rows; ++v) {
      const T* src = A + (i0 + v) * lda;
      for (std::int64_t p = 0; p < K; ++p) out[p * kTile + v] = to_f(src[p]);
    }
  }
}

void pack_b_any(const void* B, Elem t, std::int64_t ldb, bool trans, std::int64_t K, std::int64_t n,
                float* out) {
  if (t == Elem::f32) {
    pack_b(static_cast<const float*>(B), ldb, trans, K, n, out);
  } else {
    pack_b(static_cast<const std::uint16_t*>(B), ldb, trans, K, n, out);
  }
}

void pack_tile_any(const void* A, Elem t, std::int64_t lda, bool trans, std::int64_t i0,
                   std::int64_t rows, std::int64_t K, float* out) {
  if (t == Elem::f32) {
    pack_tile(static_cast<const float*>(A), lda, trans, i0, rows, K, out);
  } else {
    pack_tile(static_cast<const std::uint16_t*>(A), lda, trans, i0, rows, K, out);
  }
}

// acc[v] = sum over p of tile[p*kTile + v] * bcol[p], in increasing p (lt_generic,
// cublas_inorder).
PDTRAIN_EMU_HOT_LOOP void dot_in_order(const float* tile, std::int64_t K, const float* bcol,
                                       float* acc) {
  float s[kTile] = {};
  for (std::int64_t p = 0; p < K; ++p) {
    const float bv = bcol[p];
    const float* a = tile + p * kTile;
    for (int v = 0; v < kTile; ++v) {
      const float prod = a[v] * bv;
      s[v] = s[v] + prod;
    }
  }
  std::copy_n(s, kTile, acc);
}

// The pairwise sum of lane sums s[0..L): (s0 + s1) for L = 2, then each half's sum added
// (lt_vec16: (s0 + s1) + (s2 + s3); lt_wide: ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))).
template <int L>
inline float tree_sum(const float* s) {
  if constexpr (L == 1) {
    return s[0];
  } else {
    const float lo = tree_sum<L / 2>(s);
    const float hi = tree_sum<L / 2>(s + L / 2);
    return lo + hi;
  }
}

// The same sum as L partial sums (product p into sum p % L, each in increasing p), then their
// pairwise sum (tree_sum): L = 4 for lt_vec16, 8 for lt_wide.
template <int L>
PDTRAIN_EMU_HOT_LOOP void dot_lanes(const float* tile, std::int64_t K, const float* bcol,
                                    float* acc) {
  static_assert(L == 4 || L == 8);
  float s[L][kTile] = {};
  std::int64_t p = 0;
  for (; p + L <= K; p += L) {
    for (int l = 0; l < L; ++l) {
      const float bv = bcol[p + l];
      const float* a = tile + (p + l) * kTile;
      for (int v = 0; v < kTile; ++v) {
        const float prod = a[v] * bv;
        s[l][v] = s[l][v] + prod;
      }
    }
  }
  for (; p < K; ++p) {  // p % L == p - (K rounded down to L)
    const int l = static_cast<int>(p % L);
    const float bv = bcol[p];
    const float* a = tile + p * kTile;
    for (int v = 0; v < kTile; ++v) {
      const float prod = a[v] * bv;
      s[l][v] = s[l][v] + prod;
    }
  }
  for (int v = 0; v < kTile; ++v) {
    float lanes[L];
    for (int l = 0; l < L; ++l) lanes[l] = s[l][v];
    acc[v] = tree_sum<L>(lanes);
  }
}

void dot(Algo algo, const float* tile, std::int64_t K, const float* bcol, float* acc) {
  if (algo == Algo::lt_wide) {
    dot_lanes<8>(tile, K, bcol, acc);
  } else if (algo == Algo::lt_vec16) {
    dot_lanes<4>(tile, K, bcol, acc);
  } else {
    dot_in_order(tile, K, bcol, acc);
  }
}

template <int L>
float sum_lanes(const float* x, std::int64_t K) {
  float s[L] = {};
  for (std::int64_t p = 0; p < K; ++p) s[p % L] = s[p % L] + x[p];
  return tree_sum<L>(s);
}

// sum over p < K of x[p], in the algorithm's order (BGRADB).
float sum_in_order(Algo algo, const float* x, std::int64_t K) {
  if (algo == Algo::lt_wide) return sum_lanes<8>(x, K);
  if (algo == Algo::lt_vec16) return sum_lanes<4>(x, K);
  float acc = 0.0f;
  for (std::int64_t p = 0; p < K; ++p) acc = acc + x[p];
  return acc;
}

struct Scratch {
  std::vector<float> b;     // op(B), K x n
  std::vector<float> tile;  // K x kTile
  std::vector<float> ones;  // K ones (BGRADA's row sums as products by 1)
  std::vector<float> bias;  // the bias vector as floats
};

void run_batch(const Gemm& g, std::int64_t batch, float alpha, float beta, Scratch& w) {
  const std::int64_t m = g.m, n = g.n, K = g.k;
  const bool need_product = alpha != 0.0f;
  const void* A = byte_ptr(g.a.p, g.a.type, batch * g.a.stride);
  const void* B = byte_ptr(g.b.p, g.b.type, batch * g.b.stride);
  const void* C = beta != 0.0f ? byte_ptr(g.c.p, g.c.type, batch * g.c.stride) : nullptr;
  void* D = const_cast<char*>(byte_ptr(g.d, g.d_type, batch * g.stride_d));
  void* bias_p = g.bias != nullptr
                     ? const_cast<char*>(byte_ptr(g.bias, g.bias_type, batch * g.bias_stride))
                     : nullptr;
  void* aux = g.aux != nullptr
                  ? const_cast<char*>(byte_ptr(g.aux, g.aux_type, batch * g.aux_stride))
                  : nullptr;

  if (need_product || g.bgrad_b) pack_b_any(B, g.b.type, g.b.ld, g.trans_b, K, n, w.b.data());
  if (g.bias_add) {
    for (std::int64_t i = 0; i < m; ++i) w.bias[i] = load(bias_p, g.bias_type, i);
  }

  float acc[kTile];
  for (std::int64_t i0 = 0; i0 < m; i0 += kTile) {
    const std::int64_t rows = std::min<std::int64_t>(kTile, m - i0);
    if (need_product || g.bgrad_a) {
      pack_tile_any(A, g.a.type, g.a.ld, g.trans_a, i0, rows, K, w.tile.data());
    }
    if (g.bgrad_a) {  // the tile's row sums of op(A), into the workspace
      dot(g.algo, w.tile.data(), K, w.ones.data(), acc);
      std::copy_n(acc, rows, g.workspace + i0);
    }
    for (std::int64_t j = 0; j < n; ++j) {
      if (need_product) dot(g.algo, w.tile.data(), K, w.b.data() + j * K, acc);
      for (std::int64_t v = 0; v < rows; ++v) {
        const std::int64_t i = i0 + v;
        float t = need_product ? alpha * acc[v] : 0.0f;
        if (C != nullptr) {
          const float bc = beta * load(C, g.c.type, i + j * g.c.ld);
          t = t + bc;
        }
        if (g.bias_add) t = t + w.bias[i];
        if (g.aux_out) store(aux, g.aux_type, i + j * g.aux_ld, t);
        if (g.gelu) t = gelu(t);
        if (g.dgelu) t = t * gelu_grad(load(aux, g.aux_type, i + j * g.aux_ld));
        store(D, g.d_type, i + j * g.ldd, t);
      }
    }
  }

  if (g.bgrad_a) {
    for (std::int64_t i = 0; i < m; ++i) store(bias_p, g.bias_type, i, g.workspace[i]);
  }
  if (g.bgrad_b) {
    for (std::int64_t j = 0; j < n; ++j)
      g.workspace[j] = sum_in_order(g.algo, w.b.data() + j * K, K);
    for (std::int64_t j = 0; j < n; ++j) store(bias_p, g.bias_type, j, g.workspace[j]);
  }
}

}  // namespace

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::lt_vec16:
      return "cuBLASLt algorithm 0 (aligned, four partial sums)";
    case Algo::lt_generic:
      return "cuBLASLt algorithm 1 (generic, in-order sum)";
    case Algo::lt_wide:
      return "cuBLASLt algorithm 2 (wide, 128-byte aligned, eight partial sums)";
    case Algo::cublas_inorder:
      return "cuBLAS GEMM (in-order sum)";
  }
  return "?";
}

float gelu(float x) {
  constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
  constexpr float kCubic = 0.044715f;
  const float cube = kCubic * x * x * x;
  const float u = kS * (x + cube);
  return x / (1.0f + std::exp(-2.0f * u));
}

float gelu_grad(float x) {
  constexpr float kS = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  const float u = kS * (x + kCubic * x * x * x);
  const float s = 1.0f / (1.0f + std::exp(-2.0f * u));
  const float du_dx = kS * (1.0f + 3.0f * kCubic * x * x);
  return s + 2.0f * x * s * (1.0f - s) * du_dx;
}

std::size_t workspace_bytes(const Gemm& g) {
  if (g.bgrad_a) return static_cast<std::size_t>(g.m) * sizeof(float);
  if (g.bgrad_b) return static_cast<std::size_t>(g.n) * sizeof(float);
  return 0;
}

void run(const Gemm& g) {
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return;
  const float alpha = g.alpha_device != nullptr ? *g.alpha_device : g.alpha;
  const float beta = g.beta_device != nullptr ? *g.beta_device : g.beta;
  Scratch w;
  w.b.resize(static_cast<std::size_t>(g.k * g.n));
  w.tile.resize(static_cast<std::size_t>(g.k * kTile));
  w.ones.assign(g.bgrad_a ? static_cast<std::size_t>(g.k) : 0, 1.0f);
  w.bias.resize(g.bias_add ? static_cast<std::size_t>(g.m) : 0);
  for (std::int64_t b = 0; b < g.batch; ++b) run_batch(g, b, alpha, beta, w);
}

std::size_t span_bytes(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                       std::int64_t stride, std::size_t elem) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return 0;
  const std::int64_t last = (batch - 1) * stride + (cols - 1) * ld + rows;
  return static_cast<std::size_t>(last) * elem;
}

std::string check_device_span(const char* what, const void* p, std::size_t bytes, int device) {
  if (bytes == 0) return {};
  char buf[320];
  if (p == nullptr) {
    std::snprintf(buf, sizeof buf, "%s is a null pointer", what);
    return buf;
  }
  const std::optional<Region> r = find_region(p);
  if (!r) {
    std::snprintf(buf, sizeof buf,
                  "%s (%p) is pageable host memory, not device memory: a GPU would fault on it",
                  what, p);
    return buf;
  }
  if (r->kind != MemoryKind::device) {
    std::snprintf(buf, sizeof buf, "%s (%p) is %s, not device memory", what, p, kind_name(r->kind));
    return buf;
  }
  if (r->device != device) {
    std::snprintf(buf, sizeof buf, "%s (%p) is memory of device %d, but the work runs on device %d",
                  what, p, r->device, device);
    return buf;
  }
  const std::size_t offset = static_cast<std::size_t>(static_cast<const char*>(p) - r->base);
  if (offset + bytes > r->bytes) {
    std::snprintf(buf, sizeof buf,
                  "%s (%p) spans %zu bytes but its allocation (%zu bytes at %p) ends %zu bytes "
                  "after it: the GEMM would read or write past the end",
                  what, p, bytes, r->bytes, static_cast<const void*>(r->base), r->bytes - offset);
    return buf;
  }
  return {};
}

std::string take_scalars(Gemm& g, const void* alpha, const void* beta, bool device_scalars,
                         int device) {
  if (!device_scalars) {
    g.alpha = *static_cast<const float*>(alpha);
    g.beta = *static_cast<const float*>(beta);
    return "";
  }
  for (const void* s : {alpha, beta}) {
    const std::string why =
        check_device_span("alpha/beta (pointer mode device)", s, sizeof(float), device);
    if (!why.empty()) return why;
  }
  g.alpha_device = static_cast<const float*>(alpha);
  g.beta_device = static_cast<const float*>(beta);
  return "";
}

bool batches_disjoint(long long m, long long n, long long ld, long long stride, long long batch) {
  if (batch <= 1 || m <= 0 || n <= 0) return true;
  if (stride >= (n - 1) * ld + m) return true;
  return stride > 0 && m <= stride && batch * stride <= ld;
}

bool overlap(const void* p, std::size_t a, const void* q, std::size_t b) {
  if (a == 0 || b == 0 || p == nullptr || q == nullptr) return false;
  const auto x = reinterpret_cast<std::uintptr_t>(p);
  const auto y = reinterpret_cast<std::uintptr_t>(q);
  return x < y + b && y < x + a;
}

std::uint32_t alignment_of(const void* p) {
  const std::uintptr_t bits = reinterpret_cast<std::uintptr_t>(p) | 256u;
  return static_cast<std::uint32_t>(bits & (~bits + 1));
}

cublasStatus_t refuse(cublasStatus_t status, const char* call, const std::string& why) {
  const std::string line =
      std::string("cuda emulation: ") + call + ": " + why + " (" + status_name(status) + ")\n";
  std::fputs(line.c_str(), stderr);
  return status;
}

const char* status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* status_string(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "the functionality requested requires some license";
  }
  return "unknown error";
}

std::string describe(const char* call, const Gemm& g) {
  const char* epi =
      g.bgrad_a    ? " epilogue BGRADA"
      : g.bgrad_b  ? " epilogue BGRADB"
      : g.dgelu    ? " epilogue DGELU"
      : g.gelu     ? (g.aux_out ? (g.bias_add ? " epilogue GELU_AUX_BIAS" : " epilogue GELU_AUX")
                                : (g.bias_add ? " epilogue GELU_BIAS" : " epilogue GELU"))
      : g.bias_add ? " epilogue BIAS"
                   : "";
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s %s x %s -> %s %c%c m=%lld n=%lld k=%lld batch=%lld lda=%lld ldb=%lld "
                "ldc=%lld ldd=%lld%s, %s",
                call, elem_name(g.a.type), elem_name(g.b.type), elem_name(g.d_type),
                g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', static_cast<long long>(g.m),
                static_cast<long long>(g.n), static_cast<long long>(g.k),
                static_cast<long long>(g.batch), static_cast<long long>(g.a.ld),
                static_cast<long long>(g.b.ld), static_cast<long long>(g.c.ld),
                static_cast<long long>(g.ldd), epi, algo_name(g.algo));
  return buf;
}

void count(const char* call, const Gemm& g) {
  if (!counting()) return;
  const std::uint64_t mk = std::uint64_t(g.m) * g.k, kn = std::uint64_t(g.k) * g.n;
  const std::uint64_t mn = std::uint64_t(g.m) * g.n, batch = std::uint64_t(g.batch);
  std::uint64_t bytes = mk * elem_bytes(g.a.type) + kn * elem_bytes(g.b.type) +
                        mn * elem_bytes(g.d_type);
  if (g.beta != 0.0f || g.beta_device != nullptr) bytes += mn * elem_bytes(g.c.type);
  if (g.aux != nullptr) bytes += mn * elem_bytes(g.aux_type);
  char name[160];
  std::snprintf(name, sizeof name, "%s %s %c%c m=%lld n=%lld k=%lld batch=%lld%s", call,
                elem_name(g.a.type), g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N',
                static_cast<long long>(g.m), static_cast<long long>(g.n),
                static_cast<long long>(g.k), static_cast<long long>(g.batch),
                g.gelu || g.dgelu || g.bias_add || g.bgrad_a || g.bgrad_b ? " +epilogue" : "");
  count_work("gemm", name, 0, 2 * mk * std::uint64_t(g.n) * batch, bytes * batch);
}

}  // namespace cuda_emu::blas
