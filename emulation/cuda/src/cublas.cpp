// The emulated cuBLAS (include/cublas_api.h, cublas_v2.h): the handle and the GemmEx family,
// the path pdtrain falls back to when cuBLASLt refuses a shape. Its algorithm
// (blas::Algo::cublas_inorder, gemm_emulated.hpp) works at any alignment of the element size
// and sums K in order; the work is queued on the handle's stream.
//
// NVIDIA's documentation this follows (cuBLAS 12/13, "cuBLAS API"):
// - cublasGemmEx: CUBLAS_STATUS_INVALID_VALUE "if m < 0 or n < 0 or k < 0", and for lda < max(1,
//   m) (transa == N) or max(1, k), ldb < max(1, k) (transb == N) or max(1, n), ldc < max(1, m);
//   CUBLAS_STATUS_NOT_SUPPORTED for a combination of Atype, Btype, Ctype and computeType outside
//   its table (the emulation runs CUBLAS_COMPUTE_32F[_PEDANTIC] with fp32 A/B -> fp32 C and bf16
//   A/B -> fp32 or bf16 C; the table's other rows are refused as not emulated).
// - cublasSetWorkspace: "The workspace pointer has to be aligned to at least 256 bytes,
//   otherwise CUBLAS_STATUS_INVALID_VALUE error is returned"; cublasSetStream "unconditionally
//   resets the cuBLAS library workspace back to the default workspace pool".
// - cublasMath_t: CUBLAS_TF32_TENSOR_OP_MATH lets single-precision routines use TF32: not
//   emulated, so an fp32 GEMM in that mode is refused (NOT_SUPPORTED) rather than run with fp32
//   numerics a GPU would not have.
// - A, B, C are device memory: checked as cublaslt.cpp checks them (INVALID_VALUE otherwise).
#include <cublas_v2.h>

#include <cstdint>
#include <new>
#include <sstream>
#include <string>

#include "emulator.hpp"
#include "gemm_emulated.hpp"

