// Matmul: GEMMs through cuBLASLt (fp32, or bf16 inputs with fp32 accumulation, fp32 or bf16
// output) with
// their epilogues (bias, GELU, GELU's gradient), the bias broadcast that seeds a product cuBLAS
// runs instead, the row-parallel bias add, and the bias gradient as a deterministic two-stage
// column sum.
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "column_sums.cuh"
#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {

// ---------------------------------------------------------------------------------------------
// cuBLASLt. cuBLASLt is column-major; a row-major matrix is the column-major matrix of its
// transpose, so row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's
// "A" is our B, its "B" our A, with the same transpose flags, m = N and n = M.

struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr;  // our B
  cublasLtMatrixLayout_t lt_b = nullptr;  // our A
  cublasLtMatrixLayout_t lt_c = nullptr;  // our C, also D (in place: C == D, same layout)
  cublasLtMatmulAlgo_t algo{};
  bool lt = true;  // false: cuBLASLt has no algorithm for it, cuBLAS runs it (run_cublas)
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (lt_c != nullptr) cublasLtMatrixLayoutDestroy(lt_c);
    if (lt_b != nullptr) cublasLtMatrixLayoutDestroy(lt_b);
    if (lt_a != nullptr) cublasLtMatrixLayoutDestroy(lt_a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

// Where run() puts the alignments of our A, B and C in a plan's key (then the epilogue and the
// alignments of its bias and GELU-input pointers).
constexpr int kAlignA = 14, kAlignB = 15, kAlignC = 16;

cudaDataType_t cuda_type(GemmType t) { return t == GemmType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
std::size_t elem_bytes(GemmType t) { return t == GemmType::bf16 ? sizeof(bf16) : sizeof(float); }

// The alignment a plan assumes for the matrices of a batch: the lowest set bit of the start and
// (batched) of the stride in bytes, capped at kPlanAlign. The heuristic may only offer
// algorithms that work with it (its default assumes 256 bytes, while e.g. an attention head's
// view of qkv starts HS floats after the previous one). Capped, because the choice must not
// depend on where a layout happens to put a tensor: the replicated baseline's tensor-major
// layout and a PD cache slot both start every tensor 16-byte aligned but differ beyond that, and
// another algorithm sums in another order: PD would no longer equal the baseline bit for bit.
constexpr std::uint64_t kPlanAlign = 16;
std::int64_t alignment(const void* p, Index stride, std::size_t elem_bytes, int batch) {
  std::uint64_t bits = reinterpret_cast<std::uintptr_t>(p) | kPlanAlign;
  if (batch > 1) bits |= static_cast<std::uint64_t>(stride) * elem_bytes;
  return static_cast<std::int64_t>(bits & (~bits + 1));  // lowest set bit
}

// A column-major rows x cols matrix with leading dimension ld, `batch` of them `stride`
// elements apart.
cublasLtMatrixLayout_t make_layout(cudaDataType_t type, Index rows, Index cols, Index ld, int batch,
                                   Index stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<std::uint64_t>(rows),
                                          static_cast<std::uint64_t>(cols), ld));
  if (batch > 1) {
    const std::int32_t count = batch;
    const std::int64_t offset = stride;
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                  &count, sizeof count));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &offset, sizeof offset));
  }
  return layout;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::gelu_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::none: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

const char* epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::bias: return " epilogue BIAS";
    case GemmEpilogue::gelu_bias: return " epilogue GELU_AUX_BIAS";
    case GemmEpilogue::dgelu: return " epilogue DGELU";
    case GemmEpilogue::none: break;
  }
  return "";
}

// The matrix the GELU epilogues write (gelu_bias) or read (dgelu): cuBLASLt's AUX.
const void* gelu_aux(const GemmArgs& g) {
  return g.epilogue == GemmEpilogue::gelu_bias ? static_cast<const void*>(g.gelu_in)
                                               : static_cast<const void*>(g.dgelu_in);
}
bool uses_bias(const GemmArgs& g) {
  return g.epilogue == GemmEpilogue::bias || g.epilogue == GemmEpilogue::gelu_bias;
}
bool uses_aux(const GemmArgs& g) {
  return g.epilogue == GemmEpilogue::gelu_bias || g.epilogue == GemmEpilogue::dgelu;
}

