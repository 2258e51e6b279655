// The emulated cuBLASLt and cuBLAS (emulation/cuda): products against a double-precision
// reference for every transpose combination, odd leading dimensions, strided batches, alpha and
// beta (beta = 0 never reads C, even NaN), bf16 inputs and bf16 output, C == D in place; the
// heuristic's refusals (bf16 with a 2-byte-aligned operand or an ld that is not 16-byte
// compatible, mixed types, ld < rows, ...) and cublasLtMatmul's (an algorithm whose alignment
// the pointers do not meet, host memory, short workspace); the algorithms' bits: each equal
// to a host model of its documented summation order, the same run to run, different from each
// other; the wide algorithm (2) that 128-byte alignment preferences choose and 16-byte ones
// exclude; the epilogues; the cublasGemmEx fallback. Needs gtest and the emulation runtime only.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------------
// Host helpers.

std::uint16_t bf16_of(float x) {  // round to nearest even (finite inputs only here)
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float float_of(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// One rounding each, whatever the compiler's contraction settings.
float mul(float a, float b) {
  volatile float p = a * b;
  return p;
}
float add(float a, float b) {
  volatile float s = a + b;
  return s;
}

std::size_t type_bytes(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

// Device memory with room for an offset (to misalign on purpose), freed at scope exit.
struct DeviceMem {
  char* base = nullptr;
  std::size_t bytes = 0;
  explicit DeviceMem(std::size_t n) : bytes(n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n == 0 ? 1 : n), cudaSuccess);
    base = static_cast<char*>(p);
  }
  ~DeviceMem() { cudaFree(base); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
};

// A column-major operand on the host (its whole buffer, padding included, as floats already
// representable in its type) and on the device at `offset` elements into its allocation.
struct Operand {
  cudaDataType type = CUDA_R_32F;
  std::vector<float> host;
  std::size_t offset = 0;
  std::unique_ptr<DeviceMem> mem;

  void* ptr() const { return mem->base + offset * type_bytes(type); }
  void upload() {
    if (!mem) mem = std::make_unique<DeviceMem>((host.size() + offset) * type_bytes(type) + 64);
    if (type == CUDA_R_16BF) {
      std::vector<std::uint16_t> h(host.size());
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = bf16_of(host[i]);
      ASSERT_EQ(cudaMemcpy(ptr(), h.data(), h.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      ASSERT_EQ(cudaMemcpy(ptr(), host.data(), host.size() * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  std::vector<float> download() const {
    std::vector<float> out(host.size());
    if (type == CUDA_R_16BF) {
      std::vector<std::uint16_t> h(host.size());
      EXPECT_EQ(cudaMemcpy(h.data(), ptr(), h.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (std::size_t i = 0; i < h.size(); ++i) out[i] = float_of(h[i]);
    } else {
      EXPECT_EQ(cudaMemcpy(out.data(), ptr(), out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }
};

void fill_random(Operand& o, std::size_t n, std::mt19937& rng, bool wide_range = false) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-6, 6);
  o.host.resize(n);
  for (float& x : o.host) {
    float v = u(rng);
    if (wide_range) v = std::ldexp(v, e(rng));
    x = o.type == CUDA_R_16BF ? float_of(bf16_of(v)) : v;
  }
}

// A GEMM's shape, column-major, cuBLAS's names: op(A) m x k, op(B) k x n, C and D m x n.
struct Spec {
  bool ta = false, tb = false;
  std::int64_t m = 1, n = 1, k = 1;
  int batch = 1;
  std::int64_t lda = 0, ldb = 0, ldc = 0;  // 0: the tight value
  std::int64_t sa = 0, sb = 0, sc = 0;     // 0: the tight value
  cudaDataType ab = CUDA_R_32F, cd = CUDA_R_32F;

  std::int64_t a_rows() const { return ta ? k : m; }
  std::int64_t a_cols() const { return ta ? m : k; }
  std::int64_t b_rows() const { return tb ? n : k; }
  std::int64_t b_cols() const { return tb ? k : n; }
  Spec& done() {
    if (lda == 0) lda = a_rows();
    if (ldb == 0) ldb = b_rows();
    if (ldc == 0) ldc = m;
    if (sa == 0) sa = lda * a_cols();
    if (sb == 0) sb = ldb * b_cols();
    if (sc == 0) sc = ldc * n;
    return *this;
  }
  std::size_t a_elems() const {
    return static_cast<std::size_t>((batch - 1) * sa + lda * a_cols());
  }
  std::size_t b_elems() const {
    return static_cast<std::size_t>((batch - 1) * sb + ldb * b_cols());
  }
  std::size_t c_elems() const { return static_cast<std::size_t>((batch - 1) * sc + ldc * n); }
  float a(const std::vector<float>& A, int b, std::int64_t i, std::int64_t p) const {
    return A[static_cast<std::size_t>(b * sa + (ta ? p + i * lda : i + p * lda))];
  }
  float bm(const std::vector<float>& B, int b, std::int64_t p, std::int64_t j) const {
    return B[static_cast<std::size_t>(b * sb + (tb ? j + p * ldb : p + j * ldb))];
  }
  std::size_t c_at(int b, std::int64_t i, std::int64_t j) const {
    return static_cast<std::size_t>(b * sc + i + j * ldc);
  }
};

// D = alpha op(A) op(B) + beta C in double, and a bound on fp32's error for each element.
void reference(const Spec& s, const std::vector<float>& A, const std::vector<float>& B,
               const std::vector<float>& C, float alpha, float beta, std::vector<double>& ref,
               std::vector<double>& tol) {
  ref.assign(s.c_elems(), 0.0);
  tol.assign(s.c_elems(), 0.0);
  for (int b = 0; b < s.batch; ++b)
    for (std::int64_t j = 0; j < s.n; ++j)
      for (std::int64_t i = 0; i < s.m; ++i) {
        double sum = 0.0, mag = 0.0;
        for (std::int64_t p = 0; p < s.k; ++p) {
          const double x = static_cast<double>(s.a(A, b, i, p)) * s.bm(B, b, p, j);
          sum += x;
          mag += std::fabs(x);
        }
        const std::size_t c = s.c_at(b, i, j);
        const double cv = beta != 0.0f ? static_cast<double>(C[c]) : 0.0;
        ref[c] = alpha * sum + beta * cv;
        tol[c] = (std::fabs(alpha) * mag + std::fabs(beta * cv)) * (s.k + 3) * 0x1p-24 + 1e-30;
      }
}

// The bits each algorithm documents (gemm_emulated.hpp), computed on the host.
enum class Order { in_order, four_lanes, eight_lanes };
float model_dot(const Spec& s, const std::vector<float>& A, const std::vector<float>& B, int b,
                std::int64_t i, std::int64_t j, Order order) {
  if (order == Order::in_order) {
    float acc = 0.0f;
    for (std::int64_t p = 0; p < s.k; ++p) acc = add(acc, mul(s.a(A, b, i, p), s.bm(B, b, p, j)));
    return acc;
  }
  if (order == Order::four_lanes) {
    float lane[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (std::int64_t p = 0; p < s.k; ++p)
      lane[p & 3] = add(lane[p & 3], mul(s.a(A, b, i, p), s.bm(B, b, p, j)));
    return add(add(lane[0], lane[1]), add(lane[2], lane[3]));
  }
  float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (std::int64_t p = 0; p < s.k; ++p)
    lane[p & 7] = add(lane[p & 7], mul(s.a(A, b, i, p), s.bm(B, b, p, j)));
  return add(add(add(lane[0], lane[1]), add(lane[2], lane[3])),
             add(add(lane[4], lane[5]), add(lane[6], lane[7])));
}

std::vector<float> model(const Spec& s, const std::vector<float>& A, const std::vector<float>& B,
                         const std::vector<float>& C, float alpha, float beta, Order order) {
  std::vector<float> D = C;
  for (int b = 0; b < s.batch; ++b)
    for (std::int64_t j = 0; j < s.n; ++j)
      for (std::int64_t i = 0; i < s.m; ++i) {
        const std::size_t c = s.c_at(b, i, j);
        float t = alpha != 0.0f ? mul(alpha, model_dot(s, A, B, b, i, j, order)) : 0.0f;
        if (beta != 0.0f) t = add(t, mul(beta, C[c]));
        D[c] = t;
      }
  return D;
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt objects.

struct Lt {
  cublasLtHandle_t h = nullptr;
  Lt() { EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS); }
  ~Lt() { cublasLtDestroy(h); }
};

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  Layout(cudaDataType t, std::int64_t rows, std::int64_t cols, std::int64_t ld, int batch = 1,
         std::int64_t stride = 0) {
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, t, static_cast<std::uint64_t>(rows),
                                         static_cast<std::uint64_t>(cols), ld),
              CUBLAS_STATUS_SUCCESS);
    if (batch > 1) {
      const std::int32_t count = batch;
      EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                 sizeof count),
                CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                 &stride, sizeof stride),
                CUBLAS_STATUS_SUCCESS);
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(l); }
};

struct Desc {
  cublasLtMatmulDesc_t d = nullptr;
  explicit Desc(bool ta = false, bool tb = false, cublasComputeType_t ct = CUBLAS_COMPUTE_32F) {
    EXPECT_EQ(cublasLtMatmulDescCreate(&d, ct, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &a, sizeof a),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &b, sizeof b),
              CUBLAS_STATUS_SUCCESS);
  }
  ~Desc() { cublasLtMatmulDescDestroy(d); }
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, T v) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v), CUBLAS_STATUS_SUCCESS);
  }
};

struct Pref {
  cublasLtMatmulPreference_t p = nullptr;
  Pref(std::uint64_t workspace, std::uint32_t align_a = 256, std::uint32_t align_b = 256,
       std::uint32_t align_c = 256, std::uint32_t align_d = 256) {
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&p), CUBLAS_STATUS_SUCCESS);
    set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
    set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
  }
  ~Pref() { cublasLtMatmulPreferenceDestroy(p); }
  template <class T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, T v) {
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof v), CUBLAS_STATUS_SUCCESS);
  }
};

