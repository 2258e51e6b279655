// cuDNN's fused causal attention through the backend (graph) API: the graphs of cudnn_sdpa.hpp,
// their plans cached per shape, and their execution on the compute stream.
#include "cudnn_sdpa.hpp"

#include <cudnn.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "cudnn_check.hpp"

namespace pdtrain::kernels::cuda {
namespace {

using I64 = std::int64_t;
using Dims = std::array<I64, 4>;

// The tensors' unique ids (the variant pack names the device pointers by them).
enum Uid : I64 {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kSoftmaxSum,
  kFirstVirtual = 100,
};

constexpr std::size_t kWorkspaceAlign = 256;
std::size_t aligned(std::size_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

std::string status_text(cudnnStatus_t rc) {
  return std::string(cudnnGetErrorString(rc)) + " (status " + std::to_string(int(rc)) + ")";
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) {
    CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Builds one operation graph, then its execution plan. The first call cuDNN answers with
// anything but success is remembered (why()) and the rest is skipped: a refusal, not a fault.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }

  // A tensor of 4 dimensions: a device one (by uid), a by-value scalar, or a virtual one.
  cudnnBackendDescriptor_t tensor(I64 uid, cudnnDataType_t type, Dims dims, Dims strides) {
    return make_tensor(uid, type, dims, strides, false, false);
  }
  cudnnBackendDescriptor_t scalar(I64 uid) {
    return make_tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, Dims dims, Dims strides) {
    return make_tensor(next_virtual_++, type, dims, strides, true, false);
  }

  // y = mode(x, b, t) (b, t may be null; axis for GEN_INDEX).
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, I64 axis = -1) {
    Desc& pw = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnDataType_t precision =
        mode == CUDNN_POINTWISE_CMP_GE ? CUDNN_DATA_BOOLEAN : CUDNN_DATA_FLOAT;
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    finalize(pw, "pointwise");
    Desc& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get());
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t != nullptr) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    add_op(op, "pointwise operation");
  }
  // c = a @ b over the last two dimensions, fp32 accumulation.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    Desc& mm = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &precision);
    finalize(mm, "matmul");
    Desc& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
    add_op(op, "matmul operation");
  }
  // y = x reduced (ADD or MAX) over the dimensions where y has 1.
  void reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    Desc& rd = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &reduce);
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &precision);
    finalize(rd, "reduction");
    Desc& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd.get());
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    add_op(op, "reduction operation");
  }
  // y = x transposed (y's dimensions and strides are x's, permuted).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    Desc& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add_op(op, "reshape operation");
  }

  // The operation graph's execution plan with the first engine of cuDNN's heuristics that
  // builds (only deterministic ones when asked); an empty Desc when none does (why() says why).
  Desc plan(bool deterministic) {
    Desc graph = make_graph();
    if (!ok()) return {};
    Desc heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendDescriptor_t g = graph.get();
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set_desc(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g);
    set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    finalize(heuristics, "engine heuristics");
    if (!ok()) return {};
    constexpr int kConfigs = 8;
    std::vector<Desc> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int i = 0; i < kConfigs; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    I64 count = 0;
    call(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, kConfigs, &count, raw.data()),
         "heuristics' results");
    if (!ok()) return {};
    if (count == 0) why_ = "cuDNN's heuristics have no engine for the graph";
    std::string last_refusal = why_;
    for (I64 i = 0; i < std::min<I64>(count, kConfigs); ++i) {
      why_.clear();
      if (deterministic && !is_deterministic(raw[static_cast<std::size_t>(i)])) {
        last_refusal = "no deterministic engine (every engine cuDNN offers for the backward has "
                       "CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)";
        continue;
      }
      Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle_);
      set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[static_cast<std::size_t>(i)]);
      finalize(plan, "execution plan");
      if (ok()) return plan;
      last_refusal = why_;
    }
    why_ = last_refusal.empty() ? "no engine builds" : last_refusal;
    return {};
  }

 private:
  Desc& keep(cudnnBackendDescriptorType_t type) { return keep_.emplace_back(type); }

  void call(cudnnStatus_t rc, const char* what) {
    if (ok() && rc != CUDNN_STATUS_SUCCESS) why_ = std::string(what) + ": " + status_text(rc);
  }
  template <class T>
  void set(Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           const T* value, I64 count = 1) {
    if (ok()) call(cudnnBackendSetAttribute(d.get(), name, type, count, value), "set attribute");
  }
  void set_desc(Desc& d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &value);
  }
  void finalize(Desc& d, const char* what) {
    if (ok()) call(cudnnBackendFinalize(d.get()), what);
  }
  void add_op(Desc& op, const char* what) {
    finalize(op, what);
    ops_.push_back(op.get());
  }

  cudnnBackendDescriptor_t make_tensor(I64 uid, cudnnDataType_t type, Dims dims, Dims strides,
                                       bool is_virtual, bool by_value) {
    Desc& t = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const I64 alignment = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), I64(dims.size()));
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), I64(strides.size()));
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
    if (is_virtual) set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
    finalize(t, "tensor");
    return t.get();
  }

  Desc make_graph() {
    Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle_);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(),
        I64(ops_.size()));
    finalize(graph, "operation graph");
    return graph;
  }

  bool is_deterministic(cudnnBackendDescriptor_t config) {
    Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t e = engine.get();
    I64 n = 0;
    call(cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
         "engine of a configuration");
    std::array<cudnnBackendNumericalNote_t, 16> notes{};
    I64 count = 0;
    call(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                  I64(notes.size()), &count, notes.data()),
         "engine's numerical notes");
    if (!ok()) return false;
    for (I64 i = 0; i < std::min<I64>(count, I64(notes.size())); ++i)
      if (notes[static_cast<std::size_t>(i)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return false;
    return true;
  }

  cudnnHandle_t handle_;
  std::vector<Desc> keep_;  // every descriptor the graph refers to
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::string why_;
  I64 next_virtual_ = kFirstVirtual;
};

