// The emulated cuDNN (include/cudnn_graph.h): the handle and the backend (graph) API subset that
// pdtrain's cuDNN attention calls. The execution plan interprets its operation graph with its own
// loops (matmul, pointwise, reduction and transposing reshape, one operation at a time in an order
// where every tensor is written before it is read), queued in stream order (cuda_emu::enqueue).
//
// Its one engine stands for cuDNN's fused scaled-dot-product attention: it takes an operation
// graph only where cuDNN's fused attention does, and refuses the rest as NVIDIA documents it
// (cuDNN 9 Developer Guide, "Graph API > Supported Graph Patterns > Scaled Dot Product
// Attention" / "Fused Flash Attention fprop / bprop"; cudnn-frontend 1.32's checks of the same
// support surface, include/cudnn_frontend/node/sdpa_support_surface.h and
// scaled_dot_product_flash_attention.h):
//   - compute capability 8.0 or newer ("SDPA FP16/BF16 requires SM80 (Ampere) or newer
//     architecture"): CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH;
//   - Q, K, V, O (the matmuls' non-virtual operands and results) FP16 or BF16 ("input/output data
//     type FP16, BF16"; softmax statistics FP32): CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
//   - head dimension a multiple of 8 ("hidden_dim should be multiple of 8"), at most 256 in the
//     forward (Hopper) and at most 128 in the backward ("Num hidden_dim should be less than or
//     equal to 128 and hidden_dim should be multiple of 8"): CUDNN_STATUS_NOT_SUPPORTED_SHAPE;
//   - a graph that is neither the forward (two matmuls) nor the backward (five) of attention:
//     CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN.
// The refusal comes where cuDNN's does, when the execution plan is finalized, with a line on
// stderr saying why. The engine's numerical notes: TENSOR_CORE, and not NONDETERMINISTIC (its
// loops give the same bits run to run).
//
// What differs from cuDNN, on purpose (a test tool): FP16 tensors are refused as the emulation
// runs no FP16 (pdtrain uses BF16); a reshape must be a transpose (its output's dimensions and
// strides a permutation of its input's, the only reshape cudnn-frontend's attention graphs
// make); virtual tensors live in the plan's workspace (4 bytes an element, the value rounded to
// the tensor's type), so the workspace the caller gives is used and must be large enough; every
// non-virtual tensor must lie in device memory of the handle's device, checked when
// cudnnBackendExecute is called.
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "emulator.hpp"

struct cudnnContext {
  std::uint32_t magic = 0;
  cudaStream_t stream = nullptr;
  int device = 0;
};

namespace {

constexpr std::uint32_t kHandleMagic = 0xc0d17e57u;
constexpr std::uint32_t kDescMagic = 0xde5c0001u;
constexpr int kMaxDims = 8;

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

cudnnStatus_t refuse(cudnnStatus_t rc, const std::string& call, const std::string& why) {
  std::cerr << "cudnn emulation: " << call << ": " << why << " (" << cudnnGetErrorString(rc)
            << ")\n";
  return rc;
}

// ---------------------------------------------------------------------------------------------
// Descriptors. A descriptor set as another's attribute is copied (finalized) at that moment.

struct Tensor {
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  bool type_set = false;
  std::vector<std::int64_t> dims, strides;
  std::int64_t uid = 0;
  bool uid_set = false;
  bool is_virtual = false;
  bool by_value = false;
  std::int64_t alignment = 0;
};

struct Pointwise {
  cudnnPointwiseMode_t mode = CUDNN_POINTWISE_ADD;
  bool mode_set = false;
  cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  std::int64_t axis = -1;
};

struct Reduction {
  cudnnReduceTensorOp_t op = CUDNN_REDUCE_TENSOR_ADD;
  bool op_set = false;
  cudnnDataType_t precision = CUDNN_DATA_FLOAT;
};

enum class OpKind { pointwise, matmul, reduction, reshape };

// One operation: pointwise y = f(x[, b[, t]]); matmul y = x @ b; reduction y = reduce(x);
// reshape y = x transposed.
struct Operation {
  OpKind kind = OpKind::pointwise;
  Pointwise pw;
  Reduction red;
  cudnnDataType_t matmul_precision = CUDNN_DATA_FLOAT;
  bool desc_set = false;
  std::optional<Tensor> x, b, t, y;
};

struct Graph {
  std::vector<Operation> ops;        // in an order where every tensor is written before read
  std::map<std::int64_t, Tensor> tensors;  // by uid
  int device = 0;
};

struct Engine {
  std::shared_ptr<const Graph> graph;
};

struct Plan {
  std::shared_ptr<const Graph> graph;
  std::map<std::int64_t, std::size_t> virtual_offset;  // workspace byte offset by uid
  std::size_t workspace = 0;
};

struct VariantPack {
  std::vector<std::int64_t> uids;
  std::vector<void*> pointers;
  void* workspace = nullptr;
};

struct Descriptor {
  std::uint32_t magic = kDescMagic;
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  Tensor tensor;
  Pointwise pointwise;
  Reduction reduction;
  cudnnDataType_t matmul_precision = CUDNN_DATA_FLOAT;
  bool matmul_precision_set = false;
  Operation op;
  std::vector<Operation> graph_ops;
  cudnnHandle_t graph_handle = nullptr;
  std::shared_ptr<const Graph> graph;  // operation graph, heuristics, engine, config
  cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
  bool heur_mode_set = false;
  std::shared_ptr<const Plan> plan;
  cudnnHandle_t plan_handle = nullptr;
  bool config_set = false;
  VariantPack pack;
};

Descriptor* as_desc(void* p) {
  auto* d = static_cast<Descriptor*>(p);
  return (d != nullptr && d->magic == kDescMagic) ? d : nullptr;
}

bool valid_handle(cudnnHandle_t h) { return h != nullptr && h->magic == kHandleMagic; }

// ---------------------------------------------------------------------------------------------
// Values: a tensor element is read as float and written rounded to the tensor's type.

std::size_t type_bytes(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_BFLOAT16: case CUDNN_DATA_HALF: return 2;
    case CUDNN_DATA_BOOLEAN: return 1;
    case CUDNN_DATA_DOUBLE: case CUDNN_DATA_INT64: return 8;
  }
  return 0;
}

