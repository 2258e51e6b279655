// The emulated cuBLASLt (include/cublasLt.h): descriptors, the heuristic, cublasLtMatmul. The
// arithmetic is gemm_emulated.cpp's; this file decides what is accepted, which algorithm runs,
// and queues the work in stream order (cuda_emu::enqueue).
//
// NVIDIA's documentation this follows (cuBLAS 12/13, "cuBLASLt API"):
// - cublasLtMatmul() "Datatypes Supported" table: with CUBLAS_COMPUTE_32F[_PEDANTIC] and scale
//   type CUDA_R_32F, Atype/Btype CUDA_R_32F -> Ctype CUDA_R_32F, and Atype/Btype CUDA_R_16BF ->
//   Ctype CUDA_R_16BF or CUDA_R_32F (bias type = Ctype). A and B share one type; a mix (fp32 A,
//   bf16 B) is in no row. Anything outside the table: CUBLAS_STATUS_NOT_SUPPORTED ("the current
//   implementation ... doesn't support the configured operation"). Rows of the table the
//   emulation does not run (fp16, int8, complex, fp8, TF32/fast compute, fp64) are refused the
//   same way, with a message saying so.
// - cublasLtMatmul() note: in place needs "C == D and Cdesc == Ddesc"; out of place, C and D
//   "must have the same data type, number of rows, number of columns, batch size, and memory
//   order", C's leading dimension may differ and may be 0 (broadcast). A conflict is
//   CUBLAS_STATUS_INVALID_VALUE ("parameters ... in conflict or in an impossible configuration").
// - CUBLASLT_MATRIX_LAYOUT_LD: "must be large enough so that matrix memory locations are not
//   overlapping (e.g. greater or equal to CUBLASLT_MATRIX_LAYOUT_ROWS in case of
//   CUBLASLT_ORDER_COL)": ld < rows is CUBLAS_STATUS_INVALID_VALUE.
// - "workspaceSizeInBytes is less than workspace required by the configured algo":
//   CUBLAS_STATUS_INVALID_VALUE; the workspace "Must be 256B aligned".
// - Parameters table: A, B, C, D are "Device" memory. The emulation checks each against the
//   tracked allocations (device memory of the stream's device, large enough for the layout):
//   host memory where a GPU would fault is refused with CUBLAS_STATUS_INVALID_VALUE and a line
//   on stderr, without queueing anything.
// - CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: GELU input matrix ld "Must be divisible by 8 and be no
//   less than the number of rows in the output matrix"; EPILOGUE_AUX_BATCH_STRIDE "Must be
//   divisible by 8"; EPILOGUE_AUX_DATA_TYPE and the A/B/C/D scale and amax pointers: "If set for
//   an unsupported ... combination, calling cublasLtMatmul() will return CUBLAS_INVALID_VALUE".
// - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES: "Selecting a smaller value will exclude
//   algorithms that can not work with matrix A, which is not as strictly aligned as the
//   algorithms need. Default is 256 bytes." CUBLASLT_MATMUL_DESC_BIAS_POINTER / _AUX_POINTER:
//   "Routines that don't dereference this pointer, like cublasLtMatmulAlgoGetHeuristic() depend
//   on its value to determine expected pointer alignment."
// - "Tensor Core Usage": the best performance when (lda * AtypeSize) % 16 == 0, ... and
//   intptr_t(A) % 16 == 0, ... (NVIDIA adds that, aside from FP8, cuBLAS >= 11.0 has no hard
//   alignment requirement for Tensor Cores: the emulation's rule below is stricter on purpose).
//
// The heuristic's model (three algorithms, cublasLtMatmulAlgo_t records which):
//   algorithm 2, "wide" (CUBLASLT_ALGO_CONFIG_ID 2, eight partial sums): needs A, B, C, D at
//     128-byte alignment (as the MIN_ALIGNMENT preferences tell; default 256), lda/ldb/ldc/ldd
//     and the batch strides in bytes multiples of 128, and the bias and aux pointers (and aux ld
//     and batch strides) as algorithm 0 does (16 bytes). It takes fp32 and bf16 inputs. It is the
//     heuristic's first choice where it applies.
//   algorithm 0, "aligned" (CUBLASLT_ALGO_CONFIG_ID 0, four partial sums): needs A, B, C, D at
//     16-byte alignment (as the MIN_ALIGNMENT preferences tell), lda/ldb/ldc/ldd and the batch
//     strides in bytes multiples of 16, and the bias and aux pointers (and aux ld and batch
//     strides) likewise. It takes fp32 and bf16 inputs.
//   algorithm 1, "generic" (CUBLASLT_ALGO_CONFIG_ID 1, in-order sum): needs only each matrix's
//     element-size alignment, but does not take bf16 inputs: the model of bf16 tensor-core
//     kernels that need 16-byte operands. So a bf16 GEMM whose operands, leading dimensions or
//     strides are not 16-byte compatible gets no algorithm (CUBLAS_STATUS_NOT_SUPPORTED and
//     returnAlgoCount 0, the answer PyTorch met for 2-byte-aligned bf16 operands, pytorch#92201).
//   The heuristic lists the eligible ones in the order 2, 0, 1 (at most requestedAlgoCount of
//   them). This models NVIDIA's documented behaviour that the heuristic's choice depends on the
//   alignment preferences (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default 256: "Selecting a
//   smaller value will exclude algorithms that can not work with matrix A, which is not as
//   strictly aligned as the algorithms need"): the same shape asked for with 256-byte and with
//   16-byte alignment preferences gets algorithm 2 and algorithm 0, whose bits differ. A caller
//   that wants one shape to give the same bits wherever its tensors lie must cap the alignment
//   it states (e.g. at 16) so that every call site asks alike. cublasLtMatmul refuses an
//   algorithm whose requirement the actual pointers, leading dimensions or strides do not meet
//   with CUBLAS_STATUS_NOT_SUPPORTED (what a misaligned cuBLASLt call returns on a GPU, ibid.).
//   Workspace: both need none, except BGRADA/BGRADB: 4 bytes per bias element (their fp32 sums
//   go through the workspace); an algorithm needing more than MAX_WORKSPACE_BYTES is not listed.
//
// Where the documentation leaves a choice open, the emulation's:
// - algo == NULL ("an implicit heuristics query with default search preferences"): the query
//   takes the actual pointers' alignments (at most 256) and workspaceSizeInBytes as limits.
// - BGRADA / BGRADB store (not accumulate) the plain sums of op(A)'s rows / op(B)'s columns over
//   k (not scaled by alpha), in the bias type; D is the ordinary product.
// - Outputs (D, the AUX output, a bias gradient) that overlap an input other than C == D in place
//   are refused (INVALID_VALUE): a GPU's result would depend on the order its blocks ran. So are
//   D batches that overlap each other.
// - m or n of 0: checked, nothing queued, CUBLAS_STATUS_SUCCESS.
// - The handle is not tied to a device (as NVIDIA documents); the matrices must be memory of
//   the stream's device.
#include <cublasLt.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <sstream>
#include <string>

#include "emulator.hpp"
#include "gemm_emulated.hpp"

using cuda_emu::blas::Algo;
using cuda_emu::blas::Elem;