// The views of pdtrain's layout (cudnn_sdpa.hpp) as [B,NH,rows,cols] tensors.
struct Layout {
  I64 B, T, NH, HS, C;
  explicit Layout(const SdpaShape& s) : B(s.B), T(s.T), NH(s.NH), HS(s.HS), C(I64(s.NH) * s.HS) {}
  Dims heads() const { return {B, NH, T, HS}; }
  Dims heads_t() const { return {B, NH, HS, T}; }
  Dims in_qkv() const { return {T * 3 * C, HS, 3 * C, 1}; }     // q, k or v of qkv / dqkv
  Dims in_qkv_t() const { return {T * 3 * C, HS, 1, 3 * C}; }   // its transpose
  Dims in_out() const { return {T * C, HS, C, 1}; }             // out, dout
  Dims rows() const { return {B, NH, T, 1}; }                   // stats, softmax sums
  Dims rows_dense() const { return {NH * T, T, 1, 1}; }
  Dims scores() const { return {B, NH, T, T}; }
  Dims scores_dense() const { return {NH * T * T, T * T, T, 1}; }
  Dims scores_t() const { return {NH * T * T, T * T, 1, T}; }   // the scores' transpose
  Dims heads_dense() const { return {NH * T * HS, T * HS, HS, 1}; }
};

// scale * (Q K^T), causal: entries past the diagonal (column > row) are -inf.
cudnnBackendDescriptor_t masked_scores(GraphBuilder& g, const Layout& l,
                                       cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t kt) {
  auto s = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.matmul(q, kt, s);
  auto scaled = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_MUL, s, g.scalar(kScale), nullptr, scaled);
  auto row = g.virt(CUDNN_DATA_INT32, l.scores(), l.scores_dense());
  auto col = g.virt(CUDNN_DATA_INT32, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, row, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, col, 3);
  auto keep = g.virt(CUDNN_DATA_BOOLEAN, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep);
  auto masked = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, g.scalar(kNegInf), keep, masked);
  return masked;
}

