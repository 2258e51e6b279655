#pragma once
// The GPT-2 step's kernels as op families, each an abstract class implemented once per backend,
// and KernelOps, the composition of one implementation of each:
//   CPU  (src/kernels/cpu_kernel_ops.cpp): the Kokkos kernels of gpt_kernels.hpp and the GEMM
//        layer (oneDNN or CBLAS) on host memory;
//   CUDA (src/kernels/cuda/): CUDA kernels, one file per op with its forward beside its
//        backward, and cuBLASLt GEMMs, on one GPU's compute stream.
// The model (GptStage) calls only these, so the same model code runs on either. A backend may
// replace one family of another's (KernelOps::replace_attention: e.g. a fused attention kernel
// behind the same model code); backends are chosen by name (backend_registry.hpp).
//
// Conventions (those of gpt_kernels.hpp, which is the reference every backend is tested
// against): row-major raw pointers in the backend's device memory, llm.c's shapes (B batch,
// T sequence, C channels, NH heads, N = B*T rows, under tensor parallelism the LOCAL width and
// head count); every backward ACCUMULATES (+=) into its gradient outputs, except an input
// gradient given GradWrite::overwrite (grad_write.hpp: written as if zeroed just before, unread);
// pointers documented as "may be null" are skipped when null. Ops are queued on the device's
// compute queue in call order: the host reads results only after Device::synchronize() (or a
// download).
// Determinism: every op gives the same bits run to run (no float atomics; reductions in a fixed
// order). Backends agree within stated tolerances (tests/backend/test_kernel_ops.cpp), not
// bit for bit: a GPU sums in another order than the CPU.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pdtrain/core/bf16.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/kernels/grad_write.hpp"
#include "pdtrain/optim/adamw_math.hpp"

namespace pdtrain::kernels {

using Index = std::int64_t;

// Fill, conversion, the embedding, GELU, the residual sum and the row-parallel bias.
class ElementwiseOps {
 public:
  virtual ~ElementwiseOps() = default;
  virtual void fill(float* p, Index n, float value) = 0;
  virtual void to_bf16(bf16* out, const float* in, Index n) = 0;

  // out[b,t,:] = wte[tokens[b,t] - vocab_begin,:] + wpe[t,:] (vocabulary shard
  // [vocab_begin, vocab_end): other tokens contribute 0; wpe may be null).
  virtual void encoder_forward(float* out, const std::int32_t* tokens, const float* wte,
                               const float* wpe, int B, int T, int C, int vocab_begin,
                               int vocab_end) = 0;
  // dwte (may be null) += scatter of dout by token; dwpe (may be null) += dout summed over b.
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout,
                                const std::int32_t* tokens, int B, int T, int C, int vocab_begin,
                                int vocab_end) = 0;

  // GELU (tanh form): out = gelu(inp) as fp32 or bf16; dinp += (or =) gelu'(inp) dout.
  virtual void gelu_forward(float* out, const float* inp, Index n) = 0;
  virtual void gelu_forward(bf16* out, const float* inp, Index n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, Index n,
                             GradWrite write) = 0;

  // Residual: out = a + b (its backward passes the gradient through unchanged).
  virtual void residual_forward(float* out, const float* a, const float* b, Index n) = 0;
  // out[N,OC] += bias[OC] (a row-parallel layer's bias, added after the tensor-parallel sum).
  virtual void bias_add_forward(float* out, const float* bias, int N, int OC) = 0;
  // The two above in one pass: out = residual + (branch + bias[col]) over [N,C] (a row-parallel
  // projection's tensor-parallel sum, its bias and the residual add; the same two additions as
  // bias_add_forward(branch) then residual_forward(out, residual, branch)). branch is left
  // unspecified (the CPU adds the bias into it in place).
  virtual void bias_residual_forward(float* out, const float* residual, float* branch,
                                     const float* bias, int N, int C) = 0;
};