namespace {

namespace blas = cuda_emu::blas;

constexpr std::uint32_t kLayoutMagic = 0x4c61794fu;           // "LayO"
constexpr std::uint32_t kDescMagic = 0x44657363u;             // "Desc"
constexpr std::uint32_t kPrefMagic = 0x50726566u;             // "Pref"
constexpr std::uint64_t kAlgoMagic = 0x70647472'416c676full;  // "pdtrAlgo"
constexpr int kAlgoCount = 3;  // lt_vec16, lt_generic, lt_wide (their ids)

struct Layout {
  std::uint32_t magic = kLayoutMagic;
  std::int32_t type = CUDA_R_32F;
  std::int32_t order = CUBLASLT_ORDER_COL;
  std::int32_t batch = 1;
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
  std::int64_t stride = 0;
  std::int64_t plane_offset = 0;
};
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));

struct Desc {
  std::uint32_t magic = kDescMagic;
  std::int32_t compute = CUBLAS_COMPUTE_32F;
  std::int32_t scale = CUDA_R_32F;
  std::int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  std::int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
  std::int32_t fill = CUBLAS_FILL_MODE_FULL;
  std::uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  std::int32_t sm_count = 0;
  const void* bias = nullptr;
  std::int64_t bias_stride = 0;
  const void* aux = nullptr;
  std::int64_t aux_ld = 0, aux_stride = 0;
  std::int64_t alpha_vector_stride = 0;
  const void* scale_ptr[4] = {nullptr, nullptr, nullptr, nullptr};  // A, B, C, D
  const void* amax_d = nullptr;
  const void* aux_scale = nullptr;
  const void* aux_amax = nullptr;
  std::int32_t aux_type = -1, bias_type = -1;
  std::int8_t fast_accum = 0;
  std::int32_t sync_rows = 0, sync_cols = 0;
  const void* sync_in = nullptr;
  const void* sync_out = nullptr;
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));

struct Pref {
  std::uint32_t magic = kPrefMagic;
  std::uint32_t search_mode = CUBLASLT_SEARCH_BEST_FIT;
  std::uint64_t max_workspace = 0;
  std::uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
  std::uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
  float max_waves = 0.0f;
  std::uint64_t impl_mask = ~std::uint64_t{0};
};
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t));

template <class T, class Opaque>
T* state_of(Opaque* o) {
  return std::launder(reinterpret_cast<T*>(o->data));
}

template <class T, class Opaque>
T* checked(Opaque* o, std::uint32_t magic) {
  if (o == nullptr) return nullptr;
  T* s = state_of<T>(o);
  return s->magic == magic ? s : nullptr;
}

Layout* layout_of(cublasLtMatrixLayout_t l) { return checked<Layout>(l, kLayoutMagic); }
Desc* desc_of(cublasLtMatmulDesc_t d) { return checked<Desc>(d, kDescMagic); }
Pref* pref_of(cublasLtMatmulPreference_t p) { return checked<Pref>(p, kPrefMagic); }

bool valid_handle(cublasLtHandle_t h) { return h != nullptr && h->magic == blas::kLtHandleMagic; }

using blas::cat;
using blas::refuse;

// SetAttribute / GetAttribute of a plain value: NVIDIA's size rules.
template <class T>
cublasStatus_t set_value(T& field, const void* buf, std::size_t size) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t get_bytes(const void* value, std::size_t value_size, void* buf, std::size_t size,
                         std::size_t* written) {
  if (size == 0) {
    if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *written = value_size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || size != value_size) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, value, value_size);
  if (written != nullptr) *written = value_size;
  return CUBLAS_STATUS_SUCCESS;
}

template <class T>
cublasStatus_t get_value(const T& field, void* buf, std::size_t size, std::size_t* written) {
  return get_bytes(&field, sizeof(T), buf, size, written);
}

const char* type_name(int t) {
  switch (t) {
    case CUDA_R_32F:
      return "CUDA_R_32F";
    case CUDA_R_16BF:
      return "CUDA_R_16BF";
    case CUDA_R_16F:
      return "CUDA_R_16F";
    case CUDA_R_64F:
      return "CUDA_R_64F";
    case CUDA_R_8I:
      return "CUDA_R_8I";
    case CUDA_R_32I:
      return "CUDA_R_32I";
    case CUDA_R_8F_E4M3:
      return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2:
      return "CUDA_R_8F_E5M2";
    case CUDA_C_32F:
      return "CUDA_C_32F";
    default:
      return "another cudaDataType";
  }
}

Elem elem_of(int t) { return t == CUDA_R_16BF ? Elem::bf16 : Elem::f32; }

// The datatype table (see the top of the file). C and D must already share a type.
cublasStatus_t check_types(const char* call, int compute, int scale, int a, int b, int cd) {
  if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat("compute type ", compute,
                      " is not emulated (only CUBLAS_COMPUTE_32F and CUBLAS_COMPUTE_32F_PEDANTIC: "
                      "fp32 accumulation, no TF32)"));
  }
  if (scale != CUDA_R_32F) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat("scale type ", type_name(scale),
                      " with CUBLAS_COMPUTE_32F is in no row of cublasLtMatmul's datatype table "
                      "(scale type CUDA_R_32F)"));
  }
  if (a != b) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat("A is ", type_name(a), " but B is ", type_name(b),
                      ": cublasLtMatmul's datatype table has one Atype/Btype per row"));
  }
  if (a == CUDA_R_32F && cd == CUDA_R_32F) return CUBLAS_STATUS_SUCCESS;
  if (a == CUDA_R_16BF && (cd == CUDA_R_16BF || cd == CUDA_R_32F)) return CUBLAS_STATUS_SUCCESS;
  if (a == CUDA_R_32F || a == CUDA_R_16BF) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat("A/B ", type_name(a), " with C/D ", type_name(cd),
                      " is in no row of cublasLtMatmul's datatype table for CUBLAS_COMPUTE_32F "
                      "(CUDA_R_32F -> CUDA_R_32F, CUDA_R_16BF -> CUDA_R_16BF or CUDA_R_32F)"));
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                cat("A/B ", type_name(a), " with C/D ", type_name(cd),
                    " is not emulated (only CUDA_R_32F and CUDA_R_16BF inputs)"));
}

std::uint64_t fingerprint(int compute, int scale, int a, int b, int c, int d) {
  auto byte = [](int v) { return static_cast<std::uint64_t>(static_cast<std::uint8_t>(v)); };
  return byte(compute) | byte(scale) << 8 | byte(a) << 16 | byte(b) << 24 | byte(c) << 32 |
         byte(d) << 40;
}

cublasLtMatmulAlgo_t make_algo(Algo algo, std::uint64_t types) {
  cublasLtMatmulAlgo_t out{};
  out.data[0] = kAlgoMagic;
  out.data[1] = static_cast<std::uint64_t>(algo);
  out.data[2] = types;
  return out;
}

// Everything the descriptors say, checked (the GEMM's pointers come later).
struct Problem {
  blas::Gemm g;
  std::uint64_t types = 0;
  int a_type = 0, b_type = 0, cd_type = 0;
  std::int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
  bool device_scalars = false;
  bool bias_used = false, aux_used = false;
  std::int64_t bias_len = 0;
  const Layout* c_layout = nullptr;
  const Layout* d_layout = nullptr;
};

