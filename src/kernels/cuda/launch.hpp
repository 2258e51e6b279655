#pragma once
// Host entry points of the CUDA kernels, one .cu per op family (forward beside backward), called
// by the CUDA op families (cuda_kernel_ops.cpp). Each queues its work on `stream` and returns at
// once; pointers are device memory; shapes, accumulation (+=) and "may be null" are the op
// families' (kernel_ops.hpp), the exact semantics gpt_kernels.hpp's. Zero-sized work queues nothing
// (except sum_losses, which writes 0). No float atomics anywhere: every sum is in a fixed order,
// so every op gives the same bits run to run.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "pdtrain/core/bf16.hpp"
#include "pdtrain/optim/adamw_math.hpp"

namespace pdtrain::kernels::cuda {

using Index = std::int64_t;
using I32 = std::int32_t;

// ---------------------------------------------------------------------------------------------
// Column sums (bias, LayerNorm weight and bias gradients) in two deterministic stages: the rows
// are cut into slabs whose height depends on the row count only; stage 1 sums each slab's rows
// in order (one thread per column and slab: column_sums.cuh, with each op's terms), stage 2
// adds the slabs in order (one thread per column) and adds the total to the gradient.
// Scratch: count * cols floats per summed array.
struct Slabs {
  Index count = 0;  // number of slabs, at most kMaxSlabs
  Index rows = 0;   // rows per slab (the last may have fewer)
};
Slabs column_slabs(Index rows);
// Stage 2 (column_sums.cu), every summed array in one launch: for k < sums,
// out.to[k][c] += partial[k][0][c] + partial[k][1][c] + ... (slabs in order), partial[k] being
// the slabs x cols floats at partial + k * slabs * cols.
constexpr int kMaxColumnSums = 2;
struct ColumnSumsOut {
  float* to[kMaxColumnSums] = {};
};
void column_sums_finish(cudaStream_t stream, ColumnSumsOut out, int sums, const float* partial,
                        Index slabs, int cols);

// ---------------------------------------------------------------------------------------------
// residual.cu: fill, conversions between fp32 and bf16, residual.
void fill(cudaStream_t stream, float* p, Index n, float value);
void to_bf16(cudaStream_t stream, bf16* out, const float* in, Index n);  // core/bf16.hpp rounding
void to_float(cudaStream_t stream, float* out, const bf16* in, Index n);  // exact
void residual_forward(cudaStream_t stream, float* out, const float* a, const float* b, Index n);
// out[N,C] = residual + (branch + bias[c]) in one pass.
void bias_residual_forward(cudaStream_t stream, float* out, const float* residual,
                           const float* branch, const float* bias, int N, int C);

// gelu.cu
void gelu_forward(cudaStream_t stream, float* out, const float* inp, Index n);
void gelu_forward(cudaStream_t stream, bf16* out, const float* inp, Index n);
void gelu_forward(cudaStream_t stream, bf16* out, const bf16* inp, Index n);
// overwrite (here and below): dinp = 0 + ... instead of +=, dinp unread (GradWrite::overwrite).
// dinp may be dout (in place).
void gelu_backward(cudaStream_t stream, float* dinp, const float* inp, const float* dout, Index n,
                   bool overwrite);
// bf16 gradients and input (a bf16 GEMM's unfused DGELU epilogue), computed in fp32.
void gelu_backward(cudaStream_t stream, bf16* dinp, const bf16* inp, const bf16* dout, Index n,
                   bool overwrite);

// encoder.cu
void encoder_forward(cudaStream_t stream, float* out, const I32* tokens, const float* wte,
                     const float* wpe, int B, int T, int C, int vocab_begin, int vocab_end);
void encoder_backward(cudaStream_t stream, float* dwte, float* dwpe, const float* dout,
                      const I32* tokens, int B, int T, int C, int vocab_begin, int vocab_end);

// layernorm.cu
void layernorm_forward(cudaStream_t stream, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
void layernorm_forward(cudaStream_t stream, bf16* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
// bias_residual_forward(residual_out, residual, branch, branch_bias) and the LayerNorm of
// residual_out in one kernel (residual_out is not read before the kernel writes it).
void residual_layernorm_forward(cudaStream_t stream, float* residual_out, float* out, float* mean,
                                float* rstd, const float* residual, const float* branch,
                                const float* branch_bias, const float* weight, const float* bias,
                                int N, int C);
void residual_layernorm_forward(cudaStream_t stream, float* residual_out, bf16* out, float* mean,
                                float* rstd, const float* residual, const float* branch,
                                const float* branch_bias, const float* weight, const float* bias,
                                int N, int C);
// Floats of scratch layernorm_backward needs.
Index layernorm_backward_scratch(int N, int C);
void layernorm_backward(cudaStream_t stream, float* scratch, float* dinp, float* dweight,
                        float* dbias, const float* dout, const float* inp, const float* weight,
                        const float* mean, const float* rstd, int N, int C, bool overwrite);

// ---------------------------------------------------------------------------------------------
// matmul.cu: GEMMs through cuBLASLt, and the bias kernels.

// The element type of a GEMM's inputs or of its output.
enum class GemmType { f32, bf16 };

// What happens to each product t = alpha (op(A) op(B))[i,j] before it is stored in C (cuBLASLt's
// epilogue, fused into the GEMM): none; bias: C = t + bias[j]; gelu_bias: gelu_in[i,j] =
// t + bias[j] and C = gelu(t + bias[j]); dgelu: C = t * gelu'(dgelu_in[i,j]). An epilogue
// needs beta = 0 and one product (batch 1); the GELU ones a contiguous C (ldc = N), gelu_in and
// dgelu_in laid out as C.
enum class GemmEpilogue { none, bias, gelu_bias, dgelu };

// C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, row-major with row strides lda/ldb/ldc as
// stored (before op), like the CPU's kernels::gemm(); `batch` products, the i-th at
// A + i*stride_a, B + i*stride_b, C + i*stride_c (element strides). A and B are fp32 or bf16
// (`input`), products are accumulated in fp32 (CUBLAS_COMPUTE_32F, no TF32); C is fp32 or bf16
// (`output`: bf16 only with bf16 inputs, each result rounded once), and the epilogue's bias and
// GELU matrices are of C's type (cuBLASLt's default bias and aux types: D's). beta = 0 never
// reads C.
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const void* A = nullptr;
  Index lda = 0, stride_a = 0;
  const void* B = nullptr;
  Index ldb = 0, stride_b = 0;
  float beta = 0.0f;
  void* C = nullptr;
  Index ldc = 0, stride_c = 0;
  int batch = 1;
  GemmType input = GemmType::f32;
  GemmType output = GemmType::f32;
  GemmEpilogue epilogue = GemmEpilogue::none;
  const void* bias = nullptr;      // [N]: bias, gelu_bias
  void* gelu_in = nullptr;         // [M,N]: gelu_bias writes the GELU's input here
  const void* dgelu_in = nullptr;  // [M,N]: dgelu reads the forward's GELU input here
};

// cuBLASLt on one stream with a caller-owned workspace. The algorithm for a shape (and the
// matrices' alignments, capped at 16 bytes: matmul.cu) is chosen once by cuBLASLt's heuristic
// and cached with its descriptors, so the same shape always runs the same algorithm (the same
// bits). A shape cuBLASLt has no algorithm for, or refuses to run, goes to cuBLAS
// (cublasGemmStridedBatchedEx) instead, said once on stderr; its epilogue then runs unfused
// (the bias seeds C with beta = 1, the GELU kernels of gelu.cu follow). Not thread-safe.
class Gemm {
 public:
  Gemm(cudaStream_t stream, void* workspace, std::size_t workspace_bytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  void run(const GemmArgs& g);

 private:
  struct Plan;
  using Key = std::array<std::int64_t, 20>;
  Plan& plan(const GemmArgs& g, const Key& key);
  void set_epilogue_pointers(Plan& p, const GemmArgs& g);
  void run_unfused(const GemmArgs& g);
  template <class T>  // C's element type
  void run_unfused_as(const GemmArgs& g, T* C, const T* bias, T* gelu_in, const T* dgelu_in);
  void run_cublas(const GemmArgs& g);

  cudaStream_t stream_;
  void* workspace_;
  std::size_t workspace_bytes_;
  cublasLtHandle_t handle_ = nullptr;
  cublasHandle_t blas_ = nullptr;  // the fallback
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

// out[N,OC] (rows ld apart) = bias[OC] broadcast over rows (the seed a matmul with bias
// accumulates onto), fp32 or bf16 (a bf16 GEMM output's bias is bf16 as well).
void bias_fill(cudaStream_t stream, float* out, const float* bias, int N, int OC, int ld);
void bias_fill(cudaStream_t stream, bf16* out, const bf16* bias, int N, int OC, int ld);
// out[N,OC] += bias[OC]
void bias_add(cudaStream_t stream, float* out, const float* bias, int N, int OC);
// Floats of scratch bias_backward needs.
Index bias_backward_scratch(int N, int OC);
// dbias[OC] += column sums of dout[N,OC] (rows ld apart; fp32, or bf16 where a bf16 GEMM wrote
// the gradient), summed in fp32.
void bias_backward(cudaStream_t stream, float* scratch, float* dbias, const float* dout, int N,
                   int OC, int ld);
void bias_backward(cudaStream_t stream, float* scratch, float* dbias, const bf16* dout, int N,
                   int OC, int ld);

// ---------------------------------------------------------------------------------------------
// attention.cu: score and value products through `gemm` (cuBLASLt, one call per sequence b with
// the NH heads as a strided batch: head h of q, k, v is at column h*HS of qkv's rows, stride HS),
// the causal softmax and its backward one warp per row.
void attention_forward(Gemm& gemm, cudaStream_t stream, float* out, float* preatt, float* att,
                       const float* qkv, int B, int T, int C, int NH);
void attention_backward(Gemm& gemm, cudaStream_t stream, float* dqkv, float* dpreatt, float* datt,
                        const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH);

// ---------------------------------------------------------------------------------------------
// crossentropy.cu: one block per row, fixed-order block reductions; logits' rows ld apart; no
// probability array (kernel_ops.hpp's LossOps).
void crossentropy_rowmax(cudaStream_t stream, float* rowmax, const float* logits, int N, int V,
                         int ld);
void crossentropy_partials(cudaStream_t stream, float* stats, const float* logits,
                           const float* rowmax, const I32* targets, int vocab_begin, int N, int V,
                           int ld);
void crossentropy_losses(cudaStream_t stream, float* losses, const float* stats, int N);
// In place: the logits become dlogits (the padding columns V..ld-1 become 0).
void crossentropy_backward(cudaStream_t stream, float* logits, const float* rowmax,
                           const float* stats, const I32* targets, const float* dlosses,
                           int vocab_begin, int N, int V, int ld);
// bf16 logits (the fused classifier, LossOps' bf16 overloads): one pass per row with an online
// max and sum (rowmax, stats[0, 3N) relative to the shard's max), the tensor-parallel rescale
// (one thread per row), and the backward writing bf16 dlogits over the logits.
void crossentropy_forward(cudaStream_t stream, float* rowmax, float* stats, const bf16* logits,
                          const I32* targets, int vocab_begin, int N, int V, int ld);
void crossentropy_rescale(cudaStream_t stream, float* stats, const float* rowmax,
                          const I32* targets, int vocab_begin, int N, int V);
void crossentropy_backward(cudaStream_t stream, bf16* logits, const float* rowmax,
                           const float* stats, const I32* targets, const float* dlosses,
                           int vocab_begin, int N, int V, int ld);
// *sum = losses[0] + ... + losses[n-1] in double, in order, by one thread (the CPU's bits).
void sum_losses(cudaStream_t stream, double* sum, const float* losses, int n);

// ---------------------------------------------------------------------------------------------
// optimizer.cu (no FMA contraction: the holders' bits): blocks packed as tiles, their sums of
// squares in adamw_math.hpp's chunked order, AdamW. Descriptors are copied to `scratch`, device
// memory of at least optimizer_scratch_bytes(...) bytes.
struct TileDesc {
  Index offset = 0, rows = 0, cols = 0, ld = 0;  // in the strided array
  Index packed = 0;                              // where the tile starts in the packed array
};
std::size_t tiles_scratch_bytes(std::size_t tiles);
// to_packed: packed <- data's tiles; else data's tiles <- packed (with data_bf16 non-null, the
// bf16 rounding of each value into data_bf16 and its float value into data).
void copy_tiles(cudaStream_t stream, void* scratch, const TileDesc* tiles_host, int tiles,
                Index max_tile_numel, bool to_packed, float* packed, float* data, bf16* data_bf16);
std::size_t sumsq_scratch_bytes(const Index* sizes, int blocks);
void block_sums_of_squares(cudaStream_t stream, void* scratch, double* sumsq, const float* packed,
                           const Index* sizes, int blocks);
void adamw(cudaStream_t stream, float* param, float* m, float* v, const float* grad, Index n,
           const AdamWStep& step);

}  // namespace pdtrain::kernels::cuda