// LayerNorm (eps 1e-5): out[N,C] as fp32 or as bf16 (the input of a bf16 matmul); mean[N],
// rstd[N] saved for backward. Backward: dinp += (or =) ..., dweight += ..., dbias += ....
class NormOps {
 public:
  virtual ~NormOps() = default;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C) = 0;
  virtual void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C, GradWrite dinp_write) = 0;
  // ElementwiseOps::bias_residual_forward(residual_out, residual, branch, branch_bias) and the
  // LayerNorm of residual_out in one pass (the CPU: those ops in that order, the same bits).
  virtual void residual_layernorm_forward(float* residual_out, float* out, float* mean,
                                          float* rstd, const float* residual, float* branch,
                                          const float* branch_bias, const float* weight,
                                          const float* bias, int N, int C) = 0;
  virtual void residual_layernorm_forward(float* residual_out, bf16* out, float* mean,
                                          float* rstd, const float* residual, float* branch,
                                          const float* branch_bias, const float* weight,
                                          const float* bias, int N, int C) = 0;
};

// Matmul: out[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC] (bias may be null). fp32, or bf16
// inputs and weights with fp32 accumulation and output. out's rows (in backward dout's) are ld
// apart, ld >= OC (OC: dense; the classifier's logits: logits_row_stride()); columns OC..ld-1
// of out are left alone.
class GemmOps {
 public:
  virtual ~GemmOps() = default;
  virtual void matmul_forward(float* out, const float* inp, const float* weight,
                              const float* bias, int N, int C, int OC, int ld) = 0;
  virtual void matmul_forward(float* out, const bf16* inp, const bf16* weight, const float* bias,
                              int N, int C, int OC, int ld) = 0;
  // dinp (may be null) += (or =, beta = 0) dout weight; dweight += dout^T inp; dbias (may be
  // null) += column sums of dout. bf16: dout is rounded once into dout_bf16 [N*ld] for both
  // products (dout's columns OC..ld-1 too: they must be finite); the bias gradient uses the fp32
  // dout.
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int C, int OC,
                               int ld, GradWrite dinp_write) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               bf16* dout_bf16, const bf16* inp, const bf16* weight, int N, int C,
                               int OC, int ld, GradWrite dinp_write) = 0;

  // The MLP's first layer and its activation in one call, so a backend may fuse them (CUDA:
  // cuBLASLt's GELU_AUX_BIAS epilogue): pre[N,OC] = inp weight^T + bias (may be null), and
  // out = gelu(pre) as fp32 (fp32 inputs) or bf16 (bf16 inputs), dense rows (ld = OC). The CPU
  // computes exactly matmul_forward then ElementwiseOps::gelu_forward (the same bits).
  virtual void matmul_gelu_forward(float* pre, float* out, const float* inp, const float* weight,
                                   const float* bias, int N, int C, int OC) = 0;
  virtual void matmul_gelu_forward(float* pre, bf16* out, const bf16* inp, const bf16* weight,
                                   const float* bias, int N, int C, int OC) = 0;
  // matmul_backward of a layer whose input was gelu(pre), taking the gradient through the GELU
  // too (CUDA: cuBLASLt's DGELU epilogue): dpre = gelu'(pre) * (dout weight), written
  // (GradWrite::overwrite); dweight += dout^T inp, dbias (may be null) += column sums of dout,
  // inp = gelu(pre) as the forward gave it; dense rows. The CPU computes exactly matmul_backward
  // into dpre then ElementwiseOps::gelu_backward in place (the same bits).
  virtual void matmul_backward_gelu(float* dpre, float* dweight, float* dbias, const float* dout,
                                    const float* pre, const float* inp, const float* weight, int N,
                                    int C, int OC) = 0;
  virtual void matmul_backward_gelu(float* dpre, float* dweight, float* dbias, const float* dout,
                                    bf16* dout_bf16, const float* pre, const bf16* inp,
                                    const bf16* weight, int N, int C, int OC) = 0;

  // bf16 activations (ActivationLayout::bf16 = Bf16Activations::gemm_io; a GPU's bf16 runs):
  // the GEMMs above with their outputs in bf16, each value computed in fp32 and rounded once
  // (core/bf16.hpp), dense rows unless an ld is given. The bias is bf16 too (a bf16 run's
  // parameters are bf16 values). out = inp weight^T + bias (may be null), out's rows ld apart
  // (ld >= OC; the classifier's bf16 logits: logits_row_stride()), columns OC..ld-1 left alone.
  virtual void matmul_forward(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                              int N, int C, int OC, int ld) = 0;
  // pre = inp weight^T + bias (may be null) and out = gelu(pre), both from the fp32 value.
  virtual void matmul_gelu_forward(bf16* pre, bf16* out, const bf16* inp, const bf16* weight,
                                   const bf16* bias, int N, int C, int OC) = 0;
  // dpre = gelu'(pre) * (dout_bf16 weight) written in bf16, dout rounded into dout_bf16 [N*OC]
  // first; dweight += dout_bf16^T inp; dbias (may be null) += column sums of the fp32 dout.
  virtual void matmul_backward_gelu(bf16* dpre, float* dweight, float* dbias, const float* dout,
                                    bf16* dout_bf16, const bf16* pre, const bf16* inp,
                                    const bf16* weight, int N, int C, int OC) = 0;
  // matmul_backward of a bf16 output gradient (what matmul_backward_gelu wrote; the classifier's
  // bf16 dlogits, rows ld apart): dinp (may be null) += (or =) dout weight; dweight += dout^T
  // inp; dbias (may be null) += column sums of dout's values, in fp32.
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const bf16* dout,
                               const bf16* inp, const bf16* weight, int N, int C, int OC, int ld,
                               GradWrite dinp_write) = 0;
};