std::string describe(const GemmArgs& g) {
  return std::string(g.input == GemmType::bf16 ? "bf16" : "fp32") +
         (g.output == GemmType::bf16 ? "->bf16" : "") + " GEMM " +
         (g.trans_a ? "T" : "N") + (g.trans_b ? "T" : "N") + " M=" + std::to_string(g.M) +
         " N=" + std::to_string(g.N) + " K=" + std::to_string(g.K) +
         " lda=" + std::to_string(g.lda) + " ldb=" + std::to_string(g.ldb) +
         " ldc=" + std::to_string(g.ldc) + " batch=" + std::to_string(g.batch) +
         epilogue_name(g.epilogue);
}

// An epilogue's conditions (launch.hpp): what the fused and the unfused path both assume.
void check_epilogue(const GemmArgs& g) {
  if (g.epilogue == GemmEpilogue::none) return;
  const bool ok = g.beta == 0.0f && g.batch == 1 && (!uses_aux(g) || g.ldc == g.N) &&
                  (g.output == GemmType::f32 || g.input == GemmType::bf16) &&
                  (!uses_bias(g) || g.bias != nullptr) && (!uses_aux(g) || gelu_aux(g) != nullptr);
  if (!ok)
    fatal_abort(ExitCode::runtime,
                where(__FILE__, __LINE__) + ": " + describe(g) +
                    ": an epilogue needs beta = 0, batch 1, its bias / GELU input, for GELU "
                    "ldc = N, and a bf16 output bf16 inputs");
}

// Says once per process which shape cuBLASLt would not run and why (cuBLAS runs it instead).
void note_fallback(const GemmArgs& g, const std::string& why) {
  static std::mutex mu;
  static std::set<std::string> said;
  const std::string shape = describe(g);
  std::lock_guard lock(mu);
  if (!said.insert(shape).second) return;
  std::fprintf(stderr, "pdtrain: note: cuBLASLt does not run the %s (%s): cuBLAS's "
               "cublasGemmStridedBatchedEx does\n", shape.c_str(), why.c_str());
}

}  // namespace

Gemm::Gemm(cudaStream_t stream, void* workspace, std::size_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  CUBLAS_CHECK(cublasCreate(&blas_));
  CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  CUBLAS_CHECK(cublasSetWorkspace(blas_, workspace_, workspace_bytes_));
}

Gemm::~Gemm() {
  plans_.clear();
  if (blas_ != nullptr) cublasDestroy(blas_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Gemm::Plan& Gemm::plan(const GemmArgs& g, const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto p = std::make_unique<Plan>();
  const cudaDataType_t in_type = cuda_type(g.input);
  // fp32 compute: no TF32 (that would be CUBLAS_COMPUTE_32F_FAST_TF32), fp32 alpha/beta.
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (g.epilogue != GemmEpilogue::none) {
    const cublasLtEpilogue_t epilogue = lt_epilogue(g.epilogue);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                sizeof epilogue));
    if (uses_aux(g)) {
      const std::int64_t aux_ld = g.ldc;  // laid out as C
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                  &aux_ld, sizeof aux_ld));
    }
    set_epilogue_pointers(*p, g);  // the heuristic reads their alignment
  }
  // cuBLASLt's op(A) is m x k = N x K: stored K x N when transposed. Its op(B) is k x n = K x M:
  // stored M x K when transposed. C is m x n = N x M.
  p->lt_a = make_layout(in_type, g.trans_b ? g.K : g.N, g.trans_b ? g.N : g.K, g.ldb, g.batch,
                        g.stride_b);
  p->lt_b = make_layout(in_type, g.trans_a ? g.M : g.K, g.trans_a ? g.K : g.M, g.lda, g.batch,
                        g.stride_a);
  p->lt_c = make_layout(cuda_type(g.output), g.N, g.M, g.ldc, g.batch, g.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = workspace_bytes_;
  const std::uint32_t align_a = static_cast<std::uint32_t>(key[kAlignB]);  // cuBLASLt's A: our B
  const std::uint32_t align_b = static_cast<std::uint32_t>(key[kAlignA]);
  const std::uint32_t align_c = static_cast<std::uint32_t>(key[kAlignC]);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c));
  // NVIDIA documents the GELU input's leading dimension (EPILOGUE_AUX_LD) as a multiple of 8:
  // other widths run unfused.
  if (uses_aux(g) && g.ldc % 8 != 0) {
    cublasLtMatmulPreferenceDestroy(pref);
    p->lt = false;
    note_fallback(g, "the GELU epilogue needs a leading dimension of a multiple of 8");
    return *plans_.emplace(key, std::move(p)).first->second;
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(
      handle_, p->desc, p->lt_a, p->lt_b, p->lt_c, p->lt_c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (rc == CUBLAS_STATUS_SUCCESS && found > 0) {
    p->algo = result.algo;
  } else {
    p->lt = false;
    note_fallback(g, std::string("no algorithm for alignments A ") + std::to_string(key[kAlignA]) +
                         ", B " + std::to_string(key[kAlignB]) + ", C " +
                         std::to_string(key[kAlignC]) + " bytes: " + cublasLtGetStatusString(rc));
  }
  return *plans_.emplace(key, std::move(p)).first->second;
}

// The plan's descriptor is shared by every call of its key: this call's bias and GELU input.
void Gemm::set_epilogue_pointers(Plan& p, const GemmArgs& g) {
  if (uses_bias(g)) {
    const void* bias = g.bias;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias));
  }
  if (uses_aux(g)) {
    const void* aux = gelu_aux(g);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &aux, sizeof aux));
  }
}

