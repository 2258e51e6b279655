#pragma once
// The emulated CUDA target's cublasLt.h (a test tool: never in the production pdtrain): the
// subset of NVIDIA's cuBLASLt API that pdtrain's CUDA sources use, with NVIDIA's names and enum
// values (cuBLAS 12/13), implemented on the CPU by emulation/cuda/src/cublaslt.cpp.
//
// What is emulated: D = epilogue(alpha op(A) op(B) + beta C), column-major, CUBLASLT_ORDER_COL,
// CUBLAS_COMPUTE_32F[_PEDANTIC] with CUDA_R_32F scale (alpha, beta on the host, or on the
// device with CUBLASLT_POINTER_MODE_DEVICE); A and B both CUDA_R_32F (C and D CUDA_R_32F) or
// both CUDA_R_16BF (C and D CUDA_R_32F or CUDA_R_16BF), the rows of NVIDIA's datatype table
// for these types; strided batches; C == D in place or C != D; the epilogues DEFAULT, BIAS,
// GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU, BGRADA, BGRADB. Anything else (other types,
// orders, pointer modes, epilogues) is refused with CUBLAS_STATUS_NOT_SUPPORTED and a line on
// stderr, never run with other semantics than a GPU's.
//
// Two algorithms with different summation orders (so different bits; emulation/cuda/src/
// gemm_emulated.hpp): id 0, "aligned/vectorized", needs 16-byte alignment; id 1, "generic",
// needs the element size's alignment but cannot take bf16 inputs. The heuristic's rules are in
// cublaslt.cpp (cublasLtMatmulAlgoGetHeuristic).
#include <cublas_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>

// Opaque handle of the cuBLASLt context (not tied to a device, as NVIDIA documents).
struct cublasLtContext;
typedef struct cublasLtContext* cublasLtHandle_t;

// Semi-opaque descriptors: the emulation keeps its own state in them.
typedef struct {
  std::uint64_t data[8];
} cublasLtMatrixLayoutOpaque_t;
typedef cublasLtMatrixLayoutOpaque_t* cublasLtMatrixLayout_t;

// An algorithm: trivially copyable, valid with the descriptors' types it was made for. The
// emulation records in it which algorithm it is (CUBLASLT_ALGO_CONFIG_ID 0, 1 or 2).
typedef struct {
  std::uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  std::uint64_t data[32];
} cublasLtMatmulDescOpaque_t;
typedef cublasLtMatmulDescOpaque_t* cublasLtMatmulDesc_t;

typedef struct {
  std::uint64_t data[8];
} cublasLtMatmulPreferenceOpaque_t;
typedef cublasLtMatmulPreferenceOpaque_t* cublasLtMatmulPreference_t;

typedef enum {
  CUBLASLT_POINTER_MODE_HOST = CUBLAS_POINTER_MODE_HOST,
  CUBLASLT_POINTER_MODE_DEVICE = CUBLAS_POINTER_MODE_DEVICE,
  CUBLASLT_POINTER_MODE_DEVICE_VECTOR = 2,
  CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO = 3,
  CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST = 4,
} cublasLtPointerMode_t;

typedef enum {
  CUBLASLT_POINTER_MODE_MASK_HOST = 1,
  CUBLASLT_POINTER_MODE_MASK_DEVICE = 2,
  CUBLASLT_POINTER_MODE_MASK_DEVICE_VECTOR = 4,
  CUBLASLT_POINTER_MODE_MASK_ALPHA_DEVICE_VECTOR_BETA_ZERO = 8,
  CUBLASLT_POINTER_MODE_MASK_ALPHA_DEVICE_VECTOR_BETA_HOST = 16,
} cublasLtPointerModeMask_t;

// Implementation details that may affect numerical behavior
// (CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS, CUBLASLT_MATMUL_PREF_IMPL_MASK).
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA (0x01ull << 0)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA (0x02ull << 0)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_IMMA (0x04ull << 0)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_DMMA (0x08ull << 0)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_TENSOR_OP_MASK (0xfeull << 0)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_OP_TYPE_MASK (0xffull << 0)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_16F (0x01ull << 8)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F (0x02ull << 8)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_64F (0x04ull << 8)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32I (0x08ull << 8)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_TYPE_MASK (0xffull << 8)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16F (0x01ull << 16)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF (0x02ull << 16)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32 (0x04ull << 16)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F (0x08ull << 16)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_64F (0x10ull << 16)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8I (0x20ull << 16)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_OP_INPUT_TYPE_MASK (0xffull << 16)
#define CUBLASLT_NUMERICAL_IMPL_FLAGS_GAUSSIAN (0x01ull << 32)
typedef std::uint64_t cublasLtNumericalImplFlags_t;

// ---------------------------------------------------------------------------------------------
// Matrix layouts.

