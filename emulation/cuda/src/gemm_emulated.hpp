#pragma once
// What the emulated cuBLAS (cublas.cpp) and cuBLASLt (cublaslt.cpp) share: the handles, the
// GEMM loops with their fixed summation orders (gemm_emulated.cpp), bf16 and GELU arithmetic,
// the checks that a matrix is device memory of the right device, and the status strings.
//
// The arithmetic. Every product a*b is rounded to float, then added to an fp32 accumulator (no
// FMA: the emulation compiles with -ffp-contract=off); bf16 inputs widen exactly (bits << 16).
// Each algorithm fixes the order in which one output element's K products are summed, so each
// gives the same bits run to run and the algorithms give different bits from each other:
//   lt_wide       (cuBLASLt algorithm 2, the "wide" kernel for 128-byte aligned operands, the
//                 heuristic's first choice where it applies): eight partial sums, product p
//                 going to sum p % 8, each sum in increasing p; then
//                 ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)).
//   lt_vec16      (cuBLASLt algorithm 0, the "aligned, vectorized" kernel): four partial sums,
//                 product p going to sum p % 4, each sum in increasing p; then
//                 (s0 + s1) + (s2 + s3).
//   lt_generic    (cuBLASLt algorithm 1, any alignment of the element size): one sum,
//                 ((0 + a0 b0) + a1 b1) + ... in increasing p.
//   cublas_inorder (cublasGemmEx / cublasGemmStridedBatchedEx): in increasing p, as lt_generic.
// Then t = alpha * acc (0 when alpha == 0: A and B are then not read), t = t + beta * C when
// beta != 0 (beta == 0 never reads C), and the epilogue (cuBLASLt only): t = t + bias[i]; the
// GELU input t stored to AUX; t = gelu(t), or t = t * gelu'(AUX) (DGELU); D = t rounded to D's
// type (bf16: to nearest, ties to even). BGRADA / BGRADB sum op(A)'s rows / op(B)'s columns
// over K in the algorithm's order, in fp32 in the workspace, then store them in the bias type.
//
// Which algorithm runs depends on alignment, and not only on the pointers: cuBLASLt's heuristic
// (cublasLtMatmulAlgoGetHeuristic) lists only the algorithms that can work with the alignments
// the preference states (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES, default 256). NVIDIA
// documents it: "Selecting a smaller value will exclude algorithms that can not work with matrix
// A, which is not as strictly aligned as the algorithms need." The emulation models that with
// three algorithms of different needs (cublaslt.cpp): lt_wide needs 128-byte A, B, C, D (and
// leading dimensions and batch strides of a multiple of 128 bytes), lt_vec16 16 bytes, lt_generic
// the element size. So the same shape asked for with different alignment preferences (say 256
// for one tensor, 16 for the same shape elsewhere in a layout) can get a different algorithm and
// different bits: a caller that wants one shape to give one result wherever its tensors lie must
// ask with the same (capped) alignment preferences everywhere.
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

// The handles. A cublasHandle_t cast to cublasLtHandle_t is a valid cuBLASLt handle (NVIDIA
// documents it), so the cuBLAS context begins with the cuBLASLt one.
struct cublasLtContext {
  std::uint64_t magic = 0;
  bool in_cublas_handle = false;  // the cuBLASLt part of a cublasContext: cublasDestroy frees it
};