float round_to(cudnnDataType_t t, float v) {
  switch (t) {
    case CUDNN_DATA_BFLOAT16: return __bfloat162float(__float2bfloat16(v));
    case CUDNN_DATA_INT32: return static_cast<float>(static_cast<std::int32_t>(v));
    case CUDNN_DATA_BOOLEAN: return v != 0.0f ? 1.0f : 0.0f;
    default: return v;
  }
}

std::int64_t elements(const Tensor& t) {
  std::int64_t n = 1;
  for (std::int64_t d : t.dims) n *= d;
  return n;
}

// Bytes from the first element to past the last: 1 + sum (dim-1)*stride elements.
std::int64_t extent_elements(const Tensor& t) {
  std::int64_t last = 0;
  for (std::size_t i = 0; i < t.dims.size(); ++i) last += (t.dims[i] - 1) * t.strides[i];
  return last + 1;
}

// Where a tensor's elements are when the plan runs: memory of its type (non-virtual) or floats
// in the workspace (virtual).
struct Storage {
  char* base = nullptr;
  bool floats = false;  // virtual: one float an element
  float scalar = 0.0f;  // by value
  bool by_value = false;
};

float load(const Tensor& t, const Storage& s, std::int64_t off) {
  if (s.by_value) return s.scalar;
  if (s.floats) return reinterpret_cast<const float*>(s.base)[off];
  switch (t.type) {
    case CUDNN_DATA_FLOAT: return reinterpret_cast<const float*>(s.base)[off];
    case CUDNN_DATA_BFLOAT16:
      return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(s.base)[off]);
    case CUDNN_DATA_INT32:
      return static_cast<float>(reinterpret_cast<const std::int32_t*>(s.base)[off]);
    case CUDNN_DATA_BOOLEAN: return reinterpret_cast<const std::uint8_t*>(s.base)[off] ? 1.f : 0.f;
    default: return 0.0f;  // refused at finalize
  }
}

void store(const Tensor& t, const Storage& s, std::int64_t off, float v) {
  v = round_to(t.type, v);
  if (s.floats) {
    reinterpret_cast<float*>(s.base)[off] = v;
    return;
  }
  switch (t.type) {
    case CUDNN_DATA_FLOAT: reinterpret_cast<float*>(s.base)[off] = v; break;
    case CUDNN_DATA_BFLOAT16:
      reinterpret_cast<__nv_bfloat16*>(s.base)[off] = __float2bfloat16(v);
      break;
    case CUDNN_DATA_INT32: reinterpret_cast<std::int32_t*>(s.base)[off] = static_cast<std::int32_t>(v); break;
    case CUDNN_DATA_BOOLEAN: reinterpret_cast<std::uint8_t*>(s.base)[off] = v != 0.0f; break;
    default: break;
  }
}

// Offset of a multi-index in t, dimensions of size 1 broadcast (index ignored).
std::int64_t offset_of(const Tensor& t, const std::int64_t* idx) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < t.dims.size(); ++i)
    if (t.dims[i] != 1) off += idx[i] * t.strides[i];
  return off;
}

// Calls f(idx) for every multi-index of dims, the last dimension fastest.
template <class F>
void for_each_index(const std::vector<std::int64_t>& dims, F&& f) {
  std::int64_t idx[kMaxDims] = {};
  const std::size_t n = dims.size();
  for (std::int64_t d : dims)
    if (d == 0) return;
  while (true) {
    f(idx);
    std::size_t i = n;
    while (i > 0) {
      --i;
      if (++idx[i] < dims[i]) break;
      idx[i] = 0;
      if (i == 0) return;
    }
    if (n == 0) return;
  }
}

// ---------------------------------------------------------------------------------------------
// The operations' loops.

using Storages = std::map<std::int64_t, Storage>;

float pointwise_value(cudnnPointwiseMode_t mode, float x, float b, float t, std::int64_t index) {
  switch (mode) {
    case CUDNN_POINTWISE_ADD: return x + b;
    case CUDNN_POINTWISE_MUL: return x * b;
    case CUDNN_POINTWISE_DIV: return x / b;
    case CUDNN_POINTWISE_SUB: return x - b;
    case CUDNN_POINTWISE_EXP: return std::exp(x);
    case CUDNN_POINTWISE_LOG: return std::log(x);
    case CUDNN_POINTWISE_CMP_GE: return x >= b ? 1.0f : 0.0f;
    case CUDNN_POINTWISE_GEN_INDEX: return static_cast<float>(index);
    case CUDNN_POINTWISE_BINARY_SELECT: return t != 0.0f ? x : b;  // y = t ? x : b
  }
  return 0.0f;
}

void run_pointwise(const Operation& op, Storages& st) {
  const Tensor& y = *op.y;
  const Storage& ys = st.at(y.uid);
  const bool reads_x = op.pw.mode != CUDNN_POINTWISE_GEN_INDEX;
  for_each_index(y.dims, [&](const std::int64_t* idx) {
    const float x = reads_x ? load(*op.x, st.at(op.x->uid), offset_of(*op.x, idx)) : 0.0f;
    const float b = op.b ? load(*op.b, st.at(op.b->uid), offset_of(*op.b, idx)) : 0.0f;
    const float t = op.t ? load(*op.t, st.at(op.t->uid), offset_of(*op.t, idx)) : 0.0f;
    const std::int64_t index = op.pw.axis >= 0 ? idx[op.pw.axis] : 0;
    store(y, ys, offset_of(y, idx), pointwise_value(op.pw.mode, x, b, t, index));
  });
}