typedef enum {
  CUBLASLT_ORDER_COL = 0,  // the only order the emulation runs
  CUBLASLT_ORDER_ROW = 1,
  CUBLASLT_ORDER_COL32 = 2,
  CUBLASLT_ORDER_COL4_4R2_8C = 3,
  CUBLASLT_ORDER_COL32_2R_4R4 = 4,
} cublasLtOrder_t;

typedef enum {
  CUBLASLT_MATRIX_LAYOUT_TYPE = 0,                  // uint32_t (cudaDataType)
  CUBLASLT_MATRIX_LAYOUT_ORDER = 1,                 // int32_t, default CUBLASLT_ORDER_COL
  CUBLASLT_MATRIX_LAYOUT_ROWS = 2,                  // uint64_t
  CUBLASLT_MATRIX_LAYOUT_COLS = 3,                  // uint64_t
  CUBLASLT_MATRIX_LAYOUT_LD = 4,                    // int64_t
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,           // int32_t, default 1
  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,  // int64_t (elements), default 0
  CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET = 7,          // int64_t, default 0
} cublasLtMatrixLayoutAttribute_t;

// ---------------------------------------------------------------------------------------------
// Matmul descriptors.

typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,                       // int32_t (cublasComputeType_t)
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,                         // int32_t (cudaDataType)
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,                       // int32_t, default HOST
  CUBLASLT_MATMUL_DESC_TRANSA = 3,                             // int32_t, default CUBLAS_OP_N
  CUBLASLT_MATMUL_DESC_TRANSB = 4,                             // int32_t, default CUBLAS_OP_N
  CUBLASLT_MATMUL_DESC_TRANSC = 5,                             // int32_t, only CUBLAS_OP_N
  CUBLASLT_MATMUL_DESC_FILL_MODE = 6,                          // int32_t, default FULL
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,                           // uint32_t, default DEFAULT
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,                       // void* / const void*
  CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10,                 // int64_t
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,              // void* / const void*
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,                   // int64_t
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE = 13,         // int64_t
  CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE = 14,         // int64_t
  CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = 15,                   // int32_t
  CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,                   // const void*
  CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,                   // const void*
  CUBLASLT_MATMUL_DESC_C_SCALE_POINTER = 19,                   // const void*
  CUBLASLT_MATMUL_DESC_D_SCALE_POINTER = 20,                   // const void*
  CUBLASLT_MATMUL_DESC_AMAX_D_POINTER = 21,                    // void*
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22,            // int32_t, default -1 (D's type)
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER = 23,        // void*
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER = 24,         // void*
  CUBLASLT_MATMUL_DESC_FAST_ACCUM = 25,                        // int8_t
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,                    // int32_t, default -1 (D's type)
  CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_ROWS = 27,     // int32_t
  CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_COLS = 28,     // int32_t
  CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_IN_COUNTERS_POINTER = 29,   // int32_t*
  CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_OUT_COUNTERS_POINTER = 30,  // int32_t*
} cublasLtMatmulDescAttributes_t;

typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_RELU_AUX = (CUBLASLT_EPILOGUE_RELU | 128),
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_RELU_BIAS = (CUBLASLT_EPILOGUE_RELU | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_RELU_AUX_BIAS = (CUBLASLT_EPILOGUE_RELU_AUX | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_DRELU = 8 | 128,
  CUBLASLT_EPILOGUE_DRELU_BGRAD = CUBLASLT_EPILOGUE_DRELU | 16,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_AUX = (CUBLASLT_EPILOGUE_GELU | 128),
  CUBLASLT_EPILOGUE_GELU_BIAS = (CUBLASLT_EPILOGUE_GELU | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = (CUBLASLT_EPILOGUE_GELU_AUX | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_DGELU = 64 | 128,
  CUBLASLT_EPILOGUE_DGELU_BGRAD = CUBLASLT_EPILOGUE_DGELU | 16,
  CUBLASLT_EPILOGUE_BGRADA = 256,
  CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

// ---------------------------------------------------------------------------------------------
// Heuristic preferences and results.

typedef enum {
  CUBLASLT_SEARCH_BEST_FIT = 0,
  CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID = 1,
  CUBLASLT_SEARCH_RESERVED_02 = 2,
  CUBLASLT_SEARCH_RESERVED_03 = 3,
  CUBLASLT_SEARCH_RESERVED_04 = 4,
  CUBLASLT_SEARCH_RESERVED_05 = 5,
} cublasLtMatmulSearch_t;

typedef enum {
  CUBLASLT_REDUCTION_SCHEME_NONE = 0,
  CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,
  CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2,
  CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,
  CUBLASLT_REDUCTION_SCHEME_MASK = 0x7,
} cublasLtReductionScheme_t;

typedef enum {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,            // uint32_t, default BEST_FIT
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    // uint64_t, default 0
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,  // uint32_t, default MASK (all)
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  // uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,  // uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,  // uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,  // uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT = 9,        // float, default 0
  CUBLASLT_MATMUL_PREF_IMPL_MASK = 12,             // uint64_t, default all
} cublasLtMatmulPreferenceAttributes_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;  // workspace the algorithm needs
  cublasStatus_t state;       // the other fields are valid only when CUBLAS_STATUS_SUCCESS
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
  CUBLASLT_ALGO_CAP_SPLITK_SUPPORT = 0,               // int32_t
  CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK = 1,        // uint32_t
  CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT = 2,        // uint32_t
  CUBLASLT_ALGO_CAP_STRIDED_BATCH_SUPPORT = 3,        // int32_t
  CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT = 4,  // int32_t
  CUBLASLT_ALGO_CAP_UPLO_SUPPORT = 5,                 // int32_t
  CUBLASLT_ALGO_CAP_TILE_IDS = 6,                     // uint32_t[]
  CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX = 7,            // int32_t
  CUBLASLT_ALGO_CAP_CUSTOM_MEMORY_ORDER = 10,         // int32_t
  CUBLASLT_ALGO_CAP_POINTER_MODE_MASK = 11,           // uint32_t
  CUBLASLT_ALGO_CAP_EPILOGUE_MASK = 12,               // uint32_t
  CUBLASLT_ALGO_CAP_STAGES_IDS = 13,                  // uint32_t[]
  CUBLASLT_ALGO_CAP_LD_NEGATIVE = 14,                 // int32_t
  CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS = 15,        // uint64_t
  CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES = 16,       // uint32_t
  CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES = 17,       // uint32_t
  CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES = 18,       // uint32_t
  CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES = 19,       // uint32_t
} cublasLtMatmulAlgoCapAttributes_t;

typedef enum {
  CUBLASLT_ALGO_CONFIG_ID = 0,  // int32_t, read-only: the emulation's algorithm (0, 1 or 2)
  CUBLASLT_ALGO_CONFIG_TILE_ID = 1,
  CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,
  CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3,
  CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING = 4,
  CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION = 5,
  CUBLASLT_ALGO_CONFIG_STAGES_ID = 6,
} cublasLtMatmulAlgoConfigAttributes_t;

extern "C" {

// ---------------------------------------------------------------------------------------------
// Context, version, status.
cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle);
const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status);
const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status);
std::size_t CUBLASWINAPI cublasLtGetVersion(void);  // major * 10000 + minor * 100 + patch
std::size_t CUBLASWINAPI cublasLtGetCudartVersion(void);
cublasStatus_t CUBLASWINAPI cublasLtGetProperty(libraryPropertyType type, int* value);

// D = alpha op(A) op(B) + beta C with the descriptor's epilogue, queued on `stream`. The call
// checks everything it can (types, shapes, that every matrix is device memory of the stream's
// device and large enough, the algorithm's alignment and workspace) and returns the status
// without queueing anything when it refuses. algo == NULL: an implicit heuristic query (see
// cublaslt.cpp).
cublasStatus_t CUBLASWINAPI cublasLtMatmul(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
    const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
    const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
    cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
    std::size_t workspaceSizeInBytes, cudaStream_t stream);

// Layouts.
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout,
                                                       cudaDataType type, std::uint64_t rows,
                                                       std::uint64_t cols, std::int64_t ld);
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             const void* buf,
                                                             std::size_t sizeInBytes);
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             void* buf, std::size_t sizeInBytes,
                                                             std::size_t* sizeWritten);

// Matmul descriptors.
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType);
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf,
                                                           std::size_t sizeInBytes);
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           void* buf, std::size_t sizeInBytes,
                                                           std::size_t* sizeWritten);

// Preferences.
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
    std::size_t sizeInBytes);
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, void* buf,
    std::size_t sizeInBytes, std::size_t* sizeWritten);

// Algorithms.
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount);
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetIds(cublasLtHandle_t lightHandle,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType, cudaDataType_t Atype,
                                                     cudaDataType_t Btype, cudaDataType_t Ctype,
                                                     cudaDataType_t Dtype, int requestedAlgoCount,
                                                     int algoIdsArray[], int* returnAlgoCount);
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoInit(cublasLtHandle_t lightHandle,
                                                   cublasComputeType_t computeType,
                                                   cudaDataType_t scaleType, cudaDataType_t Atype,
                                                   cudaDataType_t Btype, cudaDataType_t Ctype,
                                                   cudaDataType_t Dtype, int algoId,
                                                   cublasLtMatmulAlgo_t* algo);
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCheck(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result);
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCapGetAttribute(
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoCapAttributes_t attr, void* buf,
    std::size_t sizeInBytes, std::size_t* sizeWritten);
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigGetAttribute(
    const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
    std::size_t sizeInBytes, std::size_t* sizeWritten);

}  // extern "C"