// One call's shape: C and NH are the local (tensor-parallel) width and head count. bf16_inputs:
// the run's precision is bf16, so a backend may round q, k, v and the probabilities to bf16 for
// tensor cores (the CPU computes in fp32 either way).
struct AttentionShape {
  int B = 0, T = 0, C = 0, NH = 0;
  bool bf16_inputs = false;
};

// Causal multi-head self-attention over qkv[B,T,3C] (per token: q of all heads | k | v, head h
// at h*HS) into out[B,T,C]. How it computes is the backend's: what forward keeps for backward
// (`saved`) and the scratch it works in are opaque floats whose counts the family states, so a
// fused kernel (saving only a log-sum-exp per row) and the reference (saving the T x T
// probabilities) sit behind the same model code. Tests compare out and dqkv only.
// The buffers an attention algorithm asks for, per call shape: what sizes a stage's buffers
// (GptStage) and counts them where nothing runs (the dry run, `pdtrain plan`).
class AttentionFootprint {
 public:
  virtual ~AttentionFootprint() = default;
  // Floats kept from a forward to its backward (the reference: the B*NH*T*T probabilities).
  virtual Index saved_floats(const AttentionShape& s) const = 0;
  // Floats of scratch one forward or one backward needs, not kept between calls (the
  // reference: the scores in forward, their and the probabilities' gradients in backward).
  virtual Index scratch_floats(const AttentionShape& s) const = 0;
};

class AttentionOps : public AttentionFootprint {
 public:
  // e.g. "T x T probabilities, Kokkos softmax and GEMMs".
  virtual std::string describe() const = 0;
  // out and saved are overwritten; scratch need not be initialized.
  virtual void forward(float* out, float* saved, float* scratch, const float* qkv,
                       const AttentionShape& s) = 0;
  // dqkv += d(loss)/d(qkv) given dout = d(loss)/d(out); out and saved are the forward's (out:
  // a fused backward needs rowsum(dout * out)); scratch need not be initialized.
  virtual void backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* out, const float* saved, const AttentionShape& s) = 0;

  // bf16 activations (a GPU's bf16 runs: the qkv GEMM writes qkv in bf16, the next GEMM reads
  // out in bf16, as llm.c keeps them): qkv read as bf16, out written as bf16, rounded once
  // (core/bf16.hpp) from what the fp32 overload computes on the same values with
  // s.bf16_inputs set (bf16 activations are a bf16 run's, whatever s.bf16_inputs says); saved
  // and scratch as for the fp32 overload (the same saved_floats/scratch_floats). The backward
  // reads the forward's bf16 out (as the fp32 overload's would read those values); dqkv (+=)
  // and dout stay fp32.
  virtual void forward(bf16* out, float* saved, float* scratch, const bf16* qkv,
                       const AttentionShape& s) = 0;
  virtual void backward(float* dqkv, float* scratch, const float* dout, const bf16* qkv,
                        const bf16* out, const float* saved, const AttentionShape& s) = 0;
};