bool same_layout(const Layout& x, const Layout& y) {
  return x.type == y.type && x.order == y.order && x.rows == y.rows && x.cols == y.cols &&
         x.ld == y.ld && x.batch == y.batch && (x.batch <= 1 || x.stride == y.stride);
}

cublasStatus_t check_layout(const char* call, const char* name, const Layout& l, bool ld_zero_ok) {
  if (l.order != CUBLASLT_ORDER_COL) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat(name, "'s order ", l.order, " is not emulated (only CUBLASLT_ORDER_COL)"));
  }
  if (l.plane_offset != 0) {
    return refuse(
        CUBLAS_STATUS_NOT_SUPPORTED, call,
        cat(name, " is planar complex (PLANE_OFFSET ", l.plane_offset, "): not emulated"));
  }
  if (l.rows > 0x7fffffffu || l.cols > 0x7fffffffu) {
    return refuse(
        CUBLAS_STATUS_NOT_SUPPORTED, call,
        cat(name, " is ", l.rows, " x ", l.cols, ": only sizes that fit int32_t are supported"));
  }
  const std::int64_t rows = static_cast<std::int64_t>(l.rows);
  if (!(ld_zero_ok && l.ld == 0) && l.ld < (rows > 1 ? rows : 1)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat(name, "'s leading dimension ", l.ld, " is less than its ", rows,
                      " rows (CUBLASLT_MATRIX_LAYOUT_LD must be >= ROWS for CUBLASLT_ORDER_COL)"));
  }
  if (l.batch < 1) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat(name, "'s batch count ", l.batch, " is less than 1"));
  }
  if (l.stride < 0) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat(name, "'s batch stride ", l.stride, " is negative: not emulated"));
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t resolve(const char* call, cublasLtMatmulDesc_t desc_h, cublasLtMatrixLayout_t ah,
                       cublasLtMatrixLayout_t bh, cublasLtMatrixLayout_t ch,
                       cublasLtMatrixLayout_t dh, Problem& pr) {
  const Desc* desc = desc_of(desc_h);
  if (desc == nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the matmul descriptor is null or not one");
  }
  if (ch == nullptr)
    ch = dh;  // "If Cdesc is omitted, this function assumes it to be equal to Ddesc."
  const Layout* a = layout_of(ah);
  const Layout* b = layout_of(bh);
  const Layout* c = layout_of(ch);
  const Layout* d = layout_of(dh);
  if (a == nullptr || b == nullptr || c == nullptr || d == nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  "a matrix layout (Adesc, Bdesc, Cdesc or Ddesc) is null or not one");
  }
  pr.c_layout = c;
  pr.d_layout = d;

  // Types.
  if (c->type != d->type) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat("C is ", type_name(c->type), " but D is ", type_name(d->type),
                      ": C and D must have the same data type"));
  }
  if (const cublasStatus_t rc =
          check_types(call, desc->compute, desc->scale, a->type, b->type, d->type)) {
    return rc;
  }
  pr.a_type = a->type;
  pr.b_type = b->type;
  pr.cd_type = d->type;
  pr.types = fingerprint(desc->compute, desc->scale, a->type, b->type, c->type, d->type);

  // Operation attributes.
  if (desc->pointer_mode != CUBLASLT_POINTER_MODE_HOST &&
      desc->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat("pointer mode ", desc->pointer_mode,
                      " is not emulated (only CUBLASLT_POINTER_MODE_HOST and _DEVICE)"));
  }
  pr.device_scalars = desc->pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
  auto op_ok = [](std::int32_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  if (!op_ok(desc->transa) || !op_ok(desc->transb)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat("TRANSA ", desc->transa, " / TRANSB ", desc->transb,
                      " is not a cublasOperation_t the GEMM takes"));
  }
  if (desc->transc != CUBLAS_OP_N) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  "TRANSC must be CUBLAS_OP_N (\"Currently only CUBLAS_OP_N is supported\")");
  }
  if (desc->fill != CUBLAS_FILL_MODE_FULL) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  "FILL_MODE other than CUBLAS_FILL_MODE_FULL is not emulated");
  }
  if (desc->scale_ptr[0] != nullptr || desc->scale_ptr[1] != nullptr ||
      desc->scale_ptr[2] != nullptr || desc->scale_ptr[3] != nullptr || desc->amax_d != nullptr ||
      desc->aux_scale != nullptr || desc->aux_amax != nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  "a scale or amax pointer is set: they are for FP8 types only (\"If set for an "
                  "unsupported ... combination, calling cublasLtMatmul() will return "
                  "CUBLAS_INVALID_VALUE\")");
  }
  if (desc->sync_rows != 0 || desc->sync_cols != 0 || desc->sync_in != nullptr ||
      desc->sync_out != nullptr) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "atomic synchronization is not emulated");
  }

  // Shapes. op(A) is m x k, op(B) k x n, C and D m x n.
  if (const cublasStatus_t rc = check_layout(call, "A", *a, false)) return rc;
  if (const cublasStatus_t rc = check_layout(call, "B", *b, false)) return rc;
  if (const cublasStatus_t rc = check_layout(call, "D", *d, false)) return rc;
  if (const cublasStatus_t rc = check_layout(call, "C", *c, c != d)) return rc;
  blas::Gemm& g = pr.g;
  g.trans_a = desc->transa != CUBLAS_OP_N;
  g.trans_b = desc->transb != CUBLAS_OP_N;
  pr.a_rows = static_cast<std::int64_t>(a->rows);
  pr.a_cols = static_cast<std::int64_t>(a->cols);
  pr.b_rows = static_cast<std::int64_t>(b->rows);
  pr.b_cols = static_cast<std::int64_t>(b->cols);
  const std::int64_t m = g.trans_a ? pr.a_cols : pr.a_rows;
  const std::int64_t k = g.trans_a ? pr.a_rows : pr.a_cols;
  const std::int64_t kb = g.trans_b ? pr.b_cols : pr.b_rows;
  const std::int64_t n = g.trans_b ? pr.b_rows : pr.b_cols;
  const auto d_rows = static_cast<std::int64_t>(d->rows);
  const auto d_cols = static_cast<std::int64_t>(d->cols);
  if (k != kb || d_rows != m || d_cols != n) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat("shapes do not match: op(A) is ", m, " x ", k, ", op(B) ", kb, " x ", n,
                      ", D ", d_rows, " x ", d_cols));
  }
  if (c->rows != d->rows || c->cols != d->cols || c->batch != d->batch) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat("C is ", c->rows, " x ", c->cols, " (batch ", c->batch, ") but D is ",
                      d->rows, " x ", d->cols, " (batch ", d->batch,
                      "): C and D must have the same number of rows, columns and batch size"));
  }
  if (a->batch != d->batch || b->batch != d->batch) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat("batch counts differ: A ", a->batch, ", B ", b->batch, ", D ", d->batch));
  }
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = d->batch;
  g.a = {nullptr, elem_of(a->type), a->ld, a->batch > 1 ? a->stride : 0};
  g.b = {nullptr, elem_of(b->type), b->ld, b->batch > 1 ? b->stride : 0};
  g.c = {nullptr, elem_of(c->type), c->ld, c->batch > 1 ? c->stride : 0};
  g.d_type = elem_of(d->type);
  g.ldd = d->ld;
  g.stride_d = d->batch > 1 ? d->stride : 0;
  if (!blas::batches_disjoint(m, n, g.ldd, g.stride_d, g.batch)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat("D's batch stride ", g.stride_d, " makes its ", g.batch,
                      " matrices overlap (each spans ", (n - 1) * g.ldd + m,
                      " elements): a GPU's result would depend on the order its blocks ran"));
  }

  // Epilogue.
  const Elem d_elem = g.d_type;
  switch (desc->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      break;
    case CUBLASLT_EPILOGUE_BIAS:
      g.bias_add = true;
      break;
    case CUBLASLT_EPILOGUE_GELU:
      g.gelu = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_AUX:
      g.gelu = g.aux_out = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
      g.gelu = g.bias_add = true;
      break;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      g.gelu = g.aux_out = g.bias_add = true;
      break;
    case CUBLASLT_EPILOGUE_DGELU:
      g.dgelu = true;
      break;
    case CUBLASLT_EPILOGUE_BGRADA:
      g.bgrad_a = true;
      break;
    case CUBLASLT_EPILOGUE_BGRADB:
      g.bgrad_b = true;
      break;
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_RELU_AUX:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DRELU:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
    case CUBLASLT_EPILOGUE_DGELU_BGRAD:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                    cat("epilogue ", desc->epilogue,
                        " is not emulated (DEFAULT, BIAS, GELU, GELU_AUX, GELU_BIAS, "
                        "GELU_AUX_BIAS, DGELU, BGRADA, BGRADB are)"));
    default:
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                    cat("epilogue ", desc->epilogue, " is not a cublasLtEpilogue_t"));
  }
  pr.bias_used = g.bias_add || g.bgrad_a || g.bgrad_b;
  pr.aux_used = g.aux_out || g.dgelu;
  if (pr.bias_used) {
    if (desc->bias == nullptr) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                    "the epilogue needs CUBLASLT_MATMUL_DESC_BIAS_POINTER, which is not set");
    }
    // Bias type: the table's "Bias Type" column is Ctype; BIAS_DATA_TYPE -1 means D's type.
    if (desc->bias_type != -1 && desc->bias_type != pr.cd_type) {
      return refuse(
          CUBLAS_STATUS_NOT_SUPPORTED, call,
          cat("bias type ", type_name(desc->bias_type), " with C/D ", type_name(pr.cd_type),
              ": the datatype table's bias type is Ctype (the emulation takes no "
              "other)"));
    }
    if (desc->bias_stride < 0) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                    "a negative bias batch stride is not emulated");
    }
    g.bias = const_cast<void*>(desc->bias);
    g.bias_type = d_elem;
    g.bias_stride = g.batch > 1 ? desc->bias_stride : 0;
    pr.bias_len = g.bgrad_b ? n : m;
    if ((g.bgrad_a || g.bgrad_b) && g.batch > 1 && g.bias_stride < pr.bias_len) {
      return refuse(
          CUBLAS_STATUS_INVALID_VALUE, call,
          cat("the bias gradients of the ", g.batch, " batches overlap (bias batch stride ",
              g.bias_stride, ", ", pr.bias_len, " elements each)"));
    }
  }
  if (pr.aux_used) {
    if (desc->aux == nullptr) {
      return refuse(
          CUBLAS_STATUS_INVALID_VALUE, call,
          "the epilogue needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, which is not set");
    }
    if (desc->aux_ld < m || desc->aux_ld % 8 != 0) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                    cat("EPILOGUE_AUX_LD ", desc->aux_ld, " for ", m,
                        " rows: the GELU input matrix leading dimension \"Must be divisible by 8 "
                        "and be no less than the number of rows in the output matrix\""));
    }
    if (desc->aux_stride < 0 || desc->aux_stride % 8 != 0) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                    cat("EPILOGUE_AUX_BATCH_STRIDE ", desc->aux_stride,
                        " is not a non-negative multiple of 8 (\"Must be divisible by 8\")"));
    }
    if (desc->aux_type != -1 && desc->aux_type != pr.cd_type) {
      return refuse(
          CUBLAS_STATUS_INVALID_VALUE, call,
          cat("EPILOGUE_AUX_DATA_TYPE ", type_name(desc->aux_type), " with D of type ",
              type_name(pr.cd_type), ": only the default (D's type) is supported for these types"));
    }
    g.aux = const_cast<void*>(desc->aux);
    g.aux_type = d_elem;
    g.aux_ld = desc->aux_ld;
    g.aux_stride = g.batch > 1 ? desc->aux_stride : 0;
    if (g.aux_out && g.batch > 1 && n > 0 && g.aux_stride < (n - 1) * g.aux_ld + m) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                    cat("the GELU inputs of the ", g.batch,
                        " batches overlap (EPILOGUE_AUX_BATCH_STRIDE ", g.aux_stride, ")"));
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