void Gemm::run(const GemmArgs& g) {
  if (g.M <= 0 || g.N <= 0 || g.batch <= 0) return;
  check_epilogue(g);
  if (g.K <= 0) {
    if (g.beta == 1.0f) return;  // C += nothing
    fatal_abort(ExitCode::runtime, where(__FILE__, __LINE__) + ": " + describe(g) +
                                       " with K = 0 and beta != 1 is not supported");
  }
  const std::size_t in_bytes = elem_bytes(g.input), out_bytes = elem_bytes(g.output);
  const Key key{g.trans_a,
                g.trans_b,
                g.M,
                g.N,
                g.K,
                g.lda,
                g.ldb,
                g.ldc,
                g.stride_a,
                g.stride_b,
                g.stride_c,
                g.batch,
                static_cast<std::int64_t>(g.input),
                static_cast<std::int64_t>(g.output),
                alignment(g.A, g.stride_a, in_bytes, g.batch),
                alignment(g.B, g.stride_b, in_bytes, g.batch),
                alignment(g.C, g.stride_c, out_bytes, g.batch),
                static_cast<std::int64_t>(g.epilogue),
                alignment(uses_bias(g) ? g.bias : nullptr, 0, out_bytes, 1),
                alignment(uses_aux(g) ? gelu_aux(g) : nullptr, 0, out_bytes, 1)};
  Plan& p = plan(g, key);
  if (p.lt) {
    if (g.epilogue != GemmEpilogue::none) set_epilogue_pointers(p, g);
    const cublasStatus_t rc =
        cublasLtMatmul(handle_, p.desc, &g.alpha, g.B, p.lt_a, g.A, p.lt_b, &g.beta, g.C, p.lt_c,
                       g.C, p.lt_c, &p.algo, workspace_, workspace_bytes_, stream_);
    if (rc == CUBLAS_STATUS_SUCCESS) return;
    if (rc != CUBLAS_STATUS_NOT_SUPPORTED) cublas_fail(rc, "cublasLtMatmul", __FILE__, __LINE__);
    p.lt = false;  // refused what its heuristic offered: this shape goes to cuBLAS from now on
    note_fallback(g, std::string("cublasLtMatmul refused its algorithm: ") +
                         cublasLtGetStatusString(rc));
  }
  run_unfused(g);
}

// The product through cuBLAS and its epilogue as separate kernels: the bias seeds the output
// (beta = 1, as the CPU's matmul_forward does), the GELU kernels follow. With a bf16 output the
// seed and the GELU's input are rounded to bf16 before the next step reads them (cuBLASLt's
// fused epilogue rounds once): a fallback's numerics, within the bf16 tolerances.
void Gemm::run_unfused(const GemmArgs& g) {
  if (g.output == GemmType::bf16)
    return run_unfused_as(g, static_cast<bf16*>(g.C), static_cast<const bf16*>(g.bias),
                          static_cast<bf16*>(g.gelu_in), static_cast<const bf16*>(g.dgelu_in));
  run_unfused_as(g, static_cast<float*>(g.C), static_cast<const float*>(g.bias),
                 static_cast<float*>(g.gelu_in), static_cast<const float*>(g.dgelu_in));
}