// The classifier's logits rows: V floats apart on the CPU (its BLAS gains nothing from padding,
// while its sums' order depends on the leading dimension: the CPU's results stay those of dense
// rows), V padded to a multiple of 64 floats on a GPU (every row 256-byte aligned for the
// tensor-core GEMMs: llm.c's padded vocabulary). Padding columns are never logits.
enum class LogitsRows { dense, padded };
constexpr int kLogitsRowAlign = 64;
constexpr Index logits_row_stride(Index V, LogitsRows rows) {
  return rows == LogitsRows::dense ? V
                                   : (V + kLogitsRowAlign - 1) / kLogitsRowAlign * kLogitsRowAlign;
}

// What a bf16 run keeps in bf16 between kernels. matmul_inputs (the CPU): the inputs of the
// matmuls only (the LayerNorm outputs, the attention output and the GELU output, each rounded
// from its fp32 value), everything else fp32: its results stay those it always gave. gemm_io
// (a GPU, llm.c's choice): also the GEMMs' outputs that are not summed into the residual stream,
// written in bf16 by the GEMM itself: qkv, the MLP's pre-activation, the attention output (the
// attention reads and writes bf16), and the MLP's hidden gradient (the DGELU GEMM's output).
// gemm_io also keeps the classifier's logits in bf16 (the head GEMM writes them, LossOps' bf16
// overloads read them in one pass and write the bf16 dlogits over them, which the head's
// backward GEMMs read: llm.c's fused classifier). Both keep fp32: the residual stream and what
// is added to it (the projections' outputs, summed over the tensor-parallel group), the
// LayerNorm statistics, the softmax statistics and losses, the other gradients, and every
// parameter and optimizer state.
enum class Bf16Activations { matmul_inputs, gemm_io };

// How a backend lays out the activations its kernels exchange.
struct ActivationLayout {
  LogitsRows logits_rows = LogitsRows::dense;
  Bf16Activations bf16 = Bf16Activations::matmul_inputs;
};
constexpr ActivationLayout kCpuActivations{LogitsRows::dense, Bf16Activations::matmul_inputs};
constexpr ActivationLayout kGpuActivations{LogitsRows::padded, Bf16Activations::gemm_io};

// Softmax cross-entropy over a vocabulary shard of V columns starting at vocab_begin, logits'
// rows ld apart, with no probability array (gpt_kernels.hpp's reference). Forward: rowmax, then
// partials (the caller combines rowmax by max and stats by sum over the shards after each), then
// the losses from the statistics alone. Backward: one pass that recomputes the softmax and writes
// dlogits over the logits.
class LossOps {
 public:
  virtual ~LossOps() = default;
  virtual void crossentropy_rowmax(float* rowmax, const float* logits, int N, int V, int ld) = 0;
  // stats[n] = the shard's sum of exp(logits - rowmax); stats[N+n] = target logit - max here.
  virtual void crossentropy_partials(float* stats, const float* logits, const float* rowmax,
                                     const std::int32_t* targets, int vocab_begin, int N, int V,
                                     int ld) = 0;
  // losses[n] = log(sum) - (target logit - max).
  virtual void crossentropy_losses(float* losses, const float* stats, int N) = 0;
  // In place: logits become dlogits = (softmax - onehot(target)) * dlosses[n] (the target
  // counted on its shard only; columns V..ld-1 become 0: a bf16 GEMM rounds whole rows).
  virtual void crossentropy_backward(float* logits, const float* rowmax, const float* stats,
                                     const std::int32_t* targets, const float* dlosses,
                                     int vocab_begin, int N, int V, int ld) = 0;