struct cublasContext {
  cublasLtContext lt;
  std::uint64_t magic = 0;
  int device = 0;                 // current when cublasCreate ran
  cudaStream_t stream = nullptr;  // cublasSetStream
  void* workspace = nullptr;      // cublasSetWorkspace (recorded; the emulated GEMM needs none)
  std::size_t workspace_bytes = 0;
  cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

namespace cuda_emu::blas {

inline constexpr std::uint64_t kLtHandleMagic = 0x70647472'4c744858ull;      // "pdtrLtHX"
inline constexpr std::uint64_t kCublasHandleMagic = 0x70647472'43624858ull;  // "pdtrCbHX"

enum class Elem : std::uint8_t { f32, bf16 };
inline std::size_t elem_bytes(Elem e) { return e == Elem::f32 ? 4 : 2; }
inline const char* elem_name(Elem e) { return e == Elem::f32 ? "fp32" : "bf16"; }

enum class Algo : std::uint32_t {
  lt_vec16 = 0,        // CUBLASLT_ALGO_CONFIG_ID 0
  lt_generic = 1,      // CUBLASLT_ALGO_CONFIG_ID 1
  lt_wide = 2,         // CUBLASLT_ALGO_CONFIG_ID 2
  cublas_inorder = 3,  // cublasGemmEx's (not a cuBLASLt algorithm id)
};
const char* algo_name(Algo a);

// bf16: the upper half of a float.
inline float widen_bf16(std::uint16_t h) {
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(h) << 16);
}
// Round to nearest, ties to even; NaN stays NaN (quieted, sign kept); overflow goes to Inf.
inline std::uint16_t round_bf16(float x) {
  const std::uint32_t u = __builtin_bit_cast(std::uint32_t, x);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// GELU, the tanh approximation NVIDIA documents for the epilogue:
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated as x / (1 + exp(-2u)) in float
// (the same function; pdtrain's own GELU kernels use this form).
float gelu(float x);
// Its derivative: s + 2 x s (1 - s) du/dx with s = 1 / (1 + exp(-2u)).
float gelu_grad(float x);

// One strided-batched GEMM, column-major, everything resolved and checked: D (m x n) =
// epilogue(alpha op(A) op(B) + beta C) for each of `batch` products.
struct Operand {
  const void* p = nullptr;
  Elem type = Elem::f32;
  std::int64_t ld = 0;
  std::int64_t stride = 0;  // elements between batches
};

struct Gemm {
  Algo algo = Algo::lt_generic;
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  Operand a, b;
  Operand c;  // not read when beta == 0 (p may then be null); ld 0 broadcasts one column
  void* d = nullptr;
  Elem d_type = Elem::f32;
  std::int64_t ldd = 0, stride_d = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* alpha_device = nullptr;  // pointer mode device: read when the work runs
  const float* beta_device = nullptr;
  // Epilogue (cuBLASLt).
  bool bias_add = false;  // t += bias[i] before the activation
  bool gelu = false;      // D = gelu(t)
  bool aux_out = false;   // AUX(i, j) = t (the GELU input)
  bool dgelu = false;     // D = t * gelu'(AUX(i, j))
  bool bgrad_a = false;   // bias[i] = sum_p op(A)(i, p)
  bool bgrad_b = false;   // bias[j] = sum_p op(B)(p, j)
  void* bias = nullptr;
  Elem bias_type = Elem::f32;
  std::int64_t bias_stride = 0;
  void* aux = nullptr;
  Elem aux_type = Elem::f32;
  std::int64_t aux_ld = 0, aux_stride = 0;
  float* workspace = nullptr;  // bias gradient sums (workspace_bytes(*this) bytes)
};

// The workspace an algorithm needs for `g`: the fp32 bias-gradient sums of one batch.
std::size_t workspace_bytes(const Gemm& g);

// Runs the GEMM on the calling thread (from the queued work).
void run(const Gemm& g);
// Adds the GEMM, queued by `call`, to the work counts (emulator.hpp's count_work): 2 m n k
// FLOPs per product, and the bytes of A, B, D (C when beta may be non-zero, AUX when used).
void count(const char* call, const Gemm& g);

// Bytes a column-major matrix spans: from its first element to one past its last, over all
// batches (0 when it has no element).
std::size_t span_bytes(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                       std::int64_t stride, std::size_t elem);

// Empty when [p, p + bytes) lies in device memory of `device`; else why not.
std::string check_device_span(const char* what, const void* p, std::size_t bytes, int device);
// alpha and beta into g: host values read now (the caller may reuse them at once), or, in
// pointer mode device, pointers into `device`'s memory read when the work runs. "" when they
// are usable, else why not.
std::string take_scalars(Gemm& g, const void* alpha, const void* beta, bool device_scalars,
                         int device);

// Whether [p, p + a) and [q, q + b) share a byte.
bool overlap(const void* p, std::size_t a, const void* q, std::size_t b);
// Whether the `batch` column-major m x n matrices (leading dimension ld, `stride` elements apart)
// share no element: each lies past the previous one's end, or they interleave side by side
// within every column (m <= stride and batch * stride <= ld: e.g. attention heads, HS columns
// of a row each).
bool batches_disjoint(long long m, long long n, long long ld, long long stride, long long batch);

// The lowest set bit of the address, at most 256 (what an algorithm may assume of it).
std::uint32_t alignment_of(const void* p);

// Prints "cuda emulation: <call>: <why>" on stderr (one write) and returns `status`.
cublasStatus_t refuse(cublasStatus_t status, const char* call, const std::string& why);

// The arguments printed one after another: the text of a refusal.
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

const char* status_name(cublasStatus_t status);
const char* status_string(cublasStatus_t status);

// A one-line description for fault messages and queue names.
std::string describe(const char* call, const Gemm& g);

}  // namespace cuda_emu::blas