void build_forward(GraphBuilder& g, const Layout& l) {
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, l.heads(), l.in_qkv());
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, l.heads_t(), l.in_qkv_t());
  auto v = g.tensor(kV, CUDNN_DATA_BFLOAT16, l.heads(), l.in_qkv());
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, l.heads(), l.in_out());
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, l.rows(), l.rows_dense());
  auto s = masked_scores(g, l, q, kt);
  auto max = g.virt(CUDNN_DATA_FLOAT, l.rows(), l.rows_dense());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, max);
  auto shifted = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_SUB, s, max, nullptr, shifted);
  auto e = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
  auto sum = g.virt(CUDNN_DATA_FLOAT, l.rows(), l.rows_dense());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  auto log_sum = g.virt(CUDNN_DATA_FLOAT, l.rows(), l.rows_dense());
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, nullptr, stats);
  // P in bf16: the tensor cores' operand of P V.
  auto p = g.virt(CUDNN_DATA_BFLOAT16, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, nullptr, p);
  g.matmul(p, v, o);
}

void build_backward(GraphBuilder& g, const Layout& l) {
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, l.heads(), l.in_qkv());
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, l.heads_t(), l.in_qkv_t());
  auto vt = g.tensor(kV, CUDNN_DATA_BFLOAT16, l.heads_t(), l.in_qkv_t());
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, l.heads(), l.in_out());
  auto d_o = g.tensor(kDO, CUDNN_DATA_BFLOAT16, l.heads(), l.in_out());
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, l.rows(), l.rows_dense());
  auto dq = g.tensor(kDQ, CUDNN_DATA_BFLOAT16, l.heads(), l.in_qkv());
  auto dk = g.tensor(kDK, CUDNN_DATA_BFLOAT16, l.heads(), l.in_qkv());
  auto dv = g.tensor(kDV, CUDNN_DATA_BFLOAT16, l.heads(), l.in_qkv());
  // D = rowsum(dO * O), kept in memory after the workspace (as cudnn-frontend keeps it).
  auto d_o_o = g.virt(CUDNN_DATA_FLOAT, l.heads(), l.heads_dense());
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, o, nullptr, d_o_o);
  auto softmax_sum = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, l.rows(), l.rows_dense());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, softmax_sum);
  // P = exp(masked scaled scores - stats); dV = P^T dO with P^T in bf16.
  auto s = masked_scores(g, l, q, kt);
  auto shifted = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_SUB, s, stats, nullptr, shifted);
  auto p = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, p);
  auto pt = g.virt(CUDNN_DATA_BFLOAT16, l.scores(), l.scores_t());
  g.reshape(p, pt);
  g.matmul(pt, d_o, dv);
  // dS = P (dO V^T - D) scale, in bf16; dQ = dS K, dK = dS^T Q.
  auto dp = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.matmul(d_o, vt, dp);
  auto dp_centered = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, dp_centered);
  auto ds_unscaled = g.virt(CUDNN_DATA_FLOAT, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, p, nullptr, ds_unscaled);
  auto ds = g.virt(CUDNN_DATA_BFLOAT16, l.scores(), l.scores_dense());
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, g.scalar(kScale), nullptr, ds);
  auto dst = g.virt(CUDNN_DATA_BFLOAT16, l.scores(), l.scores_t());
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);
  auto k = g.virt(CUDNN_DATA_BFLOAT16, l.heads(), l.in_qkv());
  g.reshape(kt, k);
  g.matmul(ds, k, dq);
}

I64 workspace_of(const Desc& plan) {
  I64 bytes = 0, n = 0;
  CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &n, &bytes));
  return bytes;
}

// Runs `plan` with the given uid -> pointer pairs on the handle's stream.
void execute(cudnnHandle_t handle, const Desc& plan, const std::vector<I64>& uids,
             const std::vector<void*>& pointers, void* workspace) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                       CUDNN_TYPE_INT64, I64(uids.size()), uids.data()));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                       CUDNN_TYPE_VOID_PTR, I64(pointers.size()),
                                       pointers.data()));
  CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                       CUDNN_TYPE_VOID_PTR, 1, &workspace));
  CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  CUDNN_CHECK(cudnnBackendExecute(handle, plan.get(), pack.get()));
}

}  // namespace