std::uint64_t impl_flags(Algo algo, const Problem& pr) {
  const bool bf16 = pr.a_type == CUDA_R_16BF;
  std::uint64_t f = CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F;
  if ((algo == Algo::lt_vec16 || algo == Algo::lt_wide) && bf16) {
    f |= CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF;
  } else {
    f |= CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F;
  }
  return f;
}

// Whether `algo` can run `pr` when A, B, C, D are aligned to align[0..3] bytes (the bias and aux
// pointers are the descriptor's own). On false, *why says what fails.
bool eligible(Algo algo, const Problem& pr, const std::uint32_t align[4], std::string* why) {
  const blas::Gemm& g = pr.g;
  const char* names[4] = {"A", "B", "C", "D"};
  const std::size_t es[4] = {blas::elem_bytes(g.a.type), blas::elem_bytes(g.b.type),
                             blas::elem_bytes(g.c.type), blas::elem_bytes(g.d_type)};
  const std::int64_t lds[4] = {g.a.ld, g.b.ld, g.c.ld, g.ldd};
  const std::int64_t strides[4] = {g.a.stride, g.b.stride, g.c.stride, g.stride_d};
  if (algo == Algo::lt_generic) {
    if (pr.a_type == CUDA_R_16BF) {
      *why =
          "the generic algorithm takes no bf16 inputs (bf16 GEMMs run on tensor-core kernels "
          "that need 16-byte alignment)";
      return false;
    }
    for (int i = 0; i < 4; ++i) {
      if (align[i] % es[i] != 0) {
        *why = cat(names[i], " is ", align[i], "-byte aligned, less than its ", es[i],
                   "-byte elements");
        return false;
      }
    }
    auto elem_aligned = [](const void* p, std::size_t e) {
      return reinterpret_cast<std::uintptr_t>(p) % e == 0;
    };
    if (pr.bias_used && !elem_aligned(g.bias, blas::elem_bytes(g.bias_type))) {
      *why = "the bias pointer is not aligned to its element size";
      return false;
    }
    if (pr.aux_used && !elem_aligned(g.aux, blas::elem_bytes(g.aux_type))) {
      *why = "the aux pointer is not aligned to its element size";
      return false;
    }
    return true;
  }
  // lt_vec16: 16 bytes everywhere. lt_wide: 128 bytes for A, B, C, D (pointers, leading
  // dimensions, batch strides); the bias and aux rules are lt_vec16's.
  const std::size_t need = algo == Algo::lt_wide ? 128 : 16;
  const char* algo_word = algo == Algo::lt_wide ? "the wide algorithm" : "the aligned algorithm";
  for (int i = 0; i < 4; ++i) {
    if (align[i] % need != 0) {
      *why = cat(algo_word, " needs ", need, "-byte ", names[i], ", which is ", align[i],
                 "-byte aligned");
      return false;
    }
    if ((static_cast<std::size_t>(lds[i]) * es[i]) % need != 0) {
      *why = cat(algo_word, " needs leading dimensions of a multiple of ", need, " bytes; ",
                 names[i], "'s is ", lds[i], " elements of ", es[i], " bytes");
      return false;
    }
    if (g.batch > 1 && (static_cast<std::size_t>(strides[i]) * es[i]) % need != 0) {
      *why = cat(algo_word, " needs batch strides of a multiple of ", need, " bytes; ", names[i],
                 "'s is ", strides[i], " elements of ", es[i], " bytes");
      return false;
    }
  }
  if (pr.bias_used) {
    const std::size_t be = blas::elem_bytes(g.bias_type);
    if (blas::alignment_of(g.bias) % 16 != 0 ||
        (g.batch > 1 && (static_cast<std::size_t>(g.bias_stride) * be) % 16 != 0)) {
      *why =
          cat(algo_word, " needs a 16-byte aligned bias (and bias batch stride); the bias is ",
              blas::alignment_of(g.bias), "-byte aligned");
      return false;
    }
  }
  if (pr.aux_used) {
    const std::size_t ae = blas::elem_bytes(g.aux_type);
    if (blas::alignment_of(g.aux) % 16 != 0 ||
        (static_cast<std::size_t>(g.aux_ld) * ae) % 16 != 0 ||
        (g.batch > 1 && (static_cast<std::size_t>(g.aux_stride) * ae) % 16 != 0)) {
      *why = cat(algo_word, " needs a 16-byte aligned aux matrix, aux ld and aux batch stride");
      return false;
    }
  }
  return true;
}