template <class T>
void Gemm::run_unfused_as(const GemmArgs& g, T* C, const T* bias, T* gelu_in,
                          const T* dgelu_in) {
  const Index MN = Index(g.M) * g.N;
  GemmArgs seeded = g;
  seeded.beta = 1.0f;
  switch (g.epilogue) {
    case GemmEpilogue::none:
      run_cublas(g);
      return;
    case GemmEpilogue::bias:
      bias_fill(stream_, C, bias, g.M, g.N, static_cast<int>(g.ldc));
      run_cublas(seeded);
      return;
    case GemmEpilogue::gelu_bias:
      bias_fill(stream_, gelu_in, bias, g.M, g.N, g.N);
      seeded.C = gelu_in;
      run_cublas(seeded);
      gelu_forward(stream_, C, gelu_in, MN);
      return;
    case GemmEpilogue::dgelu:
      run_cublas(g);
      gelu_backward(stream_, C, dgelu_in, C, MN, /*overwrite=*/true);
      return;
  }
}

// The same product through cuBLAS (column-major, as for cuBLASLt above: its A is our B), fp32
// accumulation, no TF32 (CUBLAS_COMPUTE_32F), one algorithm for the shape run after run.
void Gemm::run_cublas(const GemmArgs& g) {
  const cudaDataType_t in_type = cuda_type(g.input);
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      blas_, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.N,
      g.M, g.K, &g.alpha, g.B, in_type, static_cast<int>(g.ldb), g.stride_b, g.A, in_type,
      static_cast<int>(g.lda), g.stride_a, &g.beta, g.C, cuda_type(g.output), static_cast<int>(g.ldc),
      g.stride_c, g.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------------------------------------
// Bias kernels.

namespace {

// out[n,o] = bias[o] (kAdd false) or out[n,o] += bias[o] (kAdd true), rows ld apart,
// grid-stride over N*OC.
template <bool kAdd, class T>
__global__ void bias_kernel(T* __restrict__ out, const T* __restrict__ bias, Index NOC, int OC,
                            int ld) {
  for (Index i = global_thread(); i < NOC; i += grid_threads()) {
    const Index at = i / OC * ld + i % OC;
    const float b = load1(bias, i % OC);
    store1(out, at, kAdd ? load1(out, at) + b : b);
  }
}

// The term of dbias of row n, column o (dout itself), for column_sums.
template <class T>
struct BiasGradTerm {
  const T* __restrict__ dout;
  int ld;
  __device__ __forceinline__ void operator()(Index n, Index o, float (&acc)[1]) const {
    acc[0] += load1(dout, n * ld + o);
  }
};

template <bool kAdd, class T>
void launch_bias(cudaStream_t stream, T* out, const T* bias, int N, int OC, int ld) {
  const Index NOC = Index(N) * OC;
  if (NOC <= 0) return;
  PDTRAIN_LAUNCH((bias_kernel<kAdd, T>), grid_for(NOC), kBlock, 0, stream)(out, bias, NOC, OC, ld);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void column_sums_of(cudaStream_t stream, float* scratch, float* dbias, const T* dout, int N,
                    int OC, int ld) {
  if (N <= 0 || OC <= 0) return;
  column_sums<1>(stream, scratch, {dbias}, N, OC, BiasGradTerm<T>{dout, ld});
}

}  // namespace

void bias_fill(cudaStream_t stream, float* out, const float* bias, int N, int OC, int ld) {
  launch_bias<false>(stream, out, bias, N, OC, ld);
}
void bias_fill(cudaStream_t stream, bf16* out, const bf16* bias, int N, int OC, int ld) {
  launch_bias<false>(stream, out, bias, N, OC, ld);
}

void bias_add(cudaStream_t stream, float* out, const float* bias, int N, int OC) {
  launch_bias<true>(stream, out, bias, N, OC, OC);
}

Index bias_backward_scratch(int N, int OC) { return column_sums_scratch(1, N, OC); }

void bias_backward(cudaStream_t stream, float* scratch, float* dbias, const float* dout, int N,
                   int OC, int ld) {
  column_sums_of(stream, scratch, dbias, dout, N, OC, ld);
}
void bias_backward(cudaStream_t stream, float* scratch, float* dbias, const bf16* dout, int N,
                   int OC, int ld) {
  column_sums_of(stream, scratch, dbias, dout, N, OC, ld);
}

}  // namespace pdtrain::kernels::cuda