// y[..., m, n] = sum over k in order of x[..., m, k] * b[..., k, n], fp32 sums.
void run_matmul(const Operation& op, Storages& st) {
  const Tensor &a = *op.x, &b = *op.b, &c = *op.y;
  const Storage &as = st.at(a.uid), &bs = st.at(b.uid), &cs = st.at(c.uid);
  const std::size_t r = c.dims.size();
  const std::int64_t K = a.dims[r - 1];
  for_each_index(c.dims, [&](const std::int64_t* idx) {
    std::int64_t ai[kMaxDims], bi[kMaxDims];
    std::copy(idx, idx + r, ai);
    std::copy(idx, idx + r, bi);
    float sum = 0.0f;
    for (std::int64_t k = 0; k < K; ++k) {
      ai[r - 1] = k;
      bi[r - 2] = k;
      sum += load(a, as, offset_of(a, ai)) * load(b, bs, offset_of(b, bi));
    }
    store(c, cs, offset_of(c, idx), sum);
  });
}

// y = x reduced over the dimensions where y has 1 and x more, in index order, fp32.
void run_reduction(const Operation& op, Storages& st) {
  const Tensor &x = *op.x, &y = *op.y;
  const Storage &xs = st.at(x.uid), &ys = st.at(y.uid);
  const bool is_max = op.red.op == CUDNN_REDUCE_TENSOR_MAX;
  std::vector<float> acc(static_cast<std::size_t>(elements(y)), is_max ? -INFINITY : 0.0f);
  std::vector<std::int64_t> dense(y.dims.size(), 1);  // acc's strides
  for (std::size_t i = y.dims.size(); i-- > 1;) dense[i - 1] = dense[i] * y.dims[i];
  for_each_index(x.dims, [&](const std::int64_t* idx) {
    std::int64_t a = 0;
    for (std::size_t i = 0; i < y.dims.size(); ++i)
      if (y.dims[i] != 1) a += idx[i] * dense[i];
    const float v = load(x, xs, offset_of(x, idx));
    float& s = acc[static_cast<std::size_t>(a)];
    s = is_max ? std::max(s, v) : s + v;
  });
  for_each_index(y.dims, [&](const std::int64_t* idx) {
    std::int64_t a = 0;
    for (std::size_t i = 0; i < y.dims.size(); ++i) a += idx[i] * dense[i];
    store(y, ys, offset_of(y, idx), acc[static_cast<std::size_t>(a)]);
  });
}

// The permutation p of x's dimensions that y's are (y dim k = x dim p[k], same stride); empty
// when there is none.
std::vector<std::size_t> transpose_of(const Tensor& x, const Tensor& y) {
  if (x.dims.size() != y.dims.size()) return {};
  std::vector<std::size_t> p;
  std::vector<bool> used(x.dims.size(), false);
  for (std::size_t k = 0; k < y.dims.size(); ++k) {
    std::size_t j = 0;
    while (j < x.dims.size() &&
           (used[j] || x.dims[j] != y.dims[k] ||
            (x.dims[j] != 1 && x.strides[j] != y.strides[k])))
      ++j;
    if (j == x.dims.size()) return {};
    used[j] = true;
    p.push_back(j);
  }
  return p;
}

void run_reshape(const Operation& op, Storages& st) {
  const Tensor &x = *op.x, &y = *op.y;
  const Storage &xs = st.at(x.uid), &ys = st.at(y.uid);
  const std::vector<std::size_t> p = transpose_of(x, y);
  for_each_index(y.dims, [&](const std::int64_t* idx) {
    std::int64_t xi[kMaxDims] = {};
    for (std::size_t k = 0; k < p.size(); ++k) xi[p[k]] = idx[k];
    store(y, ys, offset_of(y, idx), load(x, xs, offset_of(x, xi)));
  });
}