std::uint32_t alignment(const void* p) {
  const std::uintptr_t b = reinterpret_cast<std::uintptr_t>(p) | 256u;
  return static_cast<std::uint32_t>(b & (~b + 1));
}

int algo_id(const cublasLtMatmulAlgo_t& algo) {
  std::int32_t id = -1;
  std::size_t written = 0;
  EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id,
                                                 &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof id);
  return id;
}

// One GEMM of a Spec through cuBLASLt: descriptors, operands, the heuristic and the call.
struct LtGemm {
  Spec s;
  Lt lt;
  Desc desc;
  Layout la, lb, lc;
  Operand A, B, C;

  explicit LtGemm(Spec spec, std::uint32_t seed = 1, std::size_t off_a = 0, std::size_t off_b = 0,
                  std::size_t off_c = 0)
      : s(spec.done()),
        desc(s.ta, s.tb),
        la(s.ab, s.a_rows(), s.a_cols(), s.lda, s.batch, s.sa),
        lb(s.ab, s.b_rows(), s.b_cols(), s.ldb, s.batch, s.sb),
        lc(s.cd, s.m, s.n, s.ldc, s.batch, s.sc) {
    std::mt19937 rng(seed);
    A.type = B.type = s.ab;
    C.type = s.cd;
    A.offset = off_a;
    B.offset = off_b;
    C.offset = off_c;
    fill_random(A, s.a_elems(), rng);
    fill_random(B, s.b_elems(), rng);
    fill_random(C, s.c_elems(), rng);
    A.upload();
    B.upload();
    C.upload();
  }

  // The heuristic with the pointers' own alignments (as pdtrain asks it).
  cublasStatus_t heuristic(std::vector<cublasLtMatmulHeuristicResult_t>& out, std::uint64_t ws = 0,
                           int requested = 4) {
    Pref pref(ws, alignment(A.ptr()), alignment(B.ptr()), alignment(C.ptr()), alignment(C.ptr()));
    out.assign(static_cast<std::size_t>(requested), cublasLtMatmulHeuristicResult_t{});
    int found = -1;
    const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(lt.h, desc.d, la.l, lb.l, lc.l, lc.l,
                                                             pref.p, requested, out.data(), &found);
    out.resize(found > 0 ? static_cast<std::size_t>(found) : 0);
    return rc;
  }

  // D = C in place.
  cublasStatus_t run(const cublasLtMatmulAlgo_t* algo, float alpha, float beta, void* ws = nullptr,
                     std::size_t ws_bytes = 0, cudaStream_t stream = nullptr) {
    return cublasLtMatmul(lt.h, desc.d, &alpha, A.ptr(), la.l, B.ptr(), lb.l, &beta, C.ptr(), lc.l,
                          C.ptr(), lc.l, algo, ws, ws_bytes, stream);
  }
};

void expect_near_reference(const Spec& s, const std::vector<float>& got,
                           const std::vector<double>& ref, const std::vector<double>& tol,
                           double extra_rel = 0.0) {
  int bad = 0;
  for (int b = 0; b < s.batch; ++b)
    for (std::int64_t j = 0; j < s.n; ++j)
      for (std::int64_t i = 0; i < s.m; ++i) {
        const std::size_t c = s.c_at(b, i, j);
        const double t = tol[c] + extra_rel * std::fabs(ref[c]);
        if (!(std::fabs(got[c] - ref[c]) <= t) && bad++ < 5) {
          ADD_FAILURE() << "batch " << b << " (" << i << ", " << j << "): " << got[c] << " vs "
                        << ref[c] << " (tolerance " << t << ")";
        }
      }
  EXPECT_EQ(bad, 0);
}

class CublasLtEmulation : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(cudaSetDevice(0), cudaSuccess); }
};

// ---------------------------------------------------------------------------------------------

TEST_F(CublasLtEmulation, VersionAndStatusStrings) {
  const std::size_t v = cublasLtGetVersion();
  EXPECT_GE(v, 110000u);
  EXPECT_EQ(v, static_cast<std::size_t>(CUBLAS_VERSION));
  EXPECT_STRNE(cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED), "");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED),
               cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED));
}