std::string cudnn_version() {
  const std::size_t v = cudnnGetVersion();  // major * 10000 + minor * 100 + patch (cuDNN 9)
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

// A shape's plans, or why cuDNN refuses it.
struct CudnnSdpa::Plans {
  Desc forward, backward;
  std::size_t forward_workspace = 0, backward_workspace = 0, softmax_sum_bytes = 0;
  std::string refusal;
};

CudnnSdpa::CudnnSdpa(cudaStream_t stream) : stream_(stream) {
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t rc = cudnnCreate(&h);
  if (rc != CUDNN_STATUS_SUCCESS) {
    handle_refusal_ = "cudnnCreate: " + status_text(rc);
    return;
  }
  handle_ = h;
  CUDNN_CHECK(cudnnSetStream(h, stream_));
}

CudnnSdpa::~CudnnSdpa() {
  cache_.clear();  // plans before the handle
  if (handle_ != nullptr) cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

CudnnSdpa::Plans& CudnnSdpa::plans(const SdpaShape& s) {
  std::unique_ptr<Plans>& p = cache_[s];
  if (p) return *p;
  p = std::make_unique<Plans>();
  if (handle_ == nullptr) {
    p->refusal = handle_refusal_;
    return *p;
  }
  const auto h = static_cast<cudnnHandle_t>(handle_);
  const Layout l(s);
  GraphBuilder fwd(h);
  build_forward(fwd, l);
  p->forward = fwd.plan(false);
  if (!fwd.ok()) {
    p->refusal = "forward: " + fwd.why();
    return *p;
  }
  GraphBuilder bwd(h);
  build_backward(bwd, l);
  p->backward = bwd.plan(true);
  if (!bwd.ok()) {
    p->refusal = "backward: " + bwd.why();
    return *p;
  }
  p->forward_workspace = aligned(static_cast<std::size_t>(workspace_of(p->forward)));
  p->backward_workspace = aligned(static_cast<std::size_t>(workspace_of(p->backward)));
  p->softmax_sum_bytes = aligned(static_cast<std::size_t>(l.B * l.NH * l.T) * sizeof(float));
  return *p;
}

const std::string& CudnnSdpa::refusal(const SdpaShape& s) { return plans(s).refusal; }

std::size_t CudnnSdpa::workspace_bytes(const SdpaShape& s) {
  const Plans& p = plans(s);
  return std::max(p.forward_workspace, p.backward_workspace);
}

std::size_t CudnnSdpa::backward_scratch_bytes(const SdpaShape& s) {
  const Plans& p = plans(s);
  return p.backward_workspace + p.softmax_sum_bytes;
}

void CudnnSdpa::forward(const SdpaShape& s, bf16* out, float* stats, const bf16* qkv,
                        void* workspace) {
  const Plans& p = plans(s);
  PDT_CHECK(p.refusal.empty(), "CudnnSdpa::forward on a shape cuDNN refuses: " + p.refusal);
  const I64 C = I64(s.NH) * s.HS;
  float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
  float neg_inf = -std::numeric_limits<float>::infinity();
  auto* x = const_cast<bf16*>(qkv);  // cuDNN's variant pack takes void*; inputs are not written
  execute(static_cast<cudnnHandle_t>(handle_), p.forward,
          {kQ, kK, kV, kO, kStats, kScale, kNegInf},
          {x, x + C, x + 2 * C, out, stats, &scale, &neg_inf}, workspace);
}

void CudnnSdpa::backward(const SdpaShape& s, bf16* dqkv, const bf16* dout, const bf16* qkv,
                         const bf16* out, const float* stats, void* workspace) {
  const Plans& p = plans(s);
  PDT_CHECK(p.refusal.empty(), "CudnnSdpa::backward on a shape cuDNN refuses: " + p.refusal);
  const I64 C = I64(s.NH) * s.HS;
  float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
  float neg_inf = -std::numeric_limits<float>::infinity();
  auto* x = const_cast<bf16*>(qkv);
  void* softmax_sum = static_cast<char*>(workspace) + p.backward_workspace;
  execute(static_cast<cudnnHandle_t>(handle_), p.backward,
          {kQ, kK, kV, kO, kDO, kStats, kScale, kNegInf, kDQ, kDK, kDV, kSoftmaxSum},
          {x, x + C, x + 2 * C, const_cast<bf16*>(out), const_cast<bf16*>(dout),
           const_cast<float*>(stats), &scale, &neg_inf, dqkv, dqkv + C, dqkv + 2 * C,
           softmax_sum},
          workspace);
}

}  // namespace pdtrain::kernels::cuda