void run_graph(const Graph& g, Storages st) {
  for (const Operation& op : g.ops) {
    switch (op.kind) {
      case OpKind::pointwise: run_pointwise(op, st); break;
      case OpKind::matmul: run_matmul(op, st); break;
      case OpKind::reduction: run_reduction(op, st); break;
      case OpKind::reshape: run_reshape(op, st); break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Checks when descriptors are finalized.

bool broadcasts_to(const Tensor& in, const Tensor& out) {
  if (in.dims.size() != out.dims.size()) return false;
  for (std::size_t i = 0; i < in.dims.size(); ++i)
    if (in.dims[i] != out.dims[i] && in.dims[i] != 1) return false;
  return true;
}

// Why op's tensors do not fit together ("" when they do).
std::string shape_problem(const Operation& op) {
  const Tensor& y = *op.y;
  switch (op.kind) {
    case OpKind::pointwise:
      if (op.x && !broadcasts_to(*op.x, y)) return "the pointwise x does not broadcast to y";
      if (op.b && !broadcasts_to(*op.b, y)) return "the pointwise b does not broadcast to y";
      if (op.t && !broadcasts_to(*op.t, y)) return "the pointwise t does not broadcast to y";
      if (op.pw.mode == CUDNN_POINTWISE_GEN_INDEX &&
          (op.pw.axis < 0 || op.pw.axis >= static_cast<std::int64_t>(y.dims.size())))
        return "GEN_INDEX needs an axis of y";
      return "";
    case OpKind::matmul: {
      const Tensor &a = *op.x, &b = *op.b;
      const std::size_t r = y.dims.size();
      if (r < 2 || a.dims.size() != r || b.dims.size() != r) return "matmul ranks differ";
      if (a.dims[r - 2] != y.dims[r - 2] || b.dims[r - 1] != y.dims[r - 1] ||
          a.dims[r - 1] != b.dims[r - 2])
        return "matmul: A is M x K, B K x N and C M x N";
      for (std::size_t i = 0; i + 2 < r; ++i)
        if ((a.dims[i] != y.dims[i] && a.dims[i] != 1) || (b.dims[i] != y.dims[i] && b.dims[i] != 1))
          return "matmul batch dimensions differ";
      return "";
    }
    case OpKind::reduction:
      if (op.x->dims.size() != y.dims.size()) return "reduction ranks differ";
      for (std::size_t i = 0; i < y.dims.size(); ++i)
        if (y.dims[i] != 1 && y.dims[i] != op.x->dims[i])
          return "each reduction output dimension is its input's or 1";
      return "";
    case OpKind::reshape:
      if (transpose_of(*op.x, y).empty())
        return "the emulation's reshape is a transpose: y's dimensions and strides a permutation "
               "of x's";
      return "";
  }
  return "";
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.type == b.type && a.dims == b.dims && a.strides == b.strides &&
         a.is_virtual == b.is_virtual && a.by_value == b.by_value;
}

std::vector<const Tensor*> inputs_of(const Operation& op) {
  std::vector<const Tensor*> in;
  if (op.x && !(op.kind == OpKind::pointwise && op.pw.mode == CUDNN_POINTWISE_GEN_INDEX))
    in.push_back(&*op.x);
  if (op.b) in.push_back(&*op.b);
  if (op.t) in.push_back(&*op.t);
  return in;
}

// The operation graph's tensors by uid and its operations in an order where each virtual tensor
// is written before read (cuDNN orders the graph itself; so does this).
cudnnStatus_t make_graph(const std::vector<Operation>& ops, Graph& g) {
  const char* call = "cudnnBackendFinalize(OPERATIONGRAPH)";
  if (ops.empty()) return refuse(CUDNN_STATUS_BAD_PARAM, call, "the graph has no operations");
  std::map<std::int64_t, int> writers;
  for (const Operation& op : ops) {
    std::vector<const Tensor*> all = inputs_of(op);
    if (op.x) all.push_back(&*op.x);
    all.push_back(&*op.y);
    for (const Tensor* t : all) {
      auto [it, fresh] = g.tensors.emplace(t->uid, *t);
      if (!fresh && !same_tensor(it->second, *t))
        return refuse(CUDNN_STATUS_BAD_PARAM, call,
                      cat("tensor uid ", t->uid, " is given two different descriptors"));
    }
    if (op.y->by_value) return refuse(CUDNN_STATUS_BAD_PARAM, call, "an output is by value");
    if (++writers[op.y->uid] > 1)
      return refuse(CUDNN_STATUS_BAD_PARAM, call, cat("tensor uid ", op.y->uid, " is written twice"));
  }
  std::vector<bool> placed(ops.size(), false);
  std::map<std::int64_t, bool> ready;
  for (const auto& [uid, t] : g.tensors) ready[uid] = writers.count(uid) == 0;
  for (const auto& [uid, t] : g.tensors)
    if (t.is_virtual && writers.count(uid) == 0)
      return refuse(CUDNN_STATUS_BAD_PARAM, call, cat("virtual tensor uid ", uid, " is never written"));
  while (g.ops.size() < ops.size()) {
    bool progress = false;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (placed[i]) continue;
      const std::vector<const Tensor*> in = inputs_of(ops[i]);
      if (!std::all_of(in.begin(), in.end(), [&](const Tensor* t) { return ready[t->uid]; }))
        continue;
      placed[i] = progress = true;
      ready[ops[i].y->uid] = true;
      g.ops.push_back(ops[i]);
    }
    if (!progress) return refuse(CUDNN_STATUS_BAD_PARAM, call, "the graph has a cycle");
  }
  return CUDNN_STATUS_SUCCESS;
}

bool is_16bit(cudnnDataType_t t) { return t == CUDNN_DATA_BFLOAT16 || t == CUDNN_DATA_HALF; }

// The fused attention engine's documented refusals (the file's comment lists the sources).
cudnnStatus_t engine_takes(const Graph& g, const std::string& call) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, g.device) != cudaSuccess)
    return refuse(CUDNN_STATUS_INTERNAL_ERROR, call, "the device's properties are unreadable");
  if (prop.major < 8)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH, call,
                  cat("fused attention needs compute capability 8.0 or newer, the device has ",
                      prop.major, ".", prop.minor));
  std::vector<const Operation*> matmuls;
  for (const Operation& op : g.ops)
    if (op.kind == OpKind::matmul) matmuls.push_back(&op);
  const bool forward = matmuls.size() == 2, backward = matmuls.size() == 5;
  if (!forward && !backward)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, call,
                  cat("no engine: ", matmuls.size(), " matmuls are neither attention's forward "
                      "(2) nor its backward (5)"));
  for (const Operation* m : matmuls)
    for (const Tensor* t : {&*m->x, &*m->b, &*m->y})
      if (!t->is_virtual && !is_16bit(t->type))
        return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, call,
                      cat("fused attention takes FP16 or BF16 Q, K, V, O and their gradients; "
                          "tensor uid ", t->uid, " is not"));
  for (const auto& [uid, t] : g.tensors)
    if (t.type == CUDNN_DATA_HALF)
      return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, call,
                    "the emulation runs no FP16 (only BF16 and FP32)");
  // The head dimension: the reduced dimension of the first matmul (Q K^T).
  const Operation& qk = *matmuls.front();
  const std::int64_t d = qk.x->dims.back();
  const std::int64_t most = forward ? 256 : 128;
  if (d % 8 != 0 || d > most)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, call,
                  cat("fused attention ", forward ? "forward" : "backward",
                      " takes head dimensions that are multiples of 8 up to ", most, ", not ", d));
  return CUDNN_STATUS_SUCCESS;
}

// The workspace: each virtual tensor's elements as floats, 256-byte aligned.
std::shared_ptr<const Plan> make_plan(std::shared_ptr<const Graph> g) {
  auto p = std::make_shared<Plan>();
  p->graph = std::move(g);
  for (const auto& [uid, t] : p->graph->tensors) {
    if (!t.is_virtual) continue;
    p->virtual_offset[uid] = p->workspace;
    p->workspace += (static_cast<std::size_t>(extent_elements(t)) * 4 + 255) / 256 * 256;
  }
  return p;
}