TEST_F(CublasLtEmulation, EveryTransposeBothAlgorithmsAgainstDouble) {
  for (int t = 0; t < 4; ++t) {
    for (bool odd_ld : {false, true}) {
      Spec s;
      s.ta = t & 1;
      s.tb = t & 2;
      s.m = 37;
      s.n = 29;
      s.k = 53;
      // 16-byte compatible leading dimensions (both algorithms), or odd ones (generic only).
      s.lda = odd_ld ? s.a_rows() + 2 : (s.a_rows() + 3) / 4 * 4 + 4;
      s.ldb = odd_ld ? s.b_rows() + 1 : (s.b_rows() + 3) / 4 * 4;
      s.ldc = odd_ld ? s.m + 2 : (s.m + 3) / 4 * 4;
      LtGemm g(s, 10 + t);
      std::vector<cublasLtMatmulHeuristicResult_t> algos;
      ASSERT_EQ(g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(algos.size(), odd_ld ? 1u : 2u) << "transpose case " << t;
      if (odd_ld) {
        EXPECT_EQ(algo_id(algos[0].algo), 1);
      } else {
        EXPECT_EQ(algo_id(algos[0].algo), 0);
        EXPECT_EQ(algo_id(algos[1].algo), 1);
      }
      std::vector<double> ref, tol;
      reference(g.s, g.A.host, g.B.host, g.C.host, 1.0f, 0.0f, ref, tol);
      for (const auto& r : algos) {
        g.C.upload();
        ASSERT_EQ(g.run(&r.algo, 1.0f, 0.0f), CUBLAS_STATUS_SUCCESS);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> got = g.C.download();
        expect_near_reference(g.s, got, ref, tol);
        // The padding between columns of D is never written.
        for (std::int64_t j = 0; j < g.s.n; ++j)
          for (std::int64_t i = g.s.m; i < g.s.ldc && j + 1 < g.s.n; ++i)
            EXPECT_EQ(bits(got[g.s.c_at(0, i, j)]), bits(g.C.host[g.s.c_at(0, i, j)]));
      }
    }
  }
}

TEST_F(CublasLtEmulation, StridedBatches) {
  Spec s;
  s.ta = true;
  s.m = 20;
  s.n = 12;
  s.k = 33;
  s.batch = 3;
  s.lda = 36;
  s.ldb = 36;
  s.ldc = 24;
  s.sa = 36 * 20 + 8;  // padded batches
  s.sb = 36 * 12 + 4;
  s.sc = 24 * 12 + 16;
  LtGemm g(s, 3);
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  ASSERT_EQ(g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(algos.size(), 2u);
  std::vector<double> ref, tol;
  reference(g.s, g.A.host, g.B.host, g.C.host, 1.5f, 0.0f, ref, tol);
  for (const auto& r : algos) {
    g.C.upload();
    ASSERT_EQ(g.run(&r.algo, 1.5f, 0.0f), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = g.C.download();
    expect_near_reference(g.s, got, ref, tol);
    // The gap between batches is untouched.
    for (std::int64_t e = 24 * 12; e < s.sc; ++e) EXPECT_EQ(bits(got[e]), bits(g.C.host[e]));
  }
  // A batch stride of 5 floats is not 16-byte compatible: only the generic algorithm.
  Spec odd = s;
  odd.sa = 36 * 20 + 5;
  LtGemm h(odd, 4);
  ASSERT_EQ(h.heuristic(algos), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(algos.size(), 1u);
  EXPECT_EQ(algo_id(algos[0].algo), 1);
}

TEST_F(CublasLtEmulation, AlphaBetaAndBetaZeroNeverReadsNaN) {
  Spec s;
  s.m = 16;
  s.n = 8;
  s.k = 24;
  LtGemm g(s, 5);
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  ASSERT_EQ(g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
  for (const auto& r : algos) {
    // beta = 0 with NaN in C: C is not read.
    std::vector<float> saved = g.C.host;
    std::fill(g.C.host.begin(), g.C.host.end(), std::numeric_limits<float>::quiet_NaN());
    g.C.upload();
    ASSERT_EQ(g.run(&r.algo, 0.5f, 0.0f), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got = g.C.download();
    std::vector<double> ref, tol;
    reference(g.s, g.A.host, g.B.host, g.C.host, 0.5f, 0.0f, ref, tol);
    expect_near_reference(g.s, got, ref, tol);
    // alpha and beta both in play, in place.
    g.C.host = saved;
    g.C.upload();
    ASSERT_EQ(g.run(&r.algo, 0.5f, -0.75f), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    got = g.C.download();
    reference(g.s, g.A.host, g.B.host, g.C.host, 0.5f, -0.75f, ref, tol);
    expect_near_reference(g.s, got, ref, tol);
    // alpha = 0: D = beta C exactly (A and B not needed).
    g.C.upload();
    ASSERT_EQ(g.run(&r.algo, 0.0f, 2.0f), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    got = g.C.download();
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], 2.0f * g.C.host[i]);
  }
}

TEST_F(CublasLtEmulation, OutOfPlaceKeepsCAndDMayHaveItsOwnLd) {
  Spec s;
  s.m = 12;
  s.n = 9;
  s.k = 7;
  s.ldb = 8;
  s.ldc = 16;
  LtGemm g(s, 6);
  Layout ld(CUDA_R_32F, s.m, s.n, 20);
  Operand D;
  D.host.assign(20 * 9, -3.0f);
  D.upload();
  std::vector<cublasLtMatmulHeuristicResult_t> algos(2);
  Pref pref(0);
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(g.lt.h, g.desc.d, g.la.l, g.lb.l, g.lc.l, ld.l, pref.p,
                                           2, algos.data(), &found),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 2);
  for (int a = 0; a < found; ++a) {
    const float alpha = 1.0f, beta = 1.0f;
    ASSERT_EQ(cublasLtMatmul(g.lt.h, g.desc.d, &alpha, g.A.ptr(), g.la.l, g.B.ptr(), g.lb.l, &beta,
                             g.C.ptr(), g.lc.l, D.ptr(), ld.l, &algos[a].algo, nullptr, 0, nullptr),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(g.C.download(), g.C.host);  // C is not written
    const std::vector<float> got = D.download();
    for (std::int64_t j = 0; j < s.n; ++j)
      for (std::int64_t i = 0; i < s.m; ++i) {
        double ref = g.C.host[static_cast<std::size_t>(i + j * 16)], mag = std::fabs(ref);
        for (std::int64_t p = 0; p < s.k; ++p) {
          const double x =
              static_cast<double>(g.s.a(g.A.host, 0, i, p)) * g.s.bm(g.B.host, 0, p, j);
          ref += x;
          mag += std::fabs(x);
        }
        EXPECT_NEAR(got[static_cast<std::size_t>(i + j * 20)], ref, mag * 1e-6 + 1e-30);
      }
    for (std::int64_t j = 0; j + 1 < s.n; ++j)  // D's padding rows stay
      for (std::int64_t i = s.m; i < 20; ++i)
        EXPECT_EQ(got[static_cast<std::size_t>(i + j * 20)], -3.0f);
  }
}

TEST_F(CublasLtEmulation, InPlaceAccumulates) {
  Spec s;
  s.tb = true;
  s.m = 8;
  s.n = 12;
  s.k = 40;
  s.ldb = 12;
  LtGemm g(s, 7);
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  ASSERT_EQ(g.heuristic(algos, 0, 1), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(algos.size(), 1u);
  ASSERT_EQ(g.run(&algos[0].algo, 1.0f, 1.0f), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> ref, tol;
  reference(g.s, g.A.host, g.B.host, g.C.host, 1.0f, 1.0f, ref, tol);
  expect_near_reference(g.s, g.C.download(), ref, tol);
  // The bits too: the aligned algorithm's documented order.
  const std::vector<float> want =
      model(g.s, g.A.host, g.B.host, g.C.host, 1.0f, 1.0f, Order::four_lanes);
  const std::vector<float> got = g.C.download();
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << i;
}

TEST_F(CublasLtEmulation, Bf16InputsWithFp32AndBf16Output) {
  for (cudaDataType out : {CUDA_R_32F, CUDA_R_16BF}) {
    Spec s;
    s.ta = true;
    s.ab = CUDA_R_16BF;
    s.cd = out;
    s.m = 24;
    s.n = 16;
    s.k = 45;
    s.lda = 48;  // 96 bytes
    s.ldb = 48;
    s.ldc = 24;
    LtGemm g(s, 8);
    std::vector<cublasLtMatmulHeuristicResult_t> algos;
    ASSERT_EQ(g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(algos.size(), 1u);  // bf16: the aligned algorithm only
    EXPECT_EQ(algo_id(algos[0].algo), 0);
    ASSERT_EQ(g.run(&algos[0].algo, 1.0f, 0.5f), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<double> ref, tol;
    reference(g.s, g.A.host, g.B.host, g.C.host, 1.0f, 0.5f, ref, tol);
    const std::vector<float> got = g.C.download();
    expect_near_reference(g.s, got, ref, tol, out == CUDA_R_16BF ? 0x1p-8 : 0.0);
    // Exactly the fp32 sum in the documented order, rounded to the output type.
    std::vector<float> want =
        model(g.s, g.A.host, g.B.host, g.C.host, 1.0f, 0.5f, Order::four_lanes);
    for (int b = 0; b < g.s.batch; ++b)
      for (std::int64_t j = 0; j < s.n; ++j)
        for (std::int64_t i = 0; i < s.m; ++i) {
          const std::size_t c = g.s.c_at(b, i, j);
          const float w = out == CUDA_R_16BF ? float_of(bf16_of(want[c])) : want[c];
          ASSERT_EQ(bits(got[c]), bits(w)) << i << ", " << j;
        }
  }
}

TEST_F(CublasLtEmulation, HeuristicRefusesWhatItShould) {
  Lt lt;
  std::vector<cublasLtMatmulHeuristicResult_t> r(4);
  int found = -1;
  auto ask = [&](cudaDataType ab, cudaDataType c, cudaDataType d, std::int64_t lda,
                 const Pref& pref, cublasComputeType_t ct = CUBLAS_COMPUTE_32F, int b_type = -1,
                 int requested = 4) {
    Desc desc(false, false, ct);
    Layout la(ab, 32, 16, lda), lb(b_type < 0 ? ab : static_cast<cudaDataType>(b_type), 16, 8, 16);
    Layout lc(c, 32, 8, 32), ldd(d, 32, 8, 32);
    found = -1;
    return cublasLtMatmulAlgoGetHeuristic(lt.h, desc.d, la.l, lb.l, lc.l, ldd.l, pref.p, requested,
                                          r.data(), &found);
  };
  const Pref aligned(0);
  // fp32: both algorithms at 16-byte alignment, the generic one alone at 4, none at 2.
  ASSERT_EQ(ask(CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 32, aligned), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 2);
  ASSERT_EQ(ask(CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 32, Pref(0, 4)), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  EXPECT_EQ(algo_id(r[0].algo), 1);
  EXPECT_EQ(ask(CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 32, Pref(0, 256, 256, 2, 256)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(found, 0);
  // bf16 inputs: the aligned algorithm or nothing (2- or 8-byte operands, an ld of 74 bytes).
  ASSERT_EQ(ask(CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F, 32, aligned), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  EXPECT_EQ(algo_id(r[0].algo), 0);
  EXPECT_EQ(ask(CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F, 32, Pref(0, 2)), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(found, 0);
  EXPECT_EQ(ask(CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F, 32, Pref(0, 256, 8)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(ask(CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 37, aligned), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(found, 0);
  EXPECT_EQ(ask(CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 40, aligned), CUBLAS_STATUS_SUCCESS);
  // Types outside the datatype table: fp32 A with bf16 B, fp32 inputs with bf16 output.
  EXPECT_EQ(ask(CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 32, aligned, CUBLAS_COMPUTE_32F, CUDA_R_16BF),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(ask(CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, 32, aligned), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(ask(CUDA_R_16F, CUDA_R_16F, CUDA_R_16F, 32, aligned), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(ask(CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 32, aligned, CUBLAS_COMPUTE_32F_FAST_TF32),
            CUBLAS_STATUS_NOT_SUPPORTED);
  // C and D of different types conflict; ld < rows; no room for results.
  EXPECT_EQ(ask(CUDA_R_16BF, CUDA_R_32F, CUDA_R_16BF, 32, aligned), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(ask(CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 31, aligned), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(ask(CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 32, aligned, CUBLAS_COMPUTE_32F, -1, 0),
            CUBLAS_STATUS_INVALID_VALUE);
  // Shapes that do not chain (op(A) 32 x 16, op(B) 17 x 8).
  {
    Desc desc;
    Layout la(CUDA_R_32F, 32, 16, 32), lb(CUDA_R_32F, 17, 8, 20), lc(CUDA_R_32F, 32, 8, 32);
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, desc.d, la.l, lb.l, lc.l, lc.l, aligned.p, 1,
                                             r.data(), &found),
              CUBLAS_STATUS_INVALID_VALUE);
  }
  // Row-major order is not emulated.
  {
    Desc desc;
    Layout la(CUDA_R_32F, 32, 16, 32), lb(CUDA_R_32F, 16, 8, 16), lc(CUDA_R_32F, 32, 8, 32);
    const std::int32_t row = CUBLASLT_ORDER_ROW;
    ASSERT_EQ(
        cublasLtMatrixLayoutSetAttribute(la.l, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row),
        CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, desc.d, la.l, lb.l, lc.l, lc.l, aligned.p, 1,
                                             r.data(), &found),
              CUBLAS_STATUS_NOT_SUPPORTED);
  }
  // Algorithm ids: bf16 has the aligned and the wide one (no generic), fp32 all three.
  int ids[4] = {-1, -1, -1, -1};
  ASSERT_EQ(cublasLtMatmulAlgoGetIds(lt.h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                                     CUDA_R_32F, CUDA_R_32F, 4, ids, &found),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 2);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 2);
  ASSERT_EQ(cublasLtMatmulAlgoGetIds(lt.h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                                     CUDA_R_32F, CUDA_R_32F, 4, ids, &found),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 3);
  cublasLtMatmulAlgo_t algo;
  EXPECT_EQ(cublasLtMatmulAlgoInit(lt.h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                                   CUDA_R_32F, CUDA_R_32F, 1, &algo),
            CUBLAS_STATUS_NOT_SUPPORTED);
  ASSERT_EQ(cublasLtMatmulAlgoInit(lt.h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                                   CUDA_R_32F, CUDA_R_32F, 1, &algo),
            CUBLAS_STATUS_SUCCESS);
  std::uint32_t need = 0;
  ASSERT_EQ(cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, &need,
                                              sizeof need, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(need, 4u);
  ASSERT_EQ(cublasLtMatmulAlgoInit(lt.h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                                   CUDA_R_32F, CUDA_R_32F, 2, &algo),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, &need,
                                              sizeof need, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(need, 128u);
  EXPECT_EQ(cublasLtMatmulAlgoInit(lt.h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                                   CUDA_R_32F, CUDA_R_32F, 3, &algo),
            CUBLAS_STATUS_INVALID_VALUE);
}

TEST_F(CublasLtEmulation, MatmulRefusesWithoutQueueing) {
  Spec s;
  s.m = 16;
  s.n = 8;
  s.k = 24;
  LtGemm g(s, 9, 4);  // A 16-byte aligned at offset 4 floats
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  ASSERT_EQ(g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(algos.size(), 2u);
  const cublasLtMatmulAlgo_t aligned = algos[0].algo, generic = algos[1].algo;
  const float alpha = 1.0f, beta = 0.0f;
  auto call = [&](const void* A, const void* B, void* D, const cublasLtMatmulAlgo_t* algo,
                  cublasLtMatrixLayout_t cdesc = nullptr, const float* a = nullptr) {
    return cublasLtMatmul(g.lt.h, g.desc.d, a != nullptr ? a : &alpha, A, g.la.l, B, g.lb.l, &beta,
                          D, cdesc != nullptr ? cdesc : g.lc.l, D, g.lc.l, algo, nullptr, 0,
                          nullptr);
  };
  const char* a4 =
      static_cast<const char*>(g.A.ptr()) - 4;  // 4-byte aligned, inside the allocation
  // The aligned algorithm on a 4-byte aligned A: not supported; the generic one runs it.
  EXPECT_EQ(call(a4, g.B.ptr(), g.C.ptr(), &aligned), CUBLAS_STATUS_NOT_SUPPORTED);
  // Host memory where a GPU would fault.
  std::vector<float> host_a(g.A.host);
  EXPECT_EQ(call(host_a.data(), g.B.ptr(), g.C.ptr(), &generic), CUBLAS_STATUS_INVALID_VALUE);
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, g.B.host.size() * 4 + 256), cudaSuccess);
  EXPECT_EQ(call(g.A.ptr(), pinned, g.C.ptr(), &generic), CUBLAS_STATUS_INVALID_VALUE);
  cudaFreeHost(pinned);
  // D's layout larger than its allocation.
  DeviceMem small(64);
  EXPECT_EQ(call(g.A.ptr(), g.B.ptr(), small.base, &generic), CUBLAS_STATUS_INVALID_VALUE);
  // An algorithm made for other types, and one never made.
  cublasLtMatmulAlgo_t bf16_algo, zero{};
  ASSERT_EQ(cublasLtMatmulAlgoInit(g.lt.h, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                                   CUDA_R_32F, CUDA_R_32F, 0, &bf16_algo),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(call(g.A.ptr(), g.B.ptr(), g.C.ptr(), &bf16_algo), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(g.A.ptr(), g.B.ptr(), g.C.ptr(), &zero), CUBLAS_STATUS_INVALID_VALUE);
  // C == D with another layout than D's.
  Layout other(CUDA_R_32F, s.m, s.n, s.m + 4);
  EXPECT_EQ(cublasLtMatmul(g.lt.h, g.desc.d, &alpha, g.A.ptr(), g.la.l, g.B.ptr(), g.lb.l, &alpha,
                           g.C.ptr(), other.l, g.C.ptr(), g.lc.l, &generic, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  // D overlapping A.
  EXPECT_EQ(call(g.A.ptr(), g.B.ptr(), g.A.ptr(), &generic), CUBLAS_STATUS_INVALID_VALUE);
  // Null alpha, and a null handle.
  EXPECT_EQ(cublasLtMatmul(g.lt.h, g.desc.d, nullptr, g.A.ptr(), g.la.l, g.B.ptr(), g.lb.l, &beta,
                           g.C.ptr(), g.lc.l, g.C.ptr(), g.lc.l, &generic, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmul(nullptr, g.desc.d, &alpha, g.A.ptr(), g.la.l, g.B.ptr(), g.lb.l, &beta,
                           g.C.ptr(), g.lc.l, g.C.ptr(), g.lc.l, &generic, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_INITIALIZED);
  // Nothing was queued: D (C) still holds what was uploaded.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(g.C.download(), g.C.host);
  EXPECT_EQ(g.A.download(), g.A.host);
  // The generic algorithm does run with the 4-byte aligned A.
  EXPECT_EQ(call(a4, g.B.ptr(), g.C.ptr(), &generic), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Inputs whose sums round differently in different orders.
void refill_wide(LtGemm& g, std::uint32_t seed) {
  std::mt19937 rng(seed);
  fill_random(g.A, g.A.host.size(), rng, true);
  fill_random(g.B, g.B.host.size(), rng, true);
  g.A.upload();
  g.B.upload();
}

TEST_F(CublasLtEmulation, AlgorithmsDifferInBitsAndEachIsReproducible) {
  Spec s;
  s.m = 33;
  s.n = 17;
  s.k = 257;
  s.lda = 36;
  s.ldb = 260;
  s.ldc = 36;
  LtGemm g(s, 11);
  refill_wide(g, 12);
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  ASSERT_EQ(g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(algos.size(), 2u);
  std::vector<std::vector<float>> results;
  for (int a = 0; a < 2; ++a) {
    for (int rep = 0; rep < 2; ++rep) {
      g.C.upload();
      ASSERT_EQ(g.run(&algos[static_cast<std::size_t>(a)].algo, 0.75f, 0.25f),
                CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      results.push_back(g.C.download());
    }
  }
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4), 0);
  EXPECT_EQ(std::memcmp(results[2].data(), results[3].data(), results[2].size() * 4), 0);
  int differ = 0;
  for (std::size_t i = 0; i < results[0].size(); ++i)
    differ += bits(results[0][i]) != bits(results[2][i]);
  EXPECT_GT(differ, 20) << "the two algorithms should round differently on these inputs";
  // Each is its documented summation order, bit for bit.
  const std::vector<float> lanes =
      model(g.s, g.A.host, g.B.host, g.C.host, 0.75f, 0.25f, Order::four_lanes);
  const std::vector<float> in_order =
      model(g.s, g.A.host, g.B.host, g.C.host, 0.75f, 0.25f, Order::in_order);
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    ASSERT_EQ(bits(results[0][i]), bits(lanes[i])) << "algorithm 0, element " << i;
    ASSERT_EQ(bits(results[2][i]), bits(in_order[i])) << "algorithm 1, element " << i;
  }
  // Both stay close to the exact product.
  std::vector<double> ref, tol;
  reference(g.s, g.A.host, g.B.host, g.C.host, 0.75f, 0.25f, ref, tol);
  expect_near_reference(g.s, results[0], ref, tol);
  expect_near_reference(g.s, results[2], ref, tol);
  // The implicit heuristic (algo == NULL) picks the aligned algorithm for these pointers.
  g.C.upload();
  ASSERT_EQ(g.run(nullptr, 0.75f, 0.25f), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(g.C.download(), results[0]);
}

// The wide algorithm (2): the heuristic's first choice for 128-byte compatible operands under the
// default 256-byte alignment preferences, excluded by 16-byte ones (NVIDIA: a smaller
// MIN_ALIGNMENT "will exclude algorithms that can not work with matrix A, which is not as
// strictly aligned as the algorithms need"). So the same shape asked for with different
// alignment preferences gets a different algorithm, and different bits.
TEST_F(CublasLtEmulation, WideAlgorithmDependsOnTheAlignmentPreferences) {
  Spec s;
  s.m = 40;
  s.n = 19;
  s.k = 259;
  s.lda = 64;   // 256 bytes
  s.ldb = 288;  // 1152 bytes
  s.ldc = 64;
  LtGemm g(s, 21);
  refill_wide(g, 22);
  ASSERT_EQ(alignment(g.A.ptr()), 256u);  // cudaMalloc's alignment
  ASSERT_EQ(alignment(g.B.ptr()), 256u);
  ASSERT_EQ(alignment(g.C.ptr()), 256u);
  auto ask = [&](cublasLtMatmulPreference_t pref, int requested,
                 std::vector<cublasLtMatmulHeuristicResult_t>& out) {
    out.assign(4, cublasLtMatmulHeuristicResult_t{});
    int found = -1;
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(g.lt.h, g.desc.d, g.la.l, g.lb.l, g.lc.l, g.lc.l, pref,
                                             requested, out.data(), &found),
              CUBLAS_STATUS_SUCCESS);
    out.resize(found > 0 ? static_cast<std::size_t>(found) : 0);
  };
  std::vector<cublasLtMatmulHeuristicResult_t> r;
  // A preference left at its defaults (MIN_ALIGNMENT 256 for A, B, C, D): wide, aligned, generic.
  cublasLtMatmulPreference_t fresh = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&fresh), CUBLAS_STATUS_SUCCESS);
  ask(fresh, 4, r);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(algo_id(r[0].algo), 2);
  EXPECT_EQ(algo_id(r[1].algo), 0);
  EXPECT_EQ(algo_id(r[2].algo), 1);
  ask(fresh, 1, r);  // requestedAlgoCount respected
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(algo_id(r[0].algo), 2);
  cublasLtMatmulPreferenceDestroy(fresh);
  const cublasLtMatmulAlgo_t wide = r[0].algo;
  // 128-byte preferences still allow it; 16-byte ones exclude it (the aligned one first), even
  // for one matrix alone.
  ask(Pref(0, 128, 128, 128, 128).p, 4, r);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(algo_id(r[0].algo), 2);
  ask(Pref(0, 16, 16, 16, 16).p, 4, r);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(algo_id(r[0].algo), 0);
  EXPECT_EQ(algo_id(r[1].algo), 1);
  const cublasLtMatmulAlgo_t vec16 = r[0].algo;
  ask(Pref(0, 256, 256, 256, 64).p, 4, r);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(algo_id(r[0].algo), 0);
  // A leading dimension that is 16- but not 128-byte compatible excludes it too.
  {
    Spec t = s;
    t.lda = 44;  // 176 bytes
    LtGemm h(t, 23);
    ASSERT_EQ(h.heuristic(r), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(algo_id(r[0].algo), 0);
  }

  // cublasLtMatmul with the wide algorithm on an A that is 16- but not 128-byte aligned: not
  // supported, nothing queued. The aligned algorithm runs it.
  const float alpha = 0.75f, beta = 0.25f;
  const void* a16 = static_cast<const char*>(g.A.ptr()) + 16;  // inside the allocation's slack
  ASSERT_EQ(alignment(a16), 16u);
  EXPECT_EQ(cublasLtMatmul(g.lt.h, g.desc.d, &alpha, a16, g.la.l, g.B.ptr(), g.lb.l, &beta,
                           g.C.ptr(), g.lc.l, g.C.ptr(), g.lc.l, &wide, nullptr, 0, nullptr),
            CUBLAS_STATUS_NOT_SUPPORTED);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(g.C.download(), g.C.host);
  // D (in place, C == D) at 16 bytes too.
  {
    Spec t = s;
    LtGemm h(t, 24, 0, 0, 4);  // C 16 bytes past a 256-byte boundary
    ASSERT_EQ(alignment(h.C.ptr()), 16u);
    EXPECT_EQ(h.run(&wide, alpha, beta), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(h.run(&vec16, alpha, beta), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  EXPECT_EQ(cublasLtMatmul(g.lt.h, g.desc.d, &alpha, a16, g.la.l, g.B.ptr(), g.lb.l, &beta,
                           g.C.ptr(), g.lc.l, g.C.ptr(), g.lc.l, &vec16, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // The bits: each algorithm its documented order, the same run to run, wide and aligned
  // different from each other on these inputs.
  std::vector<std::vector<float>> got;
  for (const cublasLtMatmulAlgo_t* algo : {&wide, &wide, &vec16}) {
    g.C.upload();
    ASSERT_EQ(g.run(algo, alpha, beta), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    got.push_back(g.C.download());
  }
  const std::vector<float> eight =
      model(g.s, g.A.host, g.B.host, g.C.host, alpha, beta, Order::eight_lanes);
  const std::vector<float> four =
      model(g.s, g.A.host, g.B.host, g.C.host, alpha, beta, Order::four_lanes);
  int differ = 0;
  for (std::size_t i = 0; i < eight.size(); ++i) {
    ASSERT_EQ(bits(got[0][i]), bits(eight[i])) << "algorithm 2, element " << i;
    ASSERT_EQ(bits(got[1][i]), bits(got[0][i])) << "algorithm 2 again, element " << i;
    ASSERT_EQ(bits(got[2][i]), bits(four[i])) << "algorithm 0, element " << i;
    differ += bits(got[0][i]) != bits(got[2][i]);
  }
  EXPECT_GT(differ, 20) << "the wide and the aligned algorithm should round differently here";
  std::vector<double> ref, tol;
  reference(g.s, g.A.host, g.B.host, g.C.host, alpha, beta, ref, tol);
  expect_near_reference(g.s, got[0], ref, tol);
  // The implicit heuristic (algo == NULL) takes the pointers' 256-byte alignment: wide.
  g.C.upload();
  ASSERT_EQ(g.run(nullptr, alpha, beta), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(g.C.download(), got[0]);

  // bf16 inputs take the wide algorithm as well (its bits: the same order, in fp32).
  {
    Spec t = s;
    t.ab = CUDA_R_16BF;
    t.ldb = 320;  // 640 bytes
    LtGemm h(t, 25);
    ASSERT_EQ(h.heuristic(r), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(algo_id(r[0].algo), 2);
    EXPECT_EQ(algo_id(r[1].algo), 0);
    ASSERT_EQ(h.run(&r[0].algo, 1.0f, 0.0f), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> want =
        model(h.s, h.A.host, h.B.host, h.C.host, 1.0f, 0.0f, Order::eight_lanes);
    const std::vector<float> d = h.C.download();
    for (std::int64_t j = 0; j < t.n; ++j)
      for (std::int64_t i = 0; i < t.m; ++i) {
        const std::size_t c = h.s.c_at(0, i, j);
        ASSERT_EQ(bits(d[c]), bits(want[c])) << i << ", " << j;
      }
  }
}

TEST_F(CublasLtEmulation, WorkRunsInStreamOrderWithScalarsReadAtTheCall) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Spec s;
  s.m = 20;
  s.n = 12;
  s.k = 64;
  LtGemm g(s, 13);
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  ASSERT_EQ(g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
  float alpha = 1.0f, beta = 0.0f;
  ASSERT_EQ(
      cublasLtMatmul(g.lt.h, g.desc.d, &alpha, g.A.ptr(), g.la.l, g.B.ptr(), g.lb.l, &beta,
                     g.C.ptr(), g.lc.l, g.C.ptr(), g.lc.l, &algos[0].algo, nullptr, 0, stream),
      CUBLAS_STATUS_SUCCESS);
  alpha = 1.0f;
  beta = 1.0f;  // D = AB, then D = AB + D = 2 AB: the second runs after the first
  ASSERT_EQ(
      cublasLtMatmul(g.lt.h, g.desc.d, &alpha, g.A.ptr(), g.la.l, g.B.ptr(), g.lb.l, &beta,
                     g.C.ptr(), g.lc.l, g.C.ptr(), g.lc.l, &algos[0].algo, nullptr, 0, stream),
      CUBLAS_STATUS_SUCCESS);
  alpha = 100.0f;  // the calls have read their scalars already
  beta = 100.0f;
  std::vector<float> got(g.C.host.size());
  ASSERT_EQ(cudaMemcpyAsync(got.data(), g.C.ptr(), got.size() * 4, cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<double> ref, tol;
  reference(g.s, g.A.host, g.B.host, g.C.host, 2.0f, 0.0f, ref, tol);
  expect_near_reference(g.s, got, ref, tol);
  // Device pointer mode: alpha and beta read from device memory when the work runs.
  g.desc.set(CUBLASLT_MATMUL_DESC_POINTER_MODE,
             static_cast<std::int32_t>(CUBLASLT_POINTER_MODE_DEVICE));
  DeviceMem scalars(256);
  const float host_scalars[2] = {-0.5f, 0.0f};
  ASSERT_EQ(cudaMemcpy(scalars.base, host_scalars, 8, cudaMemcpyHostToDevice), cudaSuccess);
  const float* dev = reinterpret_cast<const float*>(scalars.base);
  EXPECT_EQ(
      cublasLtMatmul(g.lt.h, g.desc.d, &alpha, g.A.ptr(), g.la.l, g.B.ptr(), g.lb.l, &beta,
                     g.C.ptr(), g.lc.l, g.C.ptr(), g.lc.l, &algos[0].algo, nullptr, 0, stream),
      CUBLAS_STATUS_INVALID_VALUE);  // host scalars in device mode
  ASSERT_EQ(
      cublasLtMatmul(g.lt.h, g.desc.d, dev, g.A.ptr(), g.la.l, g.B.ptr(), g.lb.l, dev + 1,
                     g.C.ptr(), g.lc.l, g.C.ptr(), g.lc.l, &algos[0].algo, nullptr, 0, stream),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  reference(g.s, g.A.host, g.B.host, g.C.host, -0.5f, 0.0f, ref, tol);
  expect_near_reference(g.s, g.C.download(), ref, tol);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// ---------------------------------------------------------------------------------------------
// Epilogues.

double gelu_ref(double x) {
  const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double gelu_grad_ref(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  const double t = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

struct EpilogueCase {
  Spec s;
  LtGemm g;
  Operand bias, aux;
  static Spec spec(cudaDataType ab, cudaDataType cd) {
    Spec s;
    s.ab = ab;
    s.cd = cd;
    s.m = 24;
    s.n = 10;
    s.k = 19;
    s.ldb = 24;
    return s;
  }
  EpilogueCase(cudaDataType ab, cudaDataType cd) : s(spec(ab, cd)), g(s, 21) {
    std::mt19937 rng(22);
    bias.type = aux.type = cd;
    fill_random(bias, 32, rng);
    fill_random(aux, 24 * 10, rng);
    for (float& x : aux.host) x *= 3.0f;  // GELU inputs over its curved range
    if (cd == CUDA_R_16BF)
      for (float& x : aux.host) x = float_of(bf16_of(x));
    bias.upload();
    aux.upload();
  }
  void set(cublasLtEpilogue_t epi, bool with_bias, bool with_aux, std::int64_t aux_ld = 24) {
    g.desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    g.desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER,
               with_bias ? static_cast<const void*>(bias.ptr()) : nullptr);
    g.desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
               with_aux ? static_cast<const void*>(aux.ptr()) : nullptr);
    g.desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
  }
  // op(A) op(B) (+ bias) in double, and its error bound.
  double pre(std::int64_t i, std::int64_t j, bool with_bias, double* tol) const {
    double sum = 0.0, mag = 0.0;
    for (std::int64_t p = 0; p < s.k; ++p) {
      const double x = static_cast<double>(g.s.a(g.A.host, 0, i, p)) * g.s.bm(g.B.host, 0, p, j);
      sum += x;
      mag += std::fabs(x);
    }
    if (with_bias) {
      sum += bias.host[static_cast<std::size_t>(i)];
      mag += std::fabs(bias.host[static_cast<std::size_t>(i)]);
    }
    *tol = mag * (s.k + 3) * 0x1p-24 + 1e-30;
    return sum;
  }
};

TEST_F(CublasLtEmulation, EpiloguesForward) {
  for (cudaDataType out : {CUDA_R_32F, CUDA_R_16BF}) {
    const cudaDataType in = out == CUDA_R_16BF ? CUDA_R_16BF : CUDA_R_32F;
    const double out_rel = out == CUDA_R_16BF ? 0x1p-8 : 0.0;
    for (cublasLtEpilogue_t epi :
         {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_AUX,
          CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX_BIAS}) {
      EpilogueCase e(in, out);
      const bool with_bias = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_BIAS ||
                             epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      const bool with_aux =
          epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
      const bool gelu = epi != CUBLASLT_EPILOGUE_BIAS;
      e.set(epi, with_bias, with_aux);
      std::vector<cublasLtMatmulHeuristicResult_t> algos;
      ASSERT_EQ(e.g.heuristic(algos), CUBLAS_STATUS_SUCCESS) << epi;
      ASSERT_EQ(algos.size(), in == CUDA_R_16BF ? 1u : 2u);
      for (const auto& r : algos) {
        e.g.C.upload();
        e.aux.upload();
        ASSERT_EQ(e.g.run(&r.algo, 1.0f, 0.0f), CUBLAS_STATUS_SUCCESS) << epi;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> d = e.g.C.download();
        const std::vector<float> aux = e.aux.download();
        for (std::int64_t j = 0; j < e.s.n; ++j)
          for (std::int64_t i = 0; i < e.s.m; ++i) {
            double tol = 0.0;
            const double x = e.pre(i, j, with_bias, &tol);
            const std::size_t c = static_cast<std::size_t>(i + j * 24);
            if (gelu) {
              EXPECT_NEAR(d[c], gelu_ref(x),
                          2 * tol + 2e-6 * std::fabs(x) + out_rel * std::fabs(gelu_ref(x)))
                  << "epilogue " << epi << " (" << i << ", " << j << ")";
            } else {
              EXPECT_NEAR(d[c], x, tol + out_rel * std::fabs(x)) << "(" << i << ", " << j << ")";
            }
            if (with_aux) {  // the GELU input, in D's type
              EXPECT_NEAR(aux[c], x, tol + out_rel * std::fabs(x))
                  << "aux (" << i << ", " << j << ")";
            } else {
              EXPECT_EQ(bits(aux[c]), bits(e.aux.host[c]));  // untouched
            }
          }
      }
    }
  }
}

TEST_F(CublasLtEmulation, EpilogueDgeluAndBiasGradients) {
  EpilogueCase e(CUDA_R_32F, CUDA_R_32F);
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  // DGELU: D = op(A) op(B) * gelu'(AUX), AUX the forward pass's GELU input.
  e.set(CUBLASLT_EPILOGUE_DGELU, false, true);
  ASSERT_EQ(e.g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(e.g.run(&algos[0].algo, 1.0f, 0.0f), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> d = e.g.C.download();
  for (std::int64_t j = 0; j < e.s.n; ++j)
    for (std::int64_t i = 0; i < e.s.m; ++i) {
      double tol = 0.0;
      const double x = e.pre(i, j, false, &tol);
      const std::size_t c = static_cast<std::size_t>(i + j * 24);
      const double gg = gelu_grad_ref(e.aux.host[c]);
      EXPECT_NEAR(d[c], x * gg, tol * std::fabs(gg) * 2 + 4e-6 * std::fabs(x)) << i << ", " << j;
    }
  EXPECT_EQ(e.aux.download(), e.aux.host);  // an input here

  // BGRADA: bias[i] = sum over k of op(A)(i, :); BGRADB: bias[j] = sum over k of op(B)(:, j). D is
  // the plain product. Their sums go through the workspace: none allowed, no algorithm.
  for (cublasLtEpilogue_t epi : {CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
    const bool a = epi == CUBLASLT_EPILOGUE_BGRADA;
    const std::int64_t len = a ? e.s.m : e.s.n;
    e.set(epi, true, false);
    EXPECT_EQ(e.g.heuristic(algos, 0), CUBLAS_STATUS_NOT_SUPPORTED);
    ASSERT_EQ(e.g.heuristic(algos, 4096), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(algos.size(), 2u);
    EXPECT_EQ(algos[0].workspaceSize, static_cast<std::size_t>(len) * 4);
    DeviceMem ws(4096);
    EXPECT_EQ(e.g.run(&algos[0].algo, 1.0f, 0.0f, ws.base, static_cast<std::size_t>(len) * 4 - 4),
              CUBLAS_STATUS_INVALID_VALUE);  // less than the algorithm needs
    EXPECT_EQ(e.g.run(&algos[0].algo, 1.0f, 0.0f, ws.base + 16, 1024),
              CUBLAS_STATUS_INVALID_VALUE);  // not 256-byte aligned
    for (const auto& r : algos) {
      e.bias.upload();
      ASSERT_EQ(e.g.run(&r.algo, 1.0f, 0.0f, ws.base, 4096), CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> bias = e.bias.download();
      for (std::int64_t i = 0; i < len; ++i) {
        double sum = 0.0, mag = 0.0;
        for (std::int64_t p = 0; p < e.s.k; ++p) {
          const double v = a ? e.g.s.a(e.g.A.host, 0, i, p) : e.g.s.bm(e.g.B.host, 0, p, i);
          sum += v;
          mag += std::fabs(v);
        }
        EXPECT_NEAR(bias[static_cast<std::size_t>(i)], sum, mag * (e.s.k + 2) * 0x1p-24)
            << epi << " " << i;
      }
      for (std::size_t i = static_cast<std::size_t>(len); i < bias.size(); ++i)
        EXPECT_EQ(bias[i], e.bias.host[i]);
      std::vector<double> ref, tol;
      reference(e.g.s, e.g.A.host, e.g.B.host, e.g.C.host, 1.0f, 0.0f, ref, tol);
      expect_near_reference(e.g.s, e.g.C.download(), ref, tol);
    }
  }
}

TEST_F(CublasLtEmulation, EpilogueRefusals) {
  EpilogueCase e(CUDA_R_32F, CUDA_R_32F);
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  e.set(CUBLASLT_EPILOGUE_GELU_AUX, false, true, 20);  // aux ld not a multiple of 8
  EXPECT_EQ(e.g.heuristic(algos), CUBLAS_STATUS_INVALID_VALUE);
  e.set(CUBLASLT_EPILOGUE_GELU_AUX, false, true, 16);  // aux ld less than m
  EXPECT_EQ(e.g.heuristic(algos), CUBLAS_STATUS_INVALID_VALUE);
  e.set(CUBLASLT_EPILOGUE_BIAS, false, false);  // no bias pointer
  EXPECT_EQ(e.g.heuristic(algos), CUBLAS_STATUS_INVALID_VALUE);
  e.set(CUBLASLT_EPILOGUE_RELU, false, false);
  EXPECT_EQ(e.g.heuristic(algos), CUBLAS_STATUS_NOT_SUPPORTED);
  e.set(CUBLASLT_EPILOGUE_DGELU_BGRAD, true, true);
  EXPECT_EQ(e.g.heuristic(algos), CUBLAS_STATUS_NOT_SUPPORTED);
  e.set(CUBLASLT_EPILOGUE_BIAS, true, false);
  e.g.desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(CUDA_R_16BF));
  EXPECT_EQ(e.g.heuristic(algos), CUBLAS_STATUS_NOT_SUPPORTED);  // bias type is Ctype
  e.g.desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(-1));
  // A 4-byte aligned bias: the generic algorithm only (fp32), nothing for bf16.
  e.g.desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER,
               static_cast<const void*>(static_cast<const char*>(e.bias.ptr()) + 4));
  ASSERT_EQ(e.g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(algos.size(), 1u);
  EXPECT_EQ(algo_id(algos[0].algo), 1);
  EpilogueCase h(CUDA_R_16BF, CUDA_R_16BF);
  h.set(CUBLASLT_EPILOGUE_BIAS, true, false);
  ASSERT_EQ(h.g.heuristic(algos), CUBLAS_STATUS_SUCCESS);
  h.g.desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER,
               static_cast<const void*>(static_cast<const char*>(h.bias.ptr()) + 2));
  EXPECT_EQ(h.g.heuristic(algos), CUBLAS_STATUS_NOT_SUPPORTED);
}

// ---------------------------------------------------------------------------------------------
// cuBLAS: the fallback.

struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() { EXPECT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS); }
  ~Cublas() { cublasDestroy(h); }
};

cublasStatus_t gemm_ex(const Cublas& c, const Spec& s, float alpha, const void* A, const void* B,
                       float beta, void* C, cublasComputeType_t ct = CUBLAS_COMPUTE_32F) {
  const cublasOperation_t ta = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          tb = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (s.batch == 1) {
    return cublasGemmEx(c.h, ta, tb, static_cast<int>(s.m), static_cast<int>(s.n),
                        static_cast<int>(s.k), &alpha, A, s.ab, static_cast<int>(s.lda), B, s.ab,
                        static_cast<int>(s.ldb), &beta, C, s.cd, static_cast<int>(s.ldc), ct,
                        CUBLAS_GEMM_DEFAULT);
  }
  return cublasGemmStridedBatchedEx(
      c.h, ta, tb, static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), &alpha, A,
      s.ab, static_cast<int>(s.lda), s.sa, B, s.ab, static_cast<int>(s.ldb), s.sb, &beta, C, s.cd,
      static_cast<int>(s.ldc), s.sc, s.batch, ct, CUBLAS_GEMM_DEFAULT);
}

TEST_F(CublasLtEmulation, CublasGemmExAtAnyAlignmentInOrder) {
  Cublas cb;
  int t = 0;
  for (cudaDataType in : {CUDA_R_32F, CUDA_R_16BF}) {
    for (int batch : {1, 3}) {
      Spec s;
      s.ta = t & 1;
      s.tb = t & 2;
      ++t;
      s.ab = in;
      s.m = 21;
      s.n = 14;
      s.k = 37;
      s.batch = batch;
      s.lda = s.ta ? 39 : 23;  // odd: no 16-byte multiple
      s.ldb = s.tb ? 15 : 41;
      s.ldc = 22;
      s.done();
      s.sa += 1;
      LtGemm g(s, 30 + t, 1, 3, 1);  // every operand one element past an aligned address
      refill_wide(g, 40 + t);
      ASSERT_EQ(gemm_ex(cb, g.s, 1.25f, g.A.ptr(), g.B.ptr(), -0.5f, g.C.ptr()),
                CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = g.C.download();
      std::vector<double> ref, tol;
      reference(g.s, g.A.host, g.B.host, g.C.host, 1.25f, -0.5f, ref, tol);
      expect_near_reference(g.s, got, ref, tol);
      const std::vector<float> want =
          model(g.s, g.A.host, g.B.host, g.C.host, 1.25f, -0.5f, Order::in_order);
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << i;
    }
  }
}

TEST_F(CublasLtEmulation, CublasRefusalsStreamWorkspaceAndMathMode) {
  Cublas cb;
  Spec s;
  s.m = 8;
  s.n = 4;
  s.k = 6;
  LtGemm g(s, 50);
  Spec bad = g.s;
  bad.lda = 5;  // < m
  EXPECT_EQ(gemm_ex(cb, bad, 1.0f, g.A.ptr(), g.B.ptr(), 0.0f, g.C.ptr()),
            CUBLAS_STATUS_INVALID_VALUE);
  bad = g.s;
  bad.m = -1;
  EXPECT_EQ(gemm_ex(cb, bad, 1.0f, g.A.ptr(), g.B.ptr(), 0.0f, g.C.ptr()),
            CUBLAS_STATUS_INVALID_VALUE);
  const float one = 1.0f, zero = 0.0f;
  EXPECT_EQ(cublasGemmEx(cb.h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 4, 6, &one, g.A.ptr(), CUDA_R_32F, 8,
                         g.B.ptr(), CUDA_R_16BF, 6, &zero, g.C.ptr(), CUDA_R_32F, 8,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasGemmEx(cb.h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 4, 6, &one, g.A.ptr(), CUDA_R_32F, 8,
                         g.B.ptr(), CUDA_R_32F, 6, &zero, g.C.ptr(), CUDA_R_32F, 8,
                         CUBLAS_COMPUTE_32F, static_cast<cublasGemmAlgo_t>(42)),
            CUBLAS_STATUS_INVALID_VALUE);
  std::vector<float> host_a(g.A.host);
  EXPECT_EQ(gemm_ex(cb, g.s, 1.0f, host_a.data(), g.B.ptr(), 0.0f, g.C.ptr()),
            CUBLAS_STATUS_INVALID_VALUE);
  // Workspace: 256-byte aligned device memory.
  DeviceMem ws(1 << 16);
  EXPECT_EQ(cublasSetWorkspace(cb.h, ws.base + 16, 1024), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasSetWorkspace(cb.h, ws.base, 1 << 16), CUBLAS_STATUS_SUCCESS);
  // TF32 math would change fp32 numerics: refused for fp32, not for bf16 or pedantic compute.
  ASSERT_EQ(cublasSetMathMode(cb.h, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm_ex(cb, g.s, 1.0f, g.A.ptr(), g.B.ptr(), 0.0f, g.C.ptr()),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(
      gemm_ex(cb, g.s, 1.0f, g.A.ptr(), g.B.ptr(), 0.0f, g.C.ptr(), CUBLAS_COMPUTE_32F_PEDANTIC),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetMathMode(cb.h, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
  // On a stream of its own.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cublasSetStream(cb.h, stream), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(gemm_ex(cb, g.s, 2.0f, g.A.ptr(), g.B.ptr(), 0.0f, g.C.ptr()), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<double> ref, tol;
  reference(g.s, g.A.host, g.B.host, g.C.host, 2.0f, 0.0f, ref, tol);
  expect_near_reference(g.s, g.C.download(), ref, tol);
  ASSERT_EQ(cublasSetStream(cb.h, nullptr), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  // A cuBLAS handle is a cuBLASLt handle too.
  std::vector<cublasLtMatmulHeuristicResult_t> algos(1);
  Pref pref(0);
  int found = 0;
  const auto lt = reinterpret_cast<cublasLtHandle_t>(cb.h);
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt, g.desc.d, g.la.l, g.lb.l, g.lc.l, g.lc.l, pref.p, 1,
                                           algos.data(), &found),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(
      cublasLtMatmul(lt, g.desc.d, &one, g.A.ptr(), g.la.l, g.B.ptr(), g.lb.l, &zero, g.C.ptr(),
                     g.lc.l, g.C.ptr(), g.lc.l, &algos[0].algo, nullptr, 0, nullptr),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cublasLtDestroy(lt), CUBLAS_STATUS_INVALID_VALUE);  // cublasDestroy frees it
}

TEST_F(CublasLtEmulation, DescriptorAttributesFollowTheSizeRules) {
  Layout l(CUDA_R_16BF, 5, 7, 8);
  std::int64_t ld = 0;
  std::size_t written = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_LD, nullptr, 0, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(std::int64_t));
  ASSERT_EQ(
      cublasLtMatrixLayoutGetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld, &written),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(ld, 8);
  std::uint32_t type = 0;
  ASSERT_EQ(cublasLtMatrixLayoutGetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, sizeof type,
                                             nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(type, static_cast<std::uint32_t>(CUDA_R_16BF));
  const std::int32_t count = 2;  // BATCH_COUNT is int32_t: 8 bytes is refused
  const std::int64_t wide = 2;
  EXPECT_EQ(
      cublasLtMatrixLayoutSetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &wide, sizeof wide),
      CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                             sizeof count),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, nullptr, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  Desc d(true, false);
  cublasOperation_t op = CUBLAS_OP_N;
  ASSERT_EQ(
      cublasLtMatmulDescGetAttribute(d.d, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op, nullptr),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(op, CUBLAS_OP_T);
  std::uint32_t epi = 0;
  ASSERT_EQ(
      cublasLtMatmulDescGetAttribute(d.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, nullptr),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(epi, static_cast<std::uint32_t>(CUBLASLT_EPILOGUE_DEFAULT));
  Pref p(0);
  cublasLtMatmulPreference_t fresh = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&fresh), CUBLAS_STATUS_SUCCESS);
  std::uint32_t align = 0;
  std::uint64_t max_ws = 1;
  ASSERT_EQ(cublasLtMatmulPreferenceGetAttribute(fresh, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                 &align, sizeof align, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(align, 256u);  // NVIDIA's default
  ASSERT_EQ(cublasLtMatmulPreferenceGetAttribute(fresh, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &max_ws, sizeof max_ws, nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(max_ws, 0u);
  cublasLtMatmulPreferenceDestroy(fresh);
  const std::uint32_t small = 4;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(p.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &small, sizeof small),
            CUBLAS_STATUS_INVALID_VALUE);  // uint64_t
}

}  // namespace