  // bf16 logits (Bf16Activations::gemm_io), the classifier fused: the forward in ONE pass per
  // row with an online max and sum, its statistics relative to this shard's max:
  // rowmax[n] = the shard's max; stats[n] = the shard's sum of exp(logits - rowmax[n]);
  // stats[N+n] = target logit - rowmax[n] on the target's shard, else 0; stats[2N+n] = rowmax[n]
  // again (stats holds 3N floats; crossentropy_rescale reads it after the group's max replaced
  // rowmax). With one shard these are the statistics crossentropy_losses takes.
  virtual void crossentropy_forward(float* rowmax, float* stats, const bf16* logits,
                                    const std::int32_t* targets, int vocab_begin, int N, int V,
                                    int ld) = 0;
  // Tensor parallelism, between the group's max (rowmax, combined by max) and the sum of
  // stats[0, 2N) over the group: the shard's statistics moved to the group's max, with
  // shift = stats[2N+n] - rowmax[n]: stats[n] *= exp(shift); stats[N+n] += shift on the
  // target's shard.
  virtual void crossentropy_rescale(float* stats, const float* rowmax,
                                    const std::int32_t* targets, int vocab_begin, int N,
                                    int V) = 0;
  // crossentropy_backward on bf16 logits: the bf16 dlogits (each rounded once) written over them.
  virtual void crossentropy_backward(bf16* logits, const float* rowmax, const float* stats,
                                     const std::int32_t* targets, const float* dlosses,
                                     int vocab_begin, int N, int V, int ld) = 0;
  // *sum = losses[0] + losses[1] + ... + losses[n-1], in double, in that order (one micro-batch's
  // loss, bit-identical on every backend).
  virtual void sum_losses(double* sum, const float* losses, int n) = 0;
};

// A rows x cols block at data + offset, row stride ld (a row-major tile of a stage tensor).
struct Tile {
  Index offset = 0, rows = 0, cols = 0, ld = 0;
};

// Blocks and the optimizer: the replicated baseline keeps parameters and AdamW state on its
// device, packed block after block like the holders' (each block a row-major tile of a stage
// tensor). Every backend computes these to the same bits as the holders' CPU code
// (adamw_math.hpp; no FMA contraction), so a GPU baseline equals PD with CPU holders.
class OptimizerOps {
 public:
  using Tile = kernels::Tile;
  virtual ~OptimizerOps() = default;
  // packed (the tiles back to back, each row-major) <- src's tiles.
  virtual void gather_tiles(float* packed, const float* src, const std::vector<Tile>& tiles) = 0;
  // dst's tiles <- packed. With dst_bf16 (same layout as dst; may be null) the values are
  // rounded to bf16: dst_bf16 gets them and dst their float value (bf16 precision's view).
  virtual void scatter_tiles(float* dst, bf16* dst_bf16, const float* packed,
                             const std::vector<Tile>& tiles) = 0;
  // sumsq[i] = sum of squares of the i-th of the contiguous blocks of `sizes` in `packed`, in
  // adamw_math.hpp's chunked order (sumsq in device memory).
  virtual void block_sums_of_squares(double* sumsq, const float* packed,
                                     const std::vector<Index>& sizes) = 0;
  // AdamW (adamw_element) over n contiguous elements.
  virtual void adamw(float* param, float* m, float* v, const float* grad, Index n,
                     const AdamWStep& step) = 0;
};

// One implementation of every family, all on the same device (and queue).
struct OpFamilies {
  std::unique_ptr<ElementwiseOps> elementwise;
  std::unique_ptr<NormOps> norm;
  std::unique_ptr<GemmOps> gemm;
  std::unique_ptr<AttentionOps> attention;
  std::unique_ptr<LossOps> loss;
  std::unique_ptr<OptimizerOps> optimizer;
};