// The alignment every matrix of a batch starts at (what the pointer and the stride allow).
std::uint32_t batch_alignment(const void* p, std::int64_t stride, std::size_t es,
                              std::int64_t batch) {
  std::uint64_t bits = reinterpret_cast<std::uintptr_t>(p) | 256u;
  if (batch > 1) bits |= static_cast<std::uint64_t>(stride) * es;
  return static_cast<std::uint32_t>(bits & (~bits + 1));
}

struct Candidate {
  Algo algo;
  std::size_t workspace;
};

// The heuristic proper: the algorithms eligible under the given alignments and limits, best
// first (wide, aligned, generic: so the alignments the caller states choose the algorithm, as
// MIN_ALIGNMENT's documentation says they may). *why collects the reasons of the others.
int candidates(const Problem& pr, const std::uint32_t align[4], std::uint64_t max_workspace,
               std::uint64_t impl_mask, int only_id, Candidate out[kAlgoCount], std::string* why) {
  int count = 0;
  const Algo order[kAlgoCount] = {Algo::lt_wide, Algo::lt_vec16, Algo::lt_generic};
  for (Algo algo : order) {
    if (only_id >= 0 && static_cast<int>(algo) != only_id) continue;
    std::string reason;
    if (!eligible(algo, pr, align, &reason)) {
      *why += cat(why->empty() ? "" : "; ", reason);
      continue;
    }
    const std::size_t ws = blas::workspace_bytes(pr.g);
    if (ws > max_workspace) {
      *why += cat(why->empty() ? "" : "; ", blas::algo_name(algo), " needs ", ws,
                  " bytes of workspace, more than the ", max_workspace, " allowed");
      continue;
    }
    if ((impl_flags(algo, pr) & ~impl_mask) != 0) {
      *why += cat(why->empty() ? "" : "; ", blas::algo_name(algo),
                  " is excluded by CUBLASLT_MATMUL_PREF_IMPL_MASK");
      continue;
    }
    out[count++] = {algo, ws};
  }
  return count;
}

cublasStatus_t algo_of(const char* call, const cublasLtMatmulAlgo_t* algo, const Problem* pr,
                       Algo* out) {
  if (algo->data[0] != kAlgoMagic || algo->data[1] >= static_cast<std::uint64_t>(kAlgoCount)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  "the algorithm was not made by cublasLtMatmulAlgoGetHeuristic or "
                  "cublasLtMatmulAlgoInit");
  }
  if (pr != nullptr && algo->data[2] != pr->types) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  "the algorithm was made for other compute, scale or matrix types than the "
                  "descriptors'");
  }
  *out = static_cast<Algo>(algo->data[1]);
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Context, version, status. (The declarations in cublasLt.h give these C linkage.)

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "lightHandle is null");
  }
  if (cuda_emu::visible_device_count() == 0) {
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtCreate", "no CUDA device is visible");
  }
  auto* h = new (std::nothrow) cublasLtContext;
  if (h == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  h->magic = blas::kLtHandleMagic;
  *lightHandle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (!valid_handle(lightHandle)) {
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "not a cuBLASLt handle");
  }
  if (lightHandle->in_cublas_handle) {
    return refuse(
        CUBLAS_STATUS_INVALID_VALUE, "cublasLtDestroy",
        "the handle is a cublasHandle_t cast to cublasLtHandle_t: cublasDestroy frees it");
  }
  lightHandle->magic = 0;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) { return blas::status_name(status); }
const char* cublasLtGetStatusString(cublasStatus_t status) { return blas::status_string(status); }
std::size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }
std::size_t cublasLtGetCudartVersion(void) { return CUDART_VERSION; }

// cuBLASLt ships with cuBLAS: the same version.
cublasStatus_t cublasLtGetProperty(libraryPropertyType type, int* value) {
  return cublasGetProperty(type, value);
}

