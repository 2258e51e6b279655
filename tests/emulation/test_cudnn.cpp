// The emulated cuDNN (emulation/cuda/src/cudnn.cpp) running the graphs pdtrain builds for its
// attention (src/kernels/cuda/cudnn_sdpa.cpp, compiled in): the causal forward (out and the
// fp32 log-sum-exp statistics) and backward (dq, dk, dv into the interleaved bf16 dqkv) against
// a double reference on the same bf16 qkv, over pdtrain's strided layout, bit-identical run to
// run; and cuDNN's documented refusals (head dimension not a multiple of 8, above 128 in the
// backward or 256 in the forward, FP32 Q/K/V, a graph that is not attention) and the
// execution's checks (workspace missing or too small, host memory), from raw backend calls.
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "../../src/kernels/cuda/cudnn_sdpa.hpp"

namespace {

using pdtrain::bf16;
using pdtrain::kernels::cuda::CudnnSdpa;
using pdtrain::kernels::cuda::SdpaShape;
using I64 = std::int64_t;

template <class T>
struct Device {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Device(std::size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(1, n) * sizeof(T)),
              cudaSuccess);
  }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  void up(const std::vector<T>& h) {
    ASSERT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> down() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

std::vector<bf16> random_bf16(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<bf16> v(n);
  for (bf16& x : v) x = pdtrain::to_bf16(normal(rng));
  return v;
}
double d(bf16 x) { return pdtrain::to_float(x); }

// The double reference over pdtrain's layout: qkv[B,T,3,NH,HS], out[B,T,NH,HS],
// lse[B,NH,T], dqkv[B,T,3,NH,HS] (overwritten).
struct Reference {
  std::vector<double> out, lse, dqkv;
};
Reference reference(const SdpaShape& s, const std::vector<bf16>& qkv,
                    const std::vector<bf16>& out_used, const std::vector<bf16>& dout) {
  const I64 C = I64(s.NH) * s.HS;
  const double scale = 1.0 / std::sqrt(double(s.HS));
  Reference r;
  r.out.assign(std::size_t(s.B) * s.T * C, 0.0);
  r.lse.assign(std::size_t(s.B) * s.NH * s.T, 0.0);
  r.dqkv.assign(std::size_t(s.B) * s.T * 3 * C, 0.0);
  auto at = [&](int b, int t, int which, int h, int i) {
    return std::size_t(((I64(b) * s.T + t) * 3 + which) * C + I64(h) * s.HS + i);
  };
  auto o_at = [&](int b, int t, int h, int i) {
    return std::size_t((I64(b) * s.T + t) * C + I64(h) * s.HS + i);
  };
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        std::vector<double> p(std::size_t(t) + 1);
        double m = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          double dot = 0;
          for (int i = 0; i < s.HS; ++i) dot += d(qkv[at(b, t, 0, h, i)]) * d(qkv[at(b, u, 1, h, i)]);
          p[std::size_t(u)] = dot * scale;
          m = std::max(m, p[std::size_t(u)]);
        }
        double z = 0;
        for (double& x : p) z += (x = std::exp(x - m));
        for (double& x : p) x /= z;
        r.lse[std::size_t((I64(b) * s.NH + h) * s.T + t)] = m + std::log(z);
        for (int i = 0; i < s.HS; ++i) {
          double o = 0;
          for (int u = 0; u <= t; ++u) o += p[std::size_t(u)] * d(qkv[at(b, u, 2, h, i)]);
          r.out[o_at(b, t, h, i)] = o;
        }
        // Backward of this row: D = dout . out (the out the backward is given).
        double D = 0;
        for (int i = 0; i < s.HS; ++i) D += d(dout[o_at(b, t, h, i)]) * d(out_used[o_at(b, t, h, i)]);
        for (int u = 0; u <= t; ++u) {
          double dp = 0;
          for (int i = 0; i < s.HS; ++i) dp += d(dout[o_at(b, t, h, i)]) * d(qkv[at(b, u, 2, h, i)]);
          const double ds = p[std::size_t(u)] * (dp - D) * scale;
          for (int i = 0; i < s.HS; ++i) {
            r.dqkv[at(b, u, 2, h, i)] += p[std::size_t(u)] * d(dout[o_at(b, t, h, i)]);
            r.dqkv[at(b, t, 0, h, i)] += ds * d(qkv[at(b, u, 1, h, i)]);
            r.dqkv[at(b, u, 1, h, i)] += ds * d(qkv[at(b, t, 0, h, i)]);
          }
        }
      }
  return r;
}