namespace {

namespace blas = cuda_emu::blas;
using blas::Elem;

using blas::cat;
using blas::refuse;

bool valid(cublasHandle_t h) { return h != nullptr && h->magic == blas::kCublasHandleMagic; }

bool valid_algo(int algo) {
  return algo == CUBLAS_GEMM_DEFAULT || (algo >= CUBLAS_GEMM_ALGO0 && algo <= CUBLAS_GEMM_ALGO23) ||
         algo == CUBLAS_GEMM_DEFAULT_TENSOR_OP ||
         (algo >= CUBLAS_GEMM_ALGO0_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
}

cublasStatus_t gemm(const char* call, cublasHandle_t handle, cublasOperation_t transa,
                    cublasOperation_t transb, int m, int n, int k, const void* alpha, const void* A,
                    cudaDataType Atype, int lda, long long strideA, const void* B,
                    cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C,
                    cudaDataType Ctype, int ldc, long long strideC, int batchCount,
                    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  if (!valid(handle)) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a cuBLAS handle");
  auto op_ok = [](cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  if (!op_ok(transa) || !op_ok(transb)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "transa/transb is not N, T or C");
  }
  if (m < 0 || n < 0 || k < 0 || batchCount < 0) {
    return refuse(
        CUBLAS_STATUS_INVALID_VALUE, call,
        cat("m ", m, ", n ", n, ", k ", k, ", batchCount ", batchCount, ": none may be negative"));
  }
  const bool ta = transa != CUBLAS_OP_N;
  const bool tb = transb != CUBLAS_OP_N;
  const int a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int b_rows = tb ? n : k, b_cols = tb ? k : n;
  auto at_least = [](int v) { return v > 1 ? v : 1; };
  if (lda < at_least(a_rows) || ldb < at_least(b_rows) || ldc < at_least(m)) {
    return refuse(
        CUBLAS_STATUS_INVALID_VALUE, call,
        cat("lda ", lda, ", ldb ", ldb, ", ldc ", ldc, " for A ", a_rows, " x ", a_cols, ", B ",
            b_rows, " x ", b_cols, ", C ", m, " rows: each must be at least max(1, rows)"));
  }
  if (!valid_algo(algo)) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  cat("algo ", static_cast<int>(algo), " is not a cublasGemmAlgo_t"));
  }
  if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat("compute type ", static_cast<int>(computeType),
                      " is not emulated (only CUBLAS_COMPUTE_32F[_PEDANTIC])"));
  }
  const bool types_ok =
      Atype == Btype && ((Atype == CUDA_R_32F && Ctype == CUDA_R_32F) ||
                         (Atype == CUDA_R_16BF && (Ctype == CUDA_R_32F || Ctype == CUDA_R_16BF)));
  if (!types_ok) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  cat("Atype ", static_cast<int>(Atype), ", Btype ", static_cast<int>(Btype),
                      ", Ctype ", static_cast<int>(Ctype),
                      " with CUBLAS_COMPUTE_32F: the emulation runs CUDA_R_32F -> CUDA_R_32F and "
                      "CUDA_R_16BF -> CUDA_R_16BF or CUDA_R_32F (A and B of one type)"));
  }
  if (Atype == CUDA_R_32F && computeType == CUBLAS_COMPUTE_32F &&
      (handle->math_mode & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                  "CUBLAS_TF32_TENSOR_OP_MATH would round fp32 inputs to TF32: not emulated");
  }
  if (alpha == nullptr || beta == nullptr) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "alpha or beta is null");
  }
  if (strideA < 0 || strideB < 0 || strideC < 0) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "negative batch strides are not emulated");
  }

  blas::Gemm g;
  g.algo = blas::Algo::cublas_inorder;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batchCount;
  g.a = {A, Atype == CUDA_R_16BF ? Elem::bf16 : Elem::f32, lda, batchCount > 1 ? strideA : 0};
  g.b = {B, Btype == CUDA_R_16BF ? Elem::bf16 : Elem::f32, ldb, batchCount > 1 ? strideB : 0};
  const Elem c_elem = Ctype == CUDA_R_16BF ? Elem::bf16 : Elem::f32;
  g.c = {C, c_elem, ldc, batchCount > 1 ? strideC : 0};
  g.d = C;
  g.d_type = c_elem;
  g.ldd = ldc;
  g.stride_d = g.c.stride;
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;

  const cudaStream_t stream = handle->stream;
  const int device = cuda_emu::device_of(stream);
  const bool device_scalars = handle->pointer_mode == CUBLAS_POINTER_MODE_DEVICE;
  if (const std::string why = blas::take_scalars(g, alpha, beta, device_scalars, device);
      !why.empty())
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
  const bool reads_ab = (device_scalars || g.alpha != 0.0f) && k > 0;
  if (!blas::batches_disjoint(m, n, ldc, g.stride_d, batchCount)) {
    return refuse(
        CUBLAS_STATUS_INVALID_VALUE, call,
        cat("strideC ", strideC, " makes the ", batchCount,
            " C matrices overlap: a GPU's result would depend on the order its blocks ran"));
  }

  const std::size_t a_bytes =
      blas::span_bytes(a_rows, a_cols, lda, batchCount, g.a.stride, blas::elem_bytes(g.a.type));
  const std::size_t b_bytes =
      blas::span_bytes(b_rows, b_cols, ldb, batchCount, g.b.stride, blas::elem_bytes(g.b.type));
  const std::size_t c_bytes =
      blas::span_bytes(m, n, ldc, batchCount, g.stride_d, blas::elem_bytes(c_elem));
  struct Span {
    const char* name;
    const void* p;
    std::size_t bytes;
    std::size_t elem;
    bool used;
  };
  const Span spans[] = {{"A", A, a_bytes, blas::elem_bytes(g.a.type), reads_ab},
                        {"B", B, b_bytes, blas::elem_bytes(g.b.type), reads_ab},
                        {"C", C, c_bytes, blas::elem_bytes(c_elem), true}};
  for (const Span& s : spans) {
    if (!s.used) continue;
    const std::string why = blas::check_device_span(s.name, s.p, s.bytes, device);
    if (!why.empty()) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
    if (reinterpret_cast<std::uintptr_t>(s.p) % s.elem != 0) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                    cat(s.name, " is not aligned to its ", s.elem,
                        "-byte elements: a GPU would fault on a misaligned address"));
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (spans[i].used && blas::overlap(C, c_bytes, spans[i].p, spans[i].bytes)) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                    cat("C overlaps ", spans[i].name,
                        ": a GPU's result would depend on the order its blocks ran"));
    }
  }

  const cudaError_t rc = cuda_emu::enqueue(stream, blas::describe(call, g), [g] { blas::run(g); });
  if (rc == cudaSuccess) blas::count(call, g);
  if (rc == cudaErrorInvalidResourceHandle) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the handle's stream is not a live stream");
  }
  if (rc != cudaSuccess) {
    return refuse(CUBLAS_STATUS_EXECUTION_FAILED, call,
                  cat("the work could not be queued: ", cudaGetErrorName(rc)));
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

// The declarations in cublas_api.h give these C linkage.

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate", "handle is null");
  if (cuda_emu::visible_device_count() == 0) {
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate", "no CUDA device is visible");
  }
  auto* h = new (std::nothrow) cublasContext;
  if (h == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  h->lt.magic = blas::kLtHandleMagic;
  h->lt.in_cublas_handle = true;
  h->magic = blas::kCublasHandleMagic;
  h->device = cuda_emu::current_device();
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!valid(handle))
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy", "not a cuBLAS handle");
  handle->magic = 0;
  handle->lt.magic = 0;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int* version) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  if (value == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (type) {
    case MAJOR_VERSION:
      *value = CUBLAS_VER_MAJOR;
      return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION:
      *value = CUBLAS_VER_MINOR;
      return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL:
      *value = CUBLAS_VER_PATCH;
      return CUBLAS_STATUS_SUCCESS;
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

std::size_t cublasGetCudartVersion(void) { return CUDART_VERSION; }
const char* cublasGetStatusName(cublasStatus_t status) { return blas::status_name(status); }
const char* cublasGetStatusString(cublasStatus_t status) { return blas::status_string(status); }

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = streamId;
  handle->workspace = nullptr;  // "unconditionally resets the cuBLAS library workspace"
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (streamId == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *streamId = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                     std::size_t workspaceSizeInBytes) {
  const char* call = "cublasSetWorkspace";
  if (!valid(handle)) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a cuBLAS handle");
  if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                  "\"The workspace pointer has to be aligned to at least 256 bytes\"");
  }
  if (workspaceSizeInBytes > 0) {
    const std::string why = blas::check_device_span(
        "the workspace", workspace, workspaceSizeInBytes, cuda_emu::device_of(handle->stream));
    if (!why.empty()) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
  }
  handle->workspace = workspace;
  handle->workspace_bytes = workspaceSizeInBytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->pointer_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!valid(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const int base = static_cast<int>(mode) & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH &&
      base != CUBLAS_PEDANTIC_MATH && base != CUBLAS_TF32_TENSOR_OP_MATH &&
      base != CUBLAS_FP32_EMULATED_BF16X9_MATH) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode",
                  cat("math mode ", static_cast<int>(mode), " is not a cublasMath_t"));
  }
  handle->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype,
              ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda,
              strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
              computeType, algo);
}