// ---------------------------------------------------------------------------------------------
// Layouts.

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* o = new (std::nothrow) cublasLtMatrixLayoutOpaque_t{};
  if (o == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  Layout* l = new (o->data) Layout;
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *matLayout = o;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  if (matLayout == nullptr) return CUBLAS_STATUS_SUCCESS;
  Layout* l = layout_of(matLayout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  l->magic = 0;
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, std::size_t sizeInBytes) {
  Layout* l = layout_of(matLayout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: {
      std::uint32_t v = 0;
      const cublasStatus_t rc = set_value(v, buf, sizeInBytes);
      if (rc == CUBLAS_STATUS_SUCCESS) l->type = static_cast<std::int32_t>(v);
      return rc;
    }
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return set_value(l->order, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return set_value(l->rows, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return set_value(l->cols, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return set_value(l->ld, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return set_value(l->batch, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return set_value(l->stride, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
      return set_value(l->plane_offset, buf, sizeInBytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                std::size_t sizeInBytes, std::size_t* sizeWritten) {
  const Layout* l = layout_of(matLayout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: {
      const auto v = static_cast<std::uint32_t>(l->type);
      return get_value(v, buf, sizeInBytes, sizeWritten);
    }
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return get_value(l->order, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return get_value(l->rows, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return get_value(l->cols, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return get_value(l->ld, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return get_value(l->batch, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return get_value(l->stride, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
      return get_value(l->plane_offset, buf, sizeInBytes, sizeWritten);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

// ---------------------------------------------------------------------------------------------
// Matmul descriptors.

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* o = new (std::nothrow) cublasLtMatmulDescOpaque_t{};
  if (o == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  Desc* d = new (o->data) Desc;
  d->compute = computeType;
  d->scale = scaleType;
  *matmulDesc = o;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_SUCCESS;
  Desc* d = desc_of(matmulDesc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  d->magic = 0;
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

// The field of a descriptor attribute, by its size in the API: calls `f(field)`.
template <class F>
cublasStatus_t with_desc_field(Desc& d, cublasLtMatmulDescAttributes_t attr, F&& f) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return f(d.compute);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return f(d.scale);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return f(d.pointer_mode);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return f(d.transa);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return f(d.transb);
    case CUBLASLT_MATMUL_DESC_TRANSC:
      return f(d.transc);
    case CUBLASLT_MATMUL_DESC_FILL_MODE:
      return f(d.fill);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return f(d.epilogue);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return f(d.bias);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
      return f(d.bias_stride);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return f(d.aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return f(d.aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
      return f(d.aux_stride);
    case CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE:
      return f(d.alpha_vector_stride);
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET:
      return f(d.sm_count);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
      return f(d.scale_ptr[0]);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
      return f(d.scale_ptr[1]);
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER:
      return f(d.scale_ptr[2]);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER:
      return f(d.scale_ptr[3]);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER:
      return f(d.amax_d);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return f(d.aux_type);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER:
      return f(d.aux_scale);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER:
      return f(d.aux_amax);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
      return f(d.fast_accum);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return f(d.bias_type);
    case CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_ROWS:
      return f(d.sync_rows);
    case CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_COLS:
      return f(d.sync_cols);
    case CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_IN_COUNTERS_POINTER:
      return f(d.sync_in);
    case CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_OUT_COUNTERS_POINTER:
      return f(d.sync_out);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

}  // namespace

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              std::size_t sizeInBytes) {
  Desc* d = desc_of(matmulDesc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return with_desc_field(*d, attr, [&](auto& field) { return set_value(field, buf, sizeInBytes); });
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, void* buf,
                                              std::size_t sizeInBytes, std::size_t* sizeWritten) {
  Desc* d = desc_of(matmulDesc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return with_desc_field(
      *d, attr, [&](auto& field) { return get_value(field, buf, sizeInBytes, sizeWritten); });
}

// ---------------------------------------------------------------------------------------------
// Preferences.

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* o = new (std::nothrow) cublasLtMatmulPreferenceOpaque_t{};
  if (o == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  new (o->data) Pref;
  *pref = o;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (pref == nullptr) return CUBLAS_STATUS_SUCCESS;
  Pref* p = pref_of(pref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  p->magic = 0;
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

template <class F>
cublasStatus_t with_pref_field(Pref& p, cublasLtMatmulPreferenceAttributes_t attr, F&& f) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      return f(p.search_mode);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return f(p.max_workspace);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return f(p.reduction_mask);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return f(p.align[0]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return f(p.align[1]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return f(p.align[2]);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return f(p.align[3]);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
      return f(p.max_waves);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
      return f(p.impl_mask);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

}  // namespace

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, std::size_t sizeInBytes) {
  Pref* p = pref_of(pref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return with_pref_field(*p, attr, [&](auto& field) { return set_value(field, buf, sizeInBytes); });
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    void* buf, std::size_t sizeInBytes,
                                                    std::size_t* sizeWritten) {
  Pref* p = pref_of(pref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  return with_pref_field(
      *p, attr, [&](auto& field) { return get_value(field, buf, sizeInBytes, sizeWritten); });
}

// ---------------------------------------------------------------------------------------------
// Algorithms.

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  const char* call = "cublasLtMatmulAlgoGetHeuristic";
  if (!valid_handle(lightHandle))
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a cuBLASLt handle");
  if (requestedAlgoCount <= 0 || heuristicResultsArray == nullptr || returnAlgoCount == nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  "requestedAlgoCount must be positive, with the results array and count set");
  }
  *returnAlgoCount = 0;
  const Pref* pref = pref_of(preference);
  if (pref == nullptr)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the preference is null or not one");
  Problem pr;
  if (const cublasStatus_t rc = resolve(call, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, pr))
    return rc;
  int only_id = -1;
  if (pref->search_mode == CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID) {
    Algo a;
    if (const cublasStatus_t rc = algo_of(call, &heuristicResultsArray[0].algo, &pr, &a)) return rc;
    only_id = static_cast<int>(a);
  } else if (pref->search_mode != CUBLASLT_SEARCH_BEST_FIT) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "reserved search mode");
  }
  Candidate found[kAlgoCount];
  std::string why;
  const int count =
      candidates(pr, pref->align, pref->max_workspace, pref->impl_mask, only_id, found, &why);
  if (count == 0) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat("no algorithm for the ", blas::elem_name(pr.g.a.type), " GEMM m=", pr.g.m,
                      " n=", pr.g.n, " k=", pr.g.k, " batch=", pr.g.batch,
                      " (preferred alignments A ", pref->align[0], ", B ", pref->align[1], ", C ",
                      pref->align[2], ", D ", pref->align[3], " bytes): ", why));
  }
  const int n = count < requestedAlgoCount ? count : requestedAlgoCount;
  for (int i = 0; i < n; ++i) {
    cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[i];
    r = cublasLtMatmulHeuristicResult_t{};
    r.algo = make_algo(found[i].algo, pr.types);
    r.workspaceSize = found[i].workspace;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
  }
  *returnAlgoCount = n;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetIds(cublasLtHandle_t lightHandle,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType,
                                        cudaDataType_t Atype, cudaDataType_t Btype,
                                        cudaDataType_t Ctype, cudaDataType_t Dtype,
                                        int requestedAlgoCount, int algoIdsArray[],
                                        int* returnAlgoCount) {
  const char* call = "cublasLtMatmulAlgoGetIds";
  if (!valid_handle(lightHandle))
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a cuBLASLt handle");
  if (requestedAlgoCount <= 0 || algoIdsArray == nullptr || returnAlgoCount == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returnAlgoCount = 0;
  if (Ctype != Dtype) return CUBLAS_STATUS_SUCCESS;
  if (check_types(call, computeType, scaleType, Atype, Btype, Dtype) != CUBLAS_STATUS_SUCCESS) {
    return CUBLAS_STATUS_SUCCESS;  // no algorithm for these types
  }
  int n = 0;  // bf16: no generic algorithm (id 1)
  for (int id = 0; id < kAlgoCount && n < requestedAlgoCount; ++id) {
    if (Atype == CUDA_R_16BF && id == static_cast<int>(Algo::lt_generic)) continue;
    algoIdsArray[n++] = id;
  }
  *returnAlgoCount = n;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoInit(cublasLtHandle_t lightHandle, cublasComputeType_t computeType,
                                      cudaDataType_t scaleType, cudaDataType_t Atype,
                                      cudaDataType_t Btype, cudaDataType_t Ctype,
                                      cudaDataType_t Dtype, int algoId,
                                      cublasLtMatmulAlgo_t* algo) {
  const char* call = "cublasLtMatmulAlgoInit";
  if (!valid_handle(lightHandle))
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a cuBLASLt handle");
  if (algo == nullptr || algoId < 0 || algoId >= kAlgoCount) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, cat("algoId ", algoId, " is not 0, 1 or 2"));
  }
  if (Ctype != Dtype) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "C and D must have the same data type");
  }
  if (const cublasStatus_t rc = check_types(call, computeType, scaleType, Atype, Btype, Dtype))
    return rc;
  if (algoId == static_cast<int>(Algo::lt_generic) && Atype == CUDA_R_16BF) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  "algorithm 1 (generic) takes no bf16 inputs (\"if algoId is not supported for "
                  "given combination of data types\")");
  }
  *algo = make_algo(static_cast<Algo>(algoId),
                    fingerprint(computeType, scaleType, Atype, Btype, Ctype, Dtype));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t lightHandle,
                                       cublasLtMatmulDesc_t operationDesc,
                                       cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                       cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result) {
  const char* call = "cublasLtMatmulAlgoCheck";
  if (!valid_handle(lightHandle))
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a cuBLASLt handle");
  if (algo == nullptr || result == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Problem pr;
  if (const cublasStatus_t rc = resolve(call, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, pr))
    return rc;
  Algo a;
  if (const cublasStatus_t rc = algo_of(call, algo, &pr, &a)) return rc;
  // The pointers are unknown here: assume the 256-byte default ("SUCCESS doesn't fully
  // guarantee algo will run (will fail if e.g. buffers are not correctly aligned)").
  const std::uint32_t align[4] = {256, 256, 256, 256};
  std::string why;
  if (!eligible(a, pr, align, &why)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, why);
  result->workspaceSize = blas::workspace_bytes(pr.g);
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = 1.0f;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCapGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                 cublasLtMatmulAlgoCapAttributes_t attr, void* buf,
                                                 std::size_t sizeInBytes,
                                                 std::size_t* sizeWritten) {
  if (algo == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Algo a;
  if (algo_of("cublasLtMatmulAlgoCapGetAttribute", algo, nullptr, &a) != CUBLAS_STATUS_SUCCESS) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const int a_type = static_cast<int>((algo->data[2] >> 16) & 0xff);
  const int b_type = static_cast<int>((algo->data[2] >> 24) & 0xff);
  const int c_type = static_cast<int>((algo->data[2] >> 32) & 0xff);
  const int d_type = static_cast<int>((algo->data[2] >> 40) & 0xff);
  auto min_align = [&](int type) -> std::uint32_t {
    if (a == Algo::lt_wide) return 128u;
    if (a == Algo::lt_vec16) return 16u;
    return static_cast<std::uint32_t>(blas::elem_bytes(elem_of(type)));
  };
  const std::int32_t zero = 0, one = 1;
  const std::uint32_t uzero = 0;
  switch (attr) {
    case CUBLASLT_ALGO_CAP_SPLITK_SUPPORT:
    case CUBLASLT_ALGO_CAP_UPLO_SUPPORT:
    case CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX:
    case CUBLASLT_ALGO_CAP_CUSTOM_MEMORY_ORDER:
    case CUBLASLT_ALGO_CAP_LD_NEGATIVE:
      return get_value(zero, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_ALGO_CAP_STRIDED_BATCH_SUPPORT:
    case CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT:
      return get_value(one, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK:
    case CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT:
    case CUBLASLT_ALGO_CAP_TILE_IDS:    // {CUBLASLT_MATMUL_TILE_UNDEFINED}
    case CUBLASLT_ALGO_CAP_STAGES_IDS:  // {CUBLASLT_MATMUL_STAGES_UNDEFINED}
      return get_value(uzero, buf, sizeInBytes, sizeWritten);
    case CUBLASLT_ALGO_CAP_POINTER_MODE_MASK: {
      const std::uint32_t mask =
          CUBLASLT_POINTER_MODE_MASK_HOST | CUBLASLT_POINTER_MODE_MASK_DEVICE;
      return get_value(mask, buf, sizeInBytes, sizeWritten);
    }
    case CUBLASLT_ALGO_CAP_EPILOGUE_MASK: {
      const std::uint32_t mask = CUBLASLT_EPILOGUE_DEFAULT | CUBLASLT_EPILOGUE_BIAS |
                                 CUBLASLT_EPILOGUE_GELU_AUX_BIAS | CUBLASLT_EPILOGUE_DGELU |
                                 CUBLASLT_EPILOGUE_BGRADA | CUBLASLT_EPILOGUE_BGRADB;
      return get_value(mask, buf, sizeInBytes, sizeWritten);
    }
    case CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS: {
      Problem pr;
      pr.a_type = a_type;
      const std::uint64_t flags = impl_flags(a, pr);
      return get_value(flags, buf, sizeInBytes, sizeWritten);
    }
    case CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES:
      return get_value(min_align(a_type), buf, sizeInBytes, sizeWritten);
    case CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES:
      return get_value(min_align(b_type), buf, sizeInBytes, sizeWritten);
    case CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES:
      return get_value(min_align(c_type), buf, sizeInBytes, sizeWritten);
    case CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES:
      return get_value(min_align(d_type), buf, sizeInBytes, sizeWritten);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void* buf, std::size_t sizeInBytes,
                                                    std::size_t* sizeWritten) {
  if (algo == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Algo a;
  if (algo_of("cublasLtMatmulAlgoConfigGetAttribute", algo, nullptr, &a) != CUBLAS_STATUS_SUCCESS) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID: {
      const auto id = static_cast<std::int32_t>(a);
      return get_value(id, buf, sizeInBytes, sizeWritten);
    }
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: {
      const std::uint32_t one = 1;
      return get_value(one, buf, sizeInBytes, sizeWritten);
    }
    case CUBLASLT_ALGO_CONFIG_TILE_ID:
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
    case CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING:
    case CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION:
    case CUBLASLT_ALGO_CONFIG_STAGES_ID: {
      const std::uint32_t zero = 0;
      return get_value(zero, buf, sizeInBytes, sizeWritten);
    }
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

// ---------------------------------------------------------------------------------------------
// The product.

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, std::size_t workspaceSizeInBytes,
                              cudaStream_t stream) {
  const char* call = "cublasLtMatmul";
  if (!valid_handle(lightHandle))
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a cuBLASLt handle");
  if (Cdesc == nullptr) Cdesc = Ddesc;
  Problem pr;
  if (const cublasStatus_t rc = resolve(call, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, pr))
    return rc;
  blas::Gemm& g = pr.g;
  const int device = cuda_emu::device_of(stream);

  // Scalars: host values read now (the caller may reuse them at once), or device pointers read
  // when the work runs.
  if (alpha == nullptr || beta == nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "alpha or beta is null");
  }
  if (const std::string why = blas::take_scalars(g, alpha, beta, pr.device_scalars, device);
      !why.empty())
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
  const bool reads_c = pr.device_scalars || g.beta != 0.0f;
  const bool reads_ab = (pr.device_scalars || g.alpha != 0.0f) && g.k > 0;

  // C and D: in place needs the same layout; out of place they must not overlap.
  const bool c_given = C != nullptr;
  if (!c_given && !reads_c) C = D;  // C is not read: nothing to check of it
  if (c_given && C == D && !same_layout(*pr.c_layout, *pr.d_layout)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  "C == D but Cdesc and Ddesc differ: in-place matrix multiplication needs "
                  "\"C == D and Cdesc == Ddesc\"");
  }
  g.a.p = A;
  g.b.p = B;
  g.c.p = reads_c ? C : nullptr;
  g.d = D;

  // Memory: device memory of the stream's device, large enough for the layouts.
  const std::int64_t batch = g.batch;
  const std::size_t a_bytes =
      blas::span_bytes(pr.a_rows, pr.a_cols, g.a.ld, batch, g.a.stride, blas::elem_bytes(g.a.type));
  const std::size_t b_bytes =
      blas::span_bytes(pr.b_rows, pr.b_cols, g.b.ld, batch, g.b.stride, blas::elem_bytes(g.b.type));
  const std::size_t c_bytes =
      blas::span_bytes(g.m, g.n, g.c.ld, batch, g.c.stride, blas::elem_bytes(g.c.type));
  const std::size_t d_bytes =
      blas::span_bytes(g.m, g.n, g.ldd, batch, g.stride_d, blas::elem_bytes(g.d_type));
  const std::size_t bias_bytes =
      pr.bias_used ? blas::span_bytes(pr.bias_len, 1, pr.bias_len, batch, g.bias_stride,
                                      blas::elem_bytes(g.bias_type))
                   : 0;
  const std::size_t aux_bytes =
      pr.aux_used
          ? blas::span_bytes(g.m, g.n, g.aux_ld, batch, g.aux_stride, blas::elem_bytes(g.aux_type))
          : 0;
  const bool has_output = g.m > 0 && g.n > 0;
  struct Span {
    const char* name;
    const void* p;
    std::size_t bytes;
    bool used;
  };
  const Span spans[] = {
      {"A", A, a_bytes, has_output && (reads_ab || g.bgrad_a)},
      {"B", B, b_bytes, has_output && (reads_ab || g.bgrad_b)},
      {"C", C, c_bytes, has_output && reads_c},
      {"D", D, d_bytes, has_output},
      {"the bias vector", g.bias, bias_bytes, has_output && pr.bias_used},
      {"the epilogue aux matrix", g.aux, aux_bytes, has_output && pr.aux_used},
  };
  for (const Span& s : spans) {
    if (!s.used) continue;
    const std::string why = blas::check_device_span(s.name, s.p, s.bytes, device);
    if (!why.empty()) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
  }
  // Outputs must not overlap inputs or each other (a GPU's result would depend on block order).
  const Span& sd = spans[3];
  for (int i : {0, 1, 2, 4, 5}) {
    const Span& s = spans[i];
    if (!s.used || !sd.used) continue;
    if (i == 2 && C == D) continue;
    if (blas::overlap(sd.p, sd.bytes, s.p, s.bytes)) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                    cat("D overlaps ", s.name,
                        " (without being the same matrix as C in place): "
                        "a GPU's result would depend on the order its blocks ran"));
    }
  }
  if (g.aux_out || g.bgrad_a || g.bgrad_b) {
    const Span& out = g.aux_out ? spans[5] : spans[4];
    for (int i : {0, 1, 2}) {
      const Span& s = spans[i];
      if (s.used && out.used && blas::overlap(out.p, out.bytes, s.p, s.bytes)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                      cat(out.name, " (an output) overlaps ", s.name));
      }
    }
  }

  // The algorithm.
  const std::uint32_t actual[4] = {
      batch_alignment(A, g.a.stride, blas::elem_bytes(g.a.type), batch),
      batch_alignment(B, g.b.stride, blas::elem_bytes(g.b.type), batch),
      batch_alignment(reads_c ? C : D, reads_c ? g.c.stride : g.stride_d,
                      blas::elem_bytes(g.c.type), batch),
      batch_alignment(D, g.stride_d, blas::elem_bytes(g.d_type), batch)};
  if (algo == nullptr) {
    // "When NULL, an implicit heuristics query with default search preferences will be
    // performed": the emulation takes the pointers' actual alignments and the workspace given.
    Candidate found[kAlgoCount];
    std::string why;
    if (candidates(pr, actual, workspaceSizeInBytes, ~std::uint64_t{0}, -1, found, &why) == 0) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                    cat("no algorithm (implicit heuristic): ", why));
    }
    g.algo = found[0].algo;
  } else {
    if (const cublasStatus_t rc = algo_of(call, algo, &pr, &g.algo)) return rc;
    std::string why;
    if (!eligible(g.algo, pr, actual, &why)) {
      return refuse(
          CUBLAS_STATUS_NOT_SUPPORTED, call,
          cat(blas::algo_name(g.algo), " cannot run with these pointers: ", why, " (alignments A ",
              actual[0], ", B ", actual[1], ", C ", actual[2], ", D ", actual[3], " bytes)"));
    }
  }

  // The workspace.
  const std::size_t need = blas::workspace_bytes(g);
  if (workspaceSizeInBytes < need) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat("workspaceSizeInBytes ", workspaceSizeInBytes, " is less than the ", need,
                      " bytes the algorithm needs"));
  }
  if (workspaceSizeInBytes > 0) {
    if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) {
      return refuse(
          CUBLAS_STATUS_INVALID_VALUE, call,
          "the workspace \"Must be 256B aligned (i.e. lowest 8 bits of address must be 0)\"");
    }
    const std::string why =
        blas::check_device_span("the workspace", workspace, workspaceSizeInBytes, device);
    if (!why.empty()) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
    if (has_output && need > 0) {
      for (int i = 0; i < 6; ++i) {
        if (spans[i].used && blas::overlap(workspace, need, spans[i].p, spans[i].bytes)) {
          return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                        cat("the workspace overlaps ", spans[i].name));
        }
      }
    }
  }
  g.workspace = static_cast<float*>(workspace);

  if (!has_output) return CUBLAS_STATUS_SUCCESS;
  const cudaError_t rc = cuda_emu::enqueue(stream, blas::describe(call, g), [g] { blas::run(g); });
  if (rc == cudaSuccess) blas::count(call, g);
  if (rc == cudaErrorInvalidResourceHandle) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the stream is not a live stream");
  }
  if (rc != cudaSuccess) {
    return refuse(CUBLAS_STATUS_EXECUTION_FAILED, call,
                  cat("the work could not be queued: ", cudaGetErrorName(rc)));
  }
  return CUBLAS_STATUS_SUCCESS;
}