cudnnStatus_t finalize_tensor(Tensor& t) {
  const char* call = "cudnnBackendFinalize(TENSOR)";
  if (!t.type_set || !t.uid_set || t.dims.empty())
    return refuse(CUDNN_STATUS_BAD_PARAM, call, "data type, unique id and dimensions are required");
  if (t.dims.size() > kMaxDims || t.strides.size() != t.dims.size())
    return refuse(CUDNN_STATUS_BAD_PARAM, call, "strides must match the dimensions (at most 8)");
  for (std::size_t i = 0; i < t.dims.size(); ++i)
    if (t.dims[i] <= 0 || t.strides[i] <= 0)
      return refuse(CUDNN_STATUS_BAD_PARAM, call, "dimensions and strides must be positive");
  if (type_bytes(t.type) == 0)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, call, "a data type the emulation lacks");
  if (t.alignment != 0 && t.alignment % static_cast<std::int64_t>(type_bytes(t.type)) != 0)
    return refuse(CUDNN_STATUS_BAD_PARAM, call, "byte alignment below the element size");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_operation(Descriptor& d) {
  Operation& op = d.op;
  const std::string call = "cudnnBackendFinalize(OPERATION)";
  switch (d.type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
      op.kind = OpKind::pointwise;
      const bool unary = op.pw.mode == CUDNN_POINTWISE_EXP || op.pw.mode == CUDNN_POINTWISE_LOG ||
                         op.pw.mode == CUDNN_POINTWISE_GEN_INDEX;
      const bool ternary = op.pw.mode == CUDNN_POINTWISE_BINARY_SELECT;
      if (!op.desc_set || !op.x || !op.y || (!unary && !op.b) || (ternary && !op.t))
        return refuse(CUDNN_STATUS_BAD_PARAM, call, "the pointwise operation lacks a descriptor");
      break;
    }
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
      op.kind = OpKind::matmul;
      if (!op.desc_set || !op.x || !op.b || !op.y)
        return refuse(CUDNN_STATUS_BAD_PARAM, call, "matmul needs A, B, C and its descriptor");
      break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
      op.kind = OpKind::reduction;
      if (!op.desc_set || !op.x || !op.y)
        return refuse(CUDNN_STATUS_BAD_PARAM, call, "reduction needs x, y and its descriptor");
      break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
      op.kind = OpKind::reshape;
      if (!op.x || !op.y) return refuse(CUDNN_STATUS_BAD_PARAM, call, "reshape needs x and y");
      break;
    default: return CUDNN_STATUS_BAD_PARAM;
  }
  if (const std::string why = shape_problem(op); !why.empty())
    return refuse(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, call, why);
  return CUDNN_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Attribute setting.

template <class T>
bool take(cudnnBackendAttributeType_t given, cudnnBackendAttributeType_t wanted, std::int64_t n,
          const void* p, T& out) {
  if (given != wanted || n != 1 || p == nullptr) return false;
  std::memcpy(&out, p, sizeof(T));
  return true;
}

// The finalized descriptor a BACKEND_DESCRIPTOR attribute names, of `type`.
const Descriptor* named(cudnnBackendAttributeType_t given, std::int64_t n, const void* p,
                        cudnnBackendDescriptorType_t type) {
  if (given != CUDNN_TYPE_BACKEND_DESCRIPTOR || n != 1 || p == nullptr) return nullptr;
  const Descriptor* d = as_desc(*static_cast<void* const*>(p));
  return (d != nullptr && d->type == type && d->finalized) ? d : nullptr;
}