template <class T>
double value(T x) {
  if constexpr (std::is_same_v<T, bf16>) return d(x);
  else return double(x);
}

// |got - want| <= tol * max(1, |want|) everywhere; reports the first few misses.
template <class T>
void expect_close(const char* what, const std::vector<T>& got, const std::vector<double>& want,
                  double tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = value(got[i]);
    if (!(std::abs(g - want[i]) <= tol * std::max(1.0, std::abs(want[i]))) && ++misses <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << g << " vs " << want[i];
  }
  EXPECT_EQ(misses, 0) << what;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Tolerances relative to max(1, |ref|): the statistics are fp32 sums of exact products of bf16
// values (a few fp32 ulps of a sum of T terms); out and the gradients carry the bf16 roundings
// of P and dS before their products and of the outputs themselves (2^-8 relative each, on
// sums of magnitude ~1), the bounds pdtrain's own bf16 attention is held to
// (tests/backend/test_kernel_ops.cpp, kAttnBf16Forward and kAttnBf16Backward).
constexpr double kStatsTol = 1e-5, kForwardTol = 1e-2, kBackwardTol = 4e-2;

struct SdpaRun {
  std::vector<bf16> out, dqkv;
  std::vector<float> stats;
};

SdpaRun run_sdpa(CudnnSdpa& sdpa, cudaStream_t stream, const SdpaShape& s, const std::vector<bf16>& qkv,
             const std::vector<bf16>& dout) {
  const std::size_t n = std::size_t(s.B) * s.T * s.NH * s.HS;
  Device<bf16> dqkv_in(3 * n), out(n), dout_d(n), dqkv(3 * n);
  Device<float> stats(std::size_t(s.B) * s.NH * s.T);
  Device<char> ws(std::max(sdpa.workspace_bytes(s), sdpa.backward_scratch_bytes(s)));
  dqkv_in.up(qkv);
  dout_d.up(dout);
  // Garbage first: forward and backward must write everything they return.
  EXPECT_EQ(cudaMemset(out.p, 0x7f, n * 2), cudaSuccess);
  EXPECT_EQ(cudaMemset(stats.p, 0x7f, stats.n * 4), cudaSuccess);
  EXPECT_EQ(cudaMemset(dqkv.p, 0x7f, 3 * n * 2), cudaSuccess);
  sdpa.forward(s, out.p, stats.p, dqkv_in.p, ws.p);
  sdpa.backward(s, dqkv.p, dout_d.p, dqkv_in.p, out.p, stats.p, ws.p);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return {out.down(), dqkv.down(), stats.down()};
}

class CudnnSdpaTest : public ::testing::TestWithParam<SdpaShape> {};

TEST_P(CudnnSdpaTest, ForwardAndBackwardMatchDoubleOnPdtrainsLayout) {
  const SdpaShape s = GetParam();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    CudnnSdpa sdpa(stream);
    ASSERT_EQ(sdpa.refusal(s), "");
    const std::size_t n = std::size_t(s.B) * s.T * s.NH * s.HS;
    const std::vector<bf16> qkv = random_bf16(3 * n, 1), dout = random_bf16(n, 2);
    const SdpaRun first = run_sdpa(sdpa, stream, s, qkv, dout);
    const SdpaRun second = run_sdpa(sdpa, stream, s, qkv, dout);
    EXPECT_TRUE(same_bits(first.out, second.out));
    EXPECT_TRUE(same_bits(first.stats, second.stats));
    EXPECT_TRUE(same_bits(first.dqkv, second.dqkv)) << "the backward is not deterministic";
    const Reference ref = reference(s, qkv, first.out, dout);
    expect_close("out", first.out, ref.out, kForwardTol);
    expect_close("stats", first.stats, ref.lse, kStatsTol);
    expect_close("dqkv", first.dqkv, ref.dqkv, kBackwardTol);
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Odd B, T not a multiple of anything, heads of 8 and 64, several heads (the strides of the
// interleaved layout), one head of 128 (the backward's largest).
INSTANTIATE_TEST_SUITE_P(Shapes, CudnnSdpaTest,
                         ::testing::Values(SdpaShape{1, 5, 1, 8}, SdpaShape{3, 13, 2, 16},
                                           SdpaShape{2, 9, 3, 64}, SdpaShape{1, 6, 1, 128}),
                         [](const auto& info) {
                           const SdpaShape& s = info.param;
                           return "B" + std::to_string(s.B) + "T" + std::to_string(s.T) + "NH" +
                                  std::to_string(s.NH) + "HS" + std::to_string(s.HS);
                         });

TEST(CudnnSdpaRefusals, HeadDimensionsCudnnDoesNotTake) {
  CudnnSdpa sdpa(nullptr);
  // Not a multiple of 8: the forward is refused.
  EXPECT_NE(sdpa.refusal({1, 4, 2, 12}).find("forward: execution plan: CUDNN_STATUS_NOT_SUPPORTED_SHAPE"),
            std::string::npos) << sdpa.refusal({1, 4, 2, 12});
  EXPECT_NE(sdpa.refusal({1, 4, 1, 4}).find("CUDNN_STATUS_NOT_SUPPORTED_SHAPE"), std::string::npos);
  // 136: the forward takes it (<= 256), the backward does not (<= 128).
  EXPECT_NE(sdpa.refusal({1, 4, 1, 136}).find("backward: execution plan: CUDNN_STATUS_NOT_SUPPORTED_SHAPE"),
            std::string::npos) << sdpa.refusal({1, 4, 1, 136});
  EXPECT_NE(sdpa.refusal({1, 4, 1, 264}).find("forward:"), std::string::npos);
  EXPECT_EQ(sdpa.refusal({1, 4, 1, 128}), "");
}

// ---------------------------------------------------------------------------------------------
// Raw backend calls: a two-matmul graph Y = (X1 X2) X3 of one type.

struct Raw {
  std::vector<cudnnBackendDescriptor_t> all;
  ~Raw() {
    for (auto it = all.rbegin(); it != all.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = nullptr;
    EXPECT_EQ(cudnnBackendCreateDescriptor(t, &d), CUDNN_STATUS_SUCCESS);
    all.push_back(d);
    return d;
  }
  static void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                  cudnnBackendAttributeType_t t, I64 n, const void* v) {
    EXPECT_EQ(cudnnBackendSetAttribute(d, a, t, n, v), CUDNN_STATUS_SUCCESS) << a;
  }
  cudnnBackendDescriptor_t tensor(I64 uid, cudnnDataType_t type, I64 rows, I64 cols, bool virt) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const I64 dims[4] = {1, 1, rows, cols}, strides[4] = {rows * cols, rows * cols, cols, 1};
    const I64 align = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    EXPECT_EQ(cudnnBackendFinalize(t), CUDNN_STATUS_SUCCESS);
    return t;
  }
  cudnnBackendDescriptor_t matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                  cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    EXPECT_EQ(cudnnBackendFinalize(mm), CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    EXPECT_EQ(cudnnBackendFinalize(op), CUDNN_STATUS_SUCCESS);
    return op;
  }
  // The plan of the graph of `ops` (its finalize status in *status), nullptr when refused.
  cudnnBackendDescriptor_t plan(cudnnHandle_t h, std::vector<cudnnBackendDescriptor_t> ops,
                                cudnnStatus_t* status) {
    cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, I64(ops.size()), ops.data());
    EXPECT_EQ(cudnnBackendFinalize(g), CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    EXPECT_EQ(cudnnBackendFinalize(heur), CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t cfg = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    I64 count = 0;
    EXPECT_EQ(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &cfg),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(count, 1);
    cudnnBackendDescriptor_t p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    *status = cudnnBackendFinalize(p);
    return *status == CUDNN_STATUS_SUCCESS ? p : nullptr;
  }
};

// X1 [8 x 16] X2 [16 x 8] -> S (virtual fp32) [8 x 8]; S X3 [8 x 16] -> Y [8 x 16].
cudnnBackendDescriptor_t two_matmuls(Raw& r, cudnnHandle_t h, cudnnDataType_t type, bool second,
                                     cudnnStatus_t* status) {
  auto x1 = r.tensor(1, type, 8, 16, false), x2 = r.tensor(2, type, 16, 8, false);
  auto s = r.tensor(100, CUDNN_DATA_FLOAT, 8, 8, true);
  std::vector<cudnnBackendDescriptor_t> ops{r.matmul(x1, x2, s)};
  if (second) {
    auto x3 = r.tensor(3, type, 8, 16, false), y = r.tensor(4, type, 8, 16, false);
    ops.push_back(r.matmul(s, x3, y));
  }
  return r.plan(h, ops, status);
}

TEST(CudnnRefusals, Fp32AttentionAndOtherGraphs) {
  cudnnHandle_t h = nullptr;
  ASSERT_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  {
    Raw r;
    EXPECT_EQ(two_matmuls(r, h, CUDNN_DATA_FLOAT, true, &status), nullptr);
    EXPECT_EQ(status, CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
  }
  {
    Raw r;
    EXPECT_EQ(two_matmuls(r, h, CUDNN_DATA_BFLOAT16, false, &status), nullptr);
    EXPECT_EQ(status, CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN);
  }
  {
    Raw r;
    EXPECT_NE(two_matmuls(r, h, CUDNN_DATA_BFLOAT16, true, &status), nullptr);
    EXPECT_EQ(status, CUDNN_STATUS_SUCCESS);
  }
  EXPECT_EQ(cudnnDestroy(h), CUDNN_STATUS_SUCCESS);
}

// The plan's workspace holds its virtual tensors: a missing or short one, or host memory, is
// refused when the call is made; the given one gives the double product (bf16 in and out).
TEST(CudnnExecute, WorkspaceAndMemoryChecks) {
  cudnnHandle_t h = nullptr;
  ASSERT_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
  Raw r;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  cudnnBackendDescriptor_t plan = two_matmuls(r, h, CUDNN_DATA_BFLOAT16, true, &status);
  ASSERT_NE(plan, nullptr);
  I64 ws_bytes = 0, n = 0;
  ASSERT_EQ(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &n, &ws_bytes),
            CUDNN_STATUS_SUCCESS);
  EXPECT_GE(ws_bytes, I64(8 * 8 * sizeof(float)));
  const std::vector<bf16> x1 = random_bf16(128, 3), x2 = random_bf16(128, 4), x3 = random_bf16(128, 5);
  Device<bf16> d1(128), d2(128), d3(128), y(128);
  Device<char> ws{static_cast<std::size_t>(ws_bytes)}, short_ws{static_cast<std::size_t>(ws_bytes) - 256};
  d1.up(x1);
  d2.up(x2);
  d3.up(x3);
  std::vector<bf16> host_y(128);
  auto execute = [&](void* workspace, void* out) {
    cudnnBackendDescriptor_t pack = r.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    const I64 uids[4] = {1, 2, 3, 4};
    void* ptrs[4] = {d1.p, d2.p, d3.p, out};
    Raw::set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 4, uids);
    Raw::set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 4, ptrs);
    Raw::set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    EXPECT_EQ(cudnnBackendFinalize(pack), CUDNN_STATUS_SUCCESS);
    return cudnnBackendExecute(h, plan, pack);
  };
  EXPECT_EQ(execute(nullptr, y.p), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(execute(short_ws.p, y.p), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(execute(ws.p, host_y.data()), CUDNN_STATUS_BAD_PARAM);
  ASSERT_EQ(execute(ws.p, y.p), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<bf16> got = y.down();
  std::vector<double> want(128, 0.0);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 16; ++j)
      for (int k = 0; k < 8; ++k) {
        double s = 0;
        for (int l = 0; l < 16; ++l) s += d(x1[std::size_t(i * 16 + l)]) * d(x2[std::size_t(l * 8 + k)]);
        want[std::size_t(i * 16 + j)] += s * d(x3[std::size_t(k * 16 + j)]);
      }
  // fp32 sums of 16 and 8 terms of magnitude ~1, rounded once to bf16 at the end.
  expect_close("Y", got, want, 1e-2);
  EXPECT_EQ(cudnnDestroy(h), CUDNN_STATUS_SUCCESS);
}

}  // namespace