// A backend's kernels: its families, and what they are. Header-only (the CUDA kernels' library
// builds one without linking this part's objects).
class KernelOps {
 public:
  using Tile = kernels::Tile;
  // `description`: the backend's, e.g. "cpu: Kokkos Serial, GEMM oneDNN 2.7" or
  // "cuda: <device>, cuBLASLt 13.0 (...)". Every family must be given. `layout`: how this
  // backend's kernels lay out the activations they exchange.
  KernelOps(std::string description, OpFamilies families, ActivationLayout layout)
      : description_(std::move(description)), f_(std::move(families)), layout_(layout) {
    PDT_CHECK(f_.elementwise && f_.norm && f_.gemm && f_.attention && f_.loss && f_.optimizer,
              "KernelOps of \"" + description_ + "\": every op family must be given");
  }

  // The backend's description and its attention's: "<description>; attention: <describe()>".
  std::string describe() const { return description_ + "; attention: " + f_.attention->describe(); }

  ElementwiseOps& elementwise() const { return *f_.elementwise; }
  NormOps& norm() const { return *f_.norm; }
  GemmOps& gemm() const { return *f_.gemm; }
  AttentionOps& attention() const { return *f_.attention; }
  LossOps& loss() const { return *f_.loss; }
  OptimizerOps& optimizer() const { return *f_.optimizer; }
  ActivationLayout layout() const { return layout_; }

  // Another attention on the same device and queue (e.g. a fused kernel in place of the
  // reference algorithm). Before any model sizes its buffers from attention(): they follow the
  // family's saved_floats/scratch_floats.
  void replace_attention(std::unique_ptr<AttentionOps> attention) {
    PDT_CHECK(attention != nullptr, "KernelOps::replace_attention: no attention family given");
    f_.attention = std::move(attention);
  }

 private:
  std::string description_;
  OpFamilies f_;
  ActivationLayout layout_;
};

// A compute rank's device and the kernels that run on it (made by a backend_registry.hpp
// factory).
struct ComputeBackend {
  std::unique_ptr<Device> owned_device;  // null for the CPU (cpu_device() is process-wide)
  Device* device = nullptr;
  std::unique_ptr<KernelOps> ops;
  std::string gpu_uuid;  // the CUDA device's UUID ("GPU-..."); empty on the CPU
};

// The CPU backend's kernels, process-wide, for code that runs on the CPU device without choosing
// a backend (tests, tools); and its attention family alone, which sizes a stage's attention
// buffers where no backend is given (the dry run, `pdtrain plan`). Neither needs Kokkos to be
// initialized until an op runs.
KernelOps& cpu_kernel_ops();
const AttentionOps& cpu_attention();
// The CUDA backend's attention buffers (src/kernels/cuda/flash_attention.hpp), for plans made
// without a GPU: the fused kernels' B*NH*T log-sum-exp saved and B*NH*T scratch where they
// take the shape (fused_attention_takes), the reference algorithm's T x T arrays elsewhere.
const AttentionFootprint& cuda_attention_footprint();
// Whether the fused kernels take heads of C / NH channels: NH divides C, C / NH <= 64 (inline:
// the CUDA kernels' library chooses by it without linking this part's objects).
constexpr int kFusedAttentionMaxHeadSize = 64;
inline bool fused_attention_takes(const AttentionShape& s) {
  return s.NH > 0 && s.C > 0 && s.C % s.NH == 0 && s.C / s.NH <= kFusedAttentionMaxHeadSize;
}

// Whether this binary was built with the CUDA backend, and how many GPUs this process sees
// (0 when there is no driver or no device: "no GPU", never an error; `why_none` then gets
// CUDA's reason, e.g. "cudaErrorInsufficientDriver: CUDA driver version is insufficient ...").
bool cuda_backend_built();
int cuda_device_count(std::string* why_none = nullptr);
// Whether GPU `gpu` lets several processes use it at once (compute mode Default; an exclusive
// or prohibited mode refuses ranks that share it). False without the GPU.
bool cuda_gpu_shareable(int gpu);
// GPU `gpu`'s UUID ("GPU-..."), the same in every process of the node; "" without it.
std::string cuda_gpu_uuid(int gpu);
// The backends this binary has, for --version: "cpu" or e.g. "cpu, cuda (sm_90)".
std::string backends_built();

}  // namespace pdtrain::kernels