cudnnStatus_t set_tensor(Tensor& t, cudnnBackendAttributeName_t name,
                         cudnnBackendAttributeType_t type, std::int64_t n, const void* p) {
  bool ok = false;
  switch (name) {
    case CUDNN_ATTR_TENSOR_DATA_TYPE: ok = t.type_set = take(type, CUDNN_TYPE_DATA_TYPE, n, p, t.type); break;
    case CUDNN_ATTR_TENSOR_UNIQUE_ID: ok = t.uid_set = take(type, CUDNN_TYPE_INT64, n, p, t.uid); break;
    case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT: ok = take(type, CUDNN_TYPE_INT64, n, p, t.alignment); break;
    case CUDNN_ATTR_TENSOR_IS_VIRTUAL: ok = take(type, CUDNN_TYPE_BOOLEAN, n, p, t.is_virtual); break;
    case CUDNN_ATTR_TENSOR_IS_BY_VALUE: ok = take(type, CUDNN_TYPE_BOOLEAN, n, p, t.by_value); break;
    case CUDNN_ATTR_TENSOR_DIMENSIONS:
    case CUDNN_ATTR_TENSOR_STRIDES: {
      if (type != CUDNN_TYPE_INT64 || n <= 0 || n > kMaxDims || p == nullptr) break;
      const auto* v = static_cast<const std::int64_t*>(p);
      (name == CUDNN_ATTR_TENSOR_DIMENSIONS ? t.dims : t.strides).assign(v, v + n);
      ok = true;
      break;
    }
    default: break;
  }
  return ok ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t set_operation(Descriptor& d, cudnnBackendAttributeName_t name,
                            cudnnBackendAttributeType_t type, std::int64_t n, const void* p) {
  Operation& op = d.op;
  auto tensor = [&](std::optional<Tensor>& slot) {
    const Descriptor* t = named(type, n, p, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (t == nullptr) return CUDNN_STATUS_BAD_PARAM;
    slot = t->tensor;
    return CUDNN_STATUS_SUCCESS;
  };
  switch (name) {
    case CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR: {
      const Descriptor* pw = named(type, n, p, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
      if (pw == nullptr) return CUDNN_STATUS_BAD_PARAM;
      op.pw = pw->pointwise;
      op.desc_set = true;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_OPERATION_MATMUL_DESC: {
      const Descriptor* mm = named(type, n, p, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
      if (mm == nullptr) return CUDNN_STATUS_BAD_PARAM;
      op.matmul_precision = mm->matmul_precision;
      op.desc_set = true;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_OPERATION_REDUCTION_DESC: {
      const Descriptor* rd = named(type, n, p, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
      if (rd == nullptr) return CUDNN_STATUS_BAD_PARAM;
      op.red = rd->reduction;
      op.desc_set = true;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_OPERATION_POINTWISE_XDESC: case CUDNN_ATTR_OPERATION_MATMUL_ADESC:
    case CUDNN_ATTR_OPERATION_REDUCTION_XDESC: case CUDNN_ATTR_OPERATION_RESHAPE_XDESC:
      return tensor(op.x);
    case CUDNN_ATTR_OPERATION_POINTWISE_BDESC: case CUDNN_ATTR_OPERATION_MATMUL_BDESC:
      return tensor(op.b);
    case CUDNN_ATTR_OPERATION_POINTWISE_TDESC: return tensor(op.t);
    case CUDNN_ATTR_OPERATION_POINTWISE_YDESC: case CUDNN_ATTR_OPERATION_MATMUL_CDESC:
    case CUDNN_ATTR_OPERATION_REDUCTION_YDESC: case CUDNN_ATTR_OPERATION_RESHAPE_YDESC:
      return tensor(op.y);
    default: return CUDNN_STATUS_BAD_PARAM;
  }
}

bool is_operation(cudnnBackendDescriptorType_t t) {
  return t == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
}

cudnnStatus_t set_attribute(Descriptor& d, cudnnBackendAttributeName_t name,
                            cudnnBackendAttributeType_t type, std::int64_t n, const void* p) {
  if (is_operation(d.type)) return set_operation(d, name, type, n, p);
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return set_tensor(d.tensor, name, type, n, p);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      if (name == CUDNN_ATTR_POINTWISE_MODE)
        return (d.pointwise.mode_set = take(type, CUDNN_TYPE_POINTWISE_MODE, n, p, d.pointwise.mode))
                   ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
      if (name == CUDNN_ATTR_POINTWISE_MATH_PREC)
        return take(type, CUDNN_TYPE_DATA_TYPE, n, p, d.pointwise.precision) ? CUDNN_STATUS_SUCCESS
                                                                              : CUDNN_STATUS_BAD_PARAM;
      if (name == CUDNN_ATTR_POINTWISE_AXIS)
        return take(type, CUDNN_TYPE_INT64, n, p, d.pointwise.axis) ? CUDNN_STATUS_SUCCESS
                                                                     : CUDNN_STATUS_BAD_PARAM;
      return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
      if (name == CUDNN_ATTR_MATMUL_COMP_TYPE)
        return (d.matmul_precision_set = take(type, CUDNN_TYPE_DATA_TYPE, n, p, d.matmul_precision))
                   ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
      return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
      if (name == CUDNN_ATTR_REDUCTION_OPERATOR)
        return (d.reduction.op_set = take(type, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, n, p, d.reduction.op))
                   ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
      if (name == CUDNN_ATTR_REDUCTION_COMP_TYPE)
        return take(type, CUDNN_TYPE_DATA_TYPE, n, p, d.reduction.precision) ? CUDNN_STATUS_SUCCESS
                                                                              : CUDNN_STATUS_BAD_PARAM;
      return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
      if (name == CUDNN_ATTR_OPERATIONGRAPH_HANDLE)
        return take(type, CUDNN_TYPE_HANDLE, n, p, d.graph_handle) ? CUDNN_STATUS_SUCCESS
                                                                   : CUDNN_STATUS_BAD_PARAM;
      if (name == CUDNN_ATTR_OPERATIONGRAPH_OPS && type == CUDNN_TYPE_BACKEND_DESCRIPTOR && n > 0 &&
          p != nullptr) {
        d.graph_ops.clear();
        for (std::int64_t i = 0; i < n; ++i) {
          const Descriptor* op = as_desc(static_cast<void* const*>(p)[i]);
          if (op == nullptr || !is_operation(op->type) || !op->finalized) return CUDNN_STATUS_BAD_PARAM;
          d.graph_ops.push_back(op->op);
        }
        return CUDNN_STATUS_SUCCESS;
      }
      return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      if (name == CUDNN_ATTR_ENGINEHEUR_MODE)
        return (d.heur_mode_set = take(type, CUDNN_TYPE_HEUR_MODE, n, p, d.heur_mode))
                   ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
      if (name == CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) {
        const Descriptor* g = named(type, n, p, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        if (g == nullptr) return CUDNN_STATUS_BAD_PARAM;
        d.graph = g->graph;
        return CUDNN_STATUS_SUCCESS;
      }
      return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
      if (name == CUDNN_ATTR_EXECUTION_PLAN_HANDLE)
        return take(type, CUDNN_TYPE_HANDLE, n, p, d.plan_handle) ? CUDNN_STATUS_SUCCESS
                                                                  : CUDNN_STATUS_BAD_PARAM;
      if (name == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG) {
        const Descriptor* cfg = named(type, n, p, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (cfg == nullptr) return CUDNN_STATUS_BAD_PARAM;
        d.graph = cfg->graph;
        d.config_set = true;
        return CUDNN_STATUS_SUCCESS;
      }
      return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      if (name == CUDNN_ATTR_VARIANT_PACK_WORKSPACE)
        return take(type, CUDNN_TYPE_VOID_PTR, n, p, d.pack.workspace) ? CUDNN_STATUS_SUCCESS
                                                                       : CUDNN_STATUS_BAD_PARAM;
      if (name == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS && type == CUDNN_TYPE_INT64 && n > 0 && p) {
        const auto* v = static_cast<const std::int64_t*>(p);
        d.pack.uids.assign(v, v + n);
        return CUDNN_STATUS_SUCCESS;
      }
      if (name == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS && type == CUDNN_TYPE_VOID_PTR && n > 0 && p) {
        const auto* v = static_cast<void* const*>(p);
        d.pack.pointers.assign(v, v + n);
        return CUDNN_STATUS_SUCCESS;
      }
      return CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
      if (name == CUDNN_ATTR_ENGINECFG_ENGINE) {
        const Descriptor* e = named(type, n, p, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        if (e == nullptr) return CUDNN_STATUS_BAD_PARAM;
        d.graph = e->graph;
        return CUDNN_STATUS_SUCCESS;
      }
      return CUDNN_STATUS_BAD_PARAM;
    default: return CUDNN_STATUS_BAD_PARAM;
  }
}

cudnnStatus_t finalize(Descriptor& d) {
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return finalize_tensor(d.tensor);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
      return d.pointwise.mode_set ? CUDNN_STATUS_SUCCESS
                                  : refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(POINTWISE)",
                                           "no mode");
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
      return d.matmul_precision_set ? CUDNN_STATUS_SUCCESS
                                    : refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(MATMUL)",
                                             "no compute type");
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
      return d.reduction.op_set ? CUDNN_STATUS_SUCCESS
                                : refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(REDUCTION)",
                                         "no operator");
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
      if (!valid_handle(d.graph_handle))
        return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(OPERATIONGRAPH)", "no handle");
      auto g = std::make_shared<Graph>();
      g->device = d.graph_handle->device;
      if (const cudnnStatus_t rc = make_graph(d.graph_ops, *g)) return rc;
      d.graph = std::move(g);
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
      return (d.graph && d.heur_mode_set) ? CUDNN_STATUS_SUCCESS
                                           : refuse(CUDNN_STATUS_BAD_PARAM,
                                                    "cudnnBackendFinalize(ENGINEHEUR)",
                                                    "needs an operation graph and a mode");
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
      return d.graph ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
      const char* call = "cudnnBackendFinalize(EXECUTION_PLAN)";
      if (!valid_handle(d.plan_handle) || !d.config_set || !d.graph)
        return refuse(CUDNN_STATUS_BAD_PARAM, call, "needs a handle and an engine configuration");
      if (const cudnnStatus_t rc = engine_takes(*d.graph, call)) return rc;
      d.plan = make_plan(d.graph);
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
      return d.pack.uids.size() == d.pack.pointers.size() && !d.pack.uids.empty()
                 ? CUDNN_STATUS_SUCCESS
                 : refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize(VARIANT_PACK)",
                          "as many data pointers as unique ids are needed");
    default:
      return is_operation(d.type) ? finalize_operation(d) : CUDNN_STATUS_BAD_PARAM;
  }
}

// Why `p` cannot hold `bytes` of device memory of `device` ("" when it can).
std::string device_span_problem(const void* p, std::size_t bytes, int device) {
  const std::optional<cuda_emu::Region> r = cuda_emu::find_region(p);
  if (!r || r->kind != cuda_emu::MemoryKind::device)
    return cat(p, " is ", cuda_emu::kind_name(cuda_emu::kind_of(p)), ", not device memory");
  if (r->device != device) return cat(p, " is memory of another device");
  if (static_cast<const char*>(p) + bytes > r->base + r->bytes)
    return cat(p, " is ", bytes, " bytes past the end of its allocation");
  return "";
}

cudnnStatus_t execute(cudnnHandle_t h, const Plan& plan, const VariantPack& pack) {
  const char* call = "cudnnBackendExecute";
  Storages st;
  const Graph& g = *plan.graph;
  for (const auto& [uid, t] : g.tensors) {
    Storage s;
    if (t.is_virtual) {
      if (pack.workspace == nullptr && plan.workspace > 0)
        return refuse(CUDNN_STATUS_BAD_PARAM, call, "the plan needs a workspace");
      s.base = static_cast<char*>(pack.workspace) + plan.virtual_offset.at(uid);
      s.floats = true;
    } else {
      const auto it = std::find(pack.uids.begin(), pack.uids.end(), uid);
      if (it == pack.uids.end())
        return refuse(CUDNN_STATUS_BAD_PARAM, call, cat("no data pointer for tensor uid ", uid));
      void* ptr = pack.pointers[static_cast<std::size_t>(it - pack.uids.begin())];
      if (ptr == nullptr) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, call, cat("uid ", uid));
      if (t.by_value) {
        // cuDNN reads a by-value scalar from host memory when the call is made.
        if (t.type != CUDNN_DATA_FLOAT || elements(t) != 1)
          return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, call, "by-value scalars are one FP32");
        std::memcpy(&s.scalar, ptr, sizeof(float));
        s.by_value = true;
      } else {
        const std::size_t bytes = static_cast<std::size_t>(extent_elements(t)) * type_bytes(t.type);
        if (const std::string why = device_span_problem(ptr, bytes, h->device); !why.empty())
          return refuse(CUDNN_STATUS_BAD_PARAM, call, cat("tensor uid ", uid, ": ", why));
        if (t.alignment > 0 && reinterpret_cast<std::uintptr_t>(ptr) % t.alignment != 0)
          return refuse(CUDNN_STATUS_BAD_PARAM, call,
                        cat("tensor uid ", uid, " is not at its byte alignment ", t.alignment));
        s.base = static_cast<char*>(ptr);
      }
    }
    st[uid] = s;
  }
  if (plan.workspace > 0) {
    if (const std::string why = device_span_problem(pack.workspace, plan.workspace, h->device);
        !why.empty())
      return refuse(CUDNN_STATUS_BAD_PARAM, call, "the workspace: " + why);
  }
  std::shared_ptr<const Graph> graph = plan.graph;
  const cudaError_t rc = cuda_emu::enqueue(h->stream, "cudnnBackendExecute (fused attention)",
                                           [graph, st] { run_graph(*graph, st); });
  if (rc != cudaSuccess)
    return refuse(CUDNN_STATUS_EXECUTION_FAILED, call,
                  cat("the work could not be queued: ", cudaGetErrorName(rc)));
  // Work counts (PDTRAIN_CUDA_EMU_COUNTS): one call, its matmuls' FLOPs (2 M N K each, the
  // whole T x T square: a fused kernel skips the masked half).
  std::uint64_t flops = 0;
  for (const Operation& op : g.ops)
    if (op.kind == OpKind::matmul)
      flops += 2 * static_cast<std::uint64_t>(elements(*op.y)) *
               static_cast<std::uint64_t>(op.x->dims.back());
  cuda_emu::count_work("cudnn", cat("attention graph of ", g.ops.size(), " operations"), 0, flops, 0);
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND: return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH: return "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnCreate", "null");
  if (cuda_emu::visible_device_count() == 0)
    return refuse(CUDNN_STATUS_NOT_INITIALIZED, "cudnnCreate", "no CUDA device is visible");
  auto* h = new cudnnContext;
  h->magic = kHandleMagic;
  h->device = cuda_emu::current_device();
  *handle = h;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (!valid_handle(handle))
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy", "not a cuDNN handle");
  handle->magic = 0;
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  if (!valid_handle(handle))
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream", "not a cuDNN handle");
  if (cuda_emu::device_of(streamId) != handle->device)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream",
                  "the stream belongs to another device than the handle's");
  handle->stream = streamId;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                           cudnnBackendDescriptor_t* descriptor) {
  if (descriptor == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  switch (descriptorType) {
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
      break;
    default:
      return refuse(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendCreateDescriptor",
                    cat("descriptor type ", static_cast<int>(descriptorType),
                        " is outside the emulation's subset"));
  }
  auto* d = new Descriptor;
  d->type = descriptorType;
  *descriptor = d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
  Descriptor* d = as_desc(descriptor);
  if (d == nullptr) return CUDNN_STATUS_BAD_PARAM;
  d->magic = 0;
  delete d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
  Descriptor* d = as_desc(descriptor);
  if (d == nullptr) return CUDNN_STATUS_BAD_PARAM;
  if (d->finalized) return CUDNN_STATUS_BAD_PARAM;
  const cudnnStatus_t rc = finalize(*d);
  d->finalized = rc == CUDNN_STATUS_SUCCESS;
  return rc;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType,
                                       int64_t elementCount, const void* arrayOfElements) {
  Descriptor* d = as_desc(descriptor);
  if (d == nullptr) return CUDNN_STATUS_BAD_PARAM;
  if (d->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute",
                  "the descriptor is finalized already");
  const cudnnStatus_t rc = set_attribute(*d, attributeName, attributeType, elementCount, arrayOfElements);
  if (rc != CUDNN_STATUS_SUCCESS)
    return refuse(rc, "cudnnBackendSetAttribute",
                  cat("attribute ", static_cast<int>(attributeName), " of type ",
                      static_cast<int>(attributeType), " x ", elementCount,
                      " does not fit descriptor type ", static_cast<int>(d->type)));
  return rc;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType,
                                       int64_t requestedElementCount, int64_t* elementCount,
                                       void* arrayOfElements) {
  const Descriptor* d = as_desc(descriptor);
  if (d == nullptr || !d->finalized) return CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED;
  const char* call = "cudnnBackendGetAttribute";
  // Heuristics' results: the one engine configuration, written into the caller's ENGINECFG.
  if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && attributeName == CUDNN_ATTR_ENGINEHEUR_RESULTS &&
      attributeType == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
    if (elementCount != nullptr) *elementCount = 1;
    if (requestedElementCount >= 1 && arrayOfElements != nullptr) {
      Descriptor* cfg = as_desc(static_cast<void**>(arrayOfElements)[0]);
      if (cfg == nullptr || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
        return refuse(CUDNN_STATUS_BAD_PARAM, call, "results go into ENGINECFG descriptors");
      cfg->graph = d->graph;
      cfg->finalized = true;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  // An engine configuration's engine, for its numerical notes.
  if (d->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && attributeName == CUDNN_ATTR_ENGINECFG_ENGINE &&
      attributeType == CUDNN_TYPE_BACKEND_DESCRIPTOR && requestedElementCount >= 1 &&
      arrayOfElements != nullptr) {
    Descriptor* e = as_desc(static_cast<void**>(arrayOfElements)[0]);
    if (e == nullptr || e->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
    e->graph = d->graph;
    e->finalized = true;
    if (elementCount != nullptr) *elementCount = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  if (d->type == CUDNN_BACKEND_ENGINE_DESCRIPTOR && attributeName == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE &&
      attributeType == CUDNN_TYPE_NUMERICAL_NOTE) {
    if (elementCount != nullptr) *elementCount = 1;
    if (requestedElementCount >= 1 && arrayOfElements != nullptr)
      static_cast<cudnnBackendNumericalNote_t*>(arrayOfElements)[0] = CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
    return CUDNN_STATUS_SUCCESS;
  }
  if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
      attributeName == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE && attributeType == CUDNN_TYPE_INT64 &&
      requestedElementCount >= 1 && arrayOfElements != nullptr) {
    *static_cast<std::int64_t*>(arrayOfElements) = static_cast<std::int64_t>(d->plan->workspace);
    if (elementCount != nullptr) *elementCount = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  return refuse(CUDNN_STATUS_NOT_SUPPORTED, call,
                cat("attribute ", static_cast<int>(attributeName),
                    " is outside the emulation's subset"));
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack) {
  if (!valid_handle(handle))
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute", "not a cuDNN handle");
  const Descriptor* plan = as_desc(executionPlan);
  const Descriptor* pack = as_desc(variantPack);
  if (plan == nullptr || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || !plan->finalized ||
      pack == nullptr || pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR || !pack->finalized)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute",
                  "needs a finalized execution plan and variant pack");
  return execute(handle, *plan->plan, pack->pack);
}

}  // extern "C"
