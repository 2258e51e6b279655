// The CUDA backend: its op families (on one GPU's compute stream, calling the kernels of this
// directory and cuBLASLt), its registration as "cuda" (backend_registry.hpp) and the CUDA
// entry points of kernel_ops.hpp for CUDA builds (src/kernels/no_cuda/cuda_absent.cpp stands in
// for this file otherwise).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>
#include <memory>
#include <string>
#include <utility>

#include "cuda_check.hpp"
#include "cudnn_attention.hpp"
#include "cudnn_sdpa.hpp"
#include "flash_attention.hpp"
#include "launch.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/device/cuda_device.hpp"
#include "pdtrain/kernels/backend_registry.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain::kernels {
namespace {

using cuda::GemmType;
using I32 = std::int32_t;

constexpr std::size_t kGemmWorkspaceBytes = std::size_t{32} << 20;  // cuBLASLt's workspace

std::string cublaslt_version() {
  const std::size_t v = cublasLtGetVersion();  // major * 10000 + minor * 100 + patch
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

// What the CUDA families share: the device, its compute stream (every op is queued there, in
// call order), cuBLASLt with its workspace, and device scratch. Each family holds it; the last
// one destroyed frees it (before the device: ComputeBackend destroys its ops first).
class CudaContext {
 public:
  explicit CudaContext(CudaDevice& device)
      : device_(device),
        stream_(device.compute_stream()),
        gemm_workspace_(device, static_cast<Index>(kGemmWorkspaceBytes)),
        gemm_(stream_, gemm_workspace_.data(), gemm_workspace_.bytes()) {}

  CudaDevice& device() { return device_; }
  cudaStream_t stream() const { return stream_; }
  cuda::Gemm& gemm() { return gemm_; }

  // At least `floats` floats of device scratch, valid until the next call. Growing it frees the
  // old buffer (the device waits for queued work first), so the shapes' maximum is kept.
  float* scratch(Index floats) {
    if (scratch_.size() < floats) {
      scratch_ = Buffer<float>();
      scratch_ = Buffer<float>(device_, floats);
    }
    return scratch_.data();
  }

  // Device memory for the optimizer kernels' descriptors and partial sums (grown, never shrunk:
  // the stage's block list is fixed).
  void* descriptors(std::size_t bytes) {
    if (descriptors_.bytes() < bytes) {
      descriptors_ = Buffer<std::byte>();
      descriptors_ = Buffer<std::byte>(device_, static_cast<Index>(bytes));
    }
    return descriptors_.data();
  }

 private:
  CudaDevice& device_;
  cudaStream_t stream_;
  Buffer<std::byte> gemm_workspace_;
  cuda::Gemm gemm_;
  Buffer<float> scratch_;
  Buffer<std::byte> descriptors_;
};

using Context = std::shared_ptr<CudaContext>;

class CudaElementwise final : public ElementwiseOps {
 public:
  explicit CudaElementwise(Context ctx) : ctx_(std::move(ctx)), stream_(ctx_->stream()) {}

  void fill(float* p, Index n, float value) override { cuda::fill(stream_, p, n, value); }
  void to_bf16(bf16* out, const float* in, Index n) override { cuda::to_bf16(stream_, out, in, n); }

  void encoder_forward(float* out, const I32* tokens, const float* wte, const float* wpe, int B,
                       int T, int C, int v0, int v1) override {
    cuda::encoder_forward(stream_, out, tokens, wte, wpe, B, T, C, v0, v1);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const I32* tokens, int B,
                        int T, int C, int v0, int v1) override {
    cuda::encoder_backward(stream_, dwte, dwpe, dout, tokens, B, T, C, v0, v1);
  }

  void gelu_forward(float* out, const float* inp, Index n) override {
    cuda::gelu_forward(stream_, out, inp, n);
  }
  void gelu_forward(bf16* out, const float* inp, Index n) override {
    cuda::gelu_forward(stream_, out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, Index n,
                     GradWrite write) override {
    cuda::gelu_backward(stream_, dinp, inp, dout, n, write == GradWrite::overwrite);
  }

  void residual_forward(float* out, const float* a, const float* b, Index n) override {
    cuda::residual_forward(stream_, out, a, b, n);
  }
  void bias_add_forward(float* out, const float* bias, int N, int OC) override {
    cuda::bias_add(stream_, out, bias, N, OC);
  }
  void bias_residual_forward(float* out, const float* residual, float* branch, const float* bias,
                             int N, int C) override {
    cuda::bias_residual_forward(stream_, out, residual, branch, bias, N, C);
  }

 private:
  Context ctx_;
  cudaStream_t stream_;
};

class CudaNorm final : public NormOps {
 public:
  explicit CudaNorm(Context ctx) : ctx_(std::move(ctx)), stream_(ctx_->stream()) {}

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override {
    cuda::layernorm_forward(stream_, out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override {
    cuda::layernorm_forward(stream_, out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N, int C,
                          GradWrite dinp_write) override {
    cuda::layernorm_backward(stream_, ctx_->scratch(cuda::layernorm_backward_scratch(N, C)), dinp,
                             dw, db, dout, inp, w, mean, rstd, N, C,
                             dinp_write == GradWrite::overwrite);
  }
  void residual_layernorm_forward(float* residual_out, float* out, float* mean, float* rstd,
                                  const float* residual, float* branch, const float* branch_bias,
                                  const float* w, const float* b, int N, int C) override {
    cuda::residual_layernorm_forward(stream_, residual_out, out, mean, rstd, residual, branch,
                                     branch_bias, w, b, N, C);
  }
  void residual_layernorm_forward(float* residual_out, bf16* out, float* mean, float* rstd,
                                  const float* residual, float* branch, const float* branch_bias,
                                  const float* w, const float* b, int N, int C) override {
    cuda::residual_layernorm_forward(stream_, residual_out, out, mean, rstd, residual, branch,
                                     branch_bias, w, b, N, C);
  }

 private:
  Context ctx_;
  cudaStream_t stream_;
};

class CudaGemm final : public GemmOps {
 public:
  explicit CudaGemm(Context ctx) : ctx_(std::move(ctx)), stream_(ctx_->stream()) {}

  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                      int C, int OC, int ld) override {
    forward(out, inp, w, bias, N, C, OC, ld, GemmType::f32);
  }
  void matmul_forward(float* out, const bf16* inp, const bf16* w, const float* bias, int N, int C,
                      int OC, int ld) override {
    forward(out, inp, w, bias, N, C, OC, ld, GemmType::bf16);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC, int ld,
                       GradWrite dinp_write) override {
    backward(dinp, dw, dbias, dout, dout, inp, w, N, C, OC, ld, GemmType::f32, dinp_write);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, bf16* dout_bf16,
                       const bf16* inp, const bf16* w, int N, int C, int OC, int ld,
                       GradWrite dinp_write) override {
    cuda::to_bf16(stream_, dout_bf16, dout, Index(N) * ld);
    backward(dinp, dw, dbias, dout, dout_bf16, inp, w, N, C, OC, ld, GemmType::bf16, dinp_write);
  }

  // fp32: one GEMM, its epilogue adds the bias, keeps that in pre and writes gelu(pre) to out.
  void matmul_gelu_forward(float* pre, float* out, const float* inp, const float* w,
                           const float* bias, int N, int C, int OC) override {
    if (bias == nullptr) {
      forward(pre, inp, w, nullptr, N, C, OC, OC, GemmType::f32);
      return cuda::gelu_forward(stream_, out, pre, Index(N) * OC);
    }
    ctx_->gemm().run({.trans_b = true, .M = N, .N = OC, .K = C,
                      .A = inp, .lda = C, .B = w, .ldb = C, .C = out, .ldc = OC,
                      .epilogue = cuda::GemmEpilogue::gelu_bias, .bias = bias, .gelu_in = pre});
  }
  // bf16: the GEMM writes fp32 only (its bias in the epilogue), the GELU kernel rounds to bf16.
  void matmul_gelu_forward(float* pre, bf16* out, const bf16* inp, const bf16* w,
                           const float* bias, int N, int C, int OC) override {
    forward(pre, inp, w, bias, N, C, OC, OC, GemmType::bf16);
    cuda::gelu_forward(stream_, out, pre, Index(N) * OC);
  }
  // The input-gradient GEMM's epilogue multiplies by gelu'(pre) (DGELU).
  void matmul_backward_gelu(float* dpre, float* dw, float* dbias, const float* dout,
                            const float* pre, const float* inp, const float* w, int N, int C,
                            int OC) override {
    backward(dpre, dw, dbias, dout, dout, inp, w, N, C, OC, OC, GemmType::f32,
             GradWrite::overwrite, pre);
  }
  void matmul_backward_gelu(float* dpre, float* dw, float* dbias, const float* dout,
                            bf16* dout_bf16, const float* pre, const bf16* inp, const bf16* w,
                            int N, int C, int OC) override {
    cuda::to_bf16(stream_, dout_bf16, dout, Index(N) * OC);
    backward(dpre, dw, dbias, dout, dout_bf16, inp, w, N, C, OC, OC, GemmType::bf16,
             GradWrite::overwrite, pre);
  }

  // bf16 activations: the GEMMs write bf16 (D and the GELU matrices of cuBLASLt's epilogues).
  void matmul_forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C,
                      int OC, int ld) override {
    ctx_->gemm().run({.trans_b = true, .M = N, .N = OC, .K = C,
                      .A = inp, .lda = C, .B = w, .ldb = C, .C = out, .ldc = ld,
                      .input = GemmType::bf16, .output = GemmType::bf16,
                      .epilogue = bias != nullptr ? cuda::GemmEpilogue::bias
                                                  : cuda::GemmEpilogue::none,
                      .bias = bias});
  }
  void matmul_gelu_forward(bf16* pre, bf16* out, const bf16* inp, const bf16* w, const bf16* bias,
                           int N, int C, int OC) override {
    if (bias == nullptr) {
      matmul_forward(pre, inp, w, nullptr, N, C, OC, OC);
      return cuda::gelu_forward(stream_, out, pre, Index(N) * OC);
    }
    ctx_->gemm().run({.trans_b = true, .M = N, .N = OC, .K = C,
                      .A = inp, .lda = C, .B = w, .ldb = C, .C = out, .ldc = OC,
                      .input = GemmType::bf16, .output = GemmType::bf16,
                      .epilogue = cuda::GemmEpilogue::gelu_bias, .bias = bias, .gelu_in = pre});
  }
  void matmul_backward_gelu(bf16* dpre, float* dw, float* dbias, const float* dout,
                            bf16* dout_bf16, const bf16* pre, const bf16* inp, const bf16* w, int N,
                            int C, int OC) override {
    cuda::to_bf16(stream_, dout_bf16, dout, Index(N) * OC);
    ctx_->gemm().run({.M = N, .N = C, .K = OC,
                      .A = dout_bf16, .lda = OC, .B = w, .ldb = C, .C = dpre, .ldc = C,
                      .input = GemmType::bf16, .output = GemmType::bf16,
                      .epilogue = cuda::GemmEpilogue::dgelu, .dgelu_in = pre});
    weight_and_bias_grads(dw, dbias, dout, dout_bf16, inp, N, C, OC, OC, GemmType::bf16);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const bf16* dout, const bf16* inp,
                       const bf16* w, int N, int C, int OC, int ld,
                       GradWrite dinp_write) override {
    backward(dinp, dw, dbias, dout, dout, inp, w, N, C, OC, ld, GemmType::bf16, dinp_write);
  }

 private:
  // out[N,OC] (rows ld apart) = inp[N,C] weight[OC,C]^T (+ bias, in the GEMM's epilogue).
  void forward(float* out, const void* inp, const void* weight, const float* bias, int N, int C,
               int OC, int ld, GemmType input) {
    ctx_->gemm().run({.trans_b = true, .M = N, .N = OC, .K = C,
                      .A = inp, .lda = C, .B = weight, .ldb = C, .C = out, .ldc = ld,
                      .input = input,
                      .epilogue = bias != nullptr ? cuda::GemmEpilogue::bias
                                                  : cuda::GemmEpilogue::none,
                      .bias = bias});
  }

  // dinp += (or =, beta = 0) dout weight, dweight += dout^T inp (dout_gemm: dout itself or its
  // bf16 copy, rows ld apart); dbias += column sums of dout (fp32, or a bf16 gradient). With
  // gelu_pre (overwrite only): dinp = gelu'(gelu_pre) * (dout weight), the GELU's gradient in
  // the GEMM's epilogue.
  template <class Dout>
  void backward(float* dinp, float* dweight, float* dbias, const Dout* dout,
                const void* dout_gemm, const void* inp, const void* weight, int N, int C, int OC,
                int ld, GemmType input, GradWrite dinp_write, const float* gelu_pre = nullptr) {
    if (dinp != nullptr)
      ctx_->gemm().run({.M = N, .N = C, .K = OC,
                        .A = dout_gemm, .lda = ld, .B = weight, .ldb = C,
                        .beta = dinp_write == GradWrite::overwrite ? 0.0f : 1.0f, .C = dinp,
                        .ldc = C, .input = input,
                        .epilogue = gelu_pre != nullptr ? cuda::GemmEpilogue::dgelu
                                                        : cuda::GemmEpilogue::none,
                        .dgelu_in = gelu_pre});
    weight_and_bias_grads(dweight, dbias, dout, dout_gemm, inp, N, C, OC, ld, input);
  }

  // dweight += dout_gemm^T inp; dbias (may be null) += column sums of dout.
  template <class Dout>
  void weight_and_bias_grads(float* dweight, float* dbias, const Dout* dout,
                             const void* dout_gemm, const void* inp, int N, int C, int OC, int ld,
                             GemmType input) {
    ctx_->gemm().run({.trans_a = true, .M = OC, .N = C, .K = N,
                      .A = dout_gemm, .lda = ld, .B = inp, .ldb = C,
                      .beta = 1.0f, .C = dweight, .ldc = C, .input = input});
    if (dbias != nullptr)
      cuda::bias_backward(stream_, ctx_->scratch(cuda::bias_backward_scratch(N, OC)), dbias, dout,
                          N, OC, ld);
  }

  Context ctx_;
  cudaStream_t stream_;
};

// The reference algorithm on the GPU (attention.cu): saved = the probabilities att
// [B,NH,T,T]; scratch = the scores preatt in forward, dpreatt then datt in backward.
class CudaAttention final : public AttentionOps {
 public:
  explicit CudaAttention(Context ctx) : ctx_(std::move(ctx)), stream_(ctx_->stream()) {}

  std::string describe() const override {
    return "T x T probabilities saved, fp32 cuBLASLt GEMMs around a warp-per-row softmax";
  }
  Index saved_floats(const AttentionShape& s) const override { return square(s); }
  Index scratch_floats(const AttentionShape& s) const override { return 2 * square(s); }
  void forward(float* out, float* saved, float* scratch, const float* qkv,
               const AttentionShape& s) override {
    cuda::attention_forward(ctx_->gemm(), stream_, out, scratch, saved, qkv, s.B, s.T, s.C, s.NH);
  }
  void backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                const float* /*out*/, const float* saved, const AttentionShape& s) override {
    cuda::attention_backward(ctx_->gemm(), stream_, dqkv, scratch, scratch + square(s), dout, qkv,
                             saved, s.B, s.T, s.C, s.NH);
  }

  // bf16 activations: the fp32 algorithm on qkv widened (exact) into the context's scratch, out
  // computed there too and rounded once. The backward needs no out (the saved probabilities
  // carry what it would give). The context's scratch is one buffer: the layout below is all of
  // its use in one call (the fp32 overloads and their GEMMs use none).
  void forward(bf16* out, float* saved, float* scratch, const bf16* qkv,
               const AttentionShape& s) override {
    const Index n = rows_by_channels(s);
    float* qkv_f = ctx_->scratch(4 * n);  // qkv [3n], then out [n]
    float* out_f = qkv_f + 3 * n;
    cuda::to_float(stream_, qkv_f, qkv, 3 * n);
    forward(out_f, saved, scratch, qkv_f, s);
    cuda::to_bf16(stream_, out, out_f, n);
  }
  void backward(float* dqkv, float* scratch, const float* dout, const bf16* qkv,
                const bf16* /*out*/, const float* saved, const AttentionShape& s) override {
    const Index n = rows_by_channels(s);
    float* qkv_f = ctx_->scratch(3 * n);
    cuda::to_float(stream_, qkv_f, qkv, 3 * n);
    backward(dqkv, scratch, dout, qkv_f, nullptr, saved, s);
  }

 private:
  static Index square(const AttentionShape& s) { return Index(s.B) * s.NH * s.T * s.T; }
  static Index rows_by_channels(const AttentionShape& s) { return Index(s.B) * s.T * s.C; }

  Context ctx_;
  cudaStream_t stream_;
};

// The fused kernels (flash_attention.cu): saved = the rows' log-sum-exp [B,NH,T], scratch =
// D = rowsum(dout * out) [B,NH,T] in backward; q, k, v on bf16 tensor cores in bf16 runs, fp32
// tiles on the CUDA cores in fp32 runs. Shapes the kernels do not take (heads wider than 64)
// run the reference algorithm, with its buffer sizes (kernel_ops.hpp's
// cuda_attention_footprint says the same for plans made without a GPU).
static_assert(cuda::kFlashMaxHeadSize == kFusedAttentionMaxHeadSize,
              "fused_attention_takes must say what the flash kernels take");
class CudaFusedAttention final : public AttentionOps {
 public:
  explicit CudaFusedAttention(Context ctx)
      : reference_(ctx), ctx_(std::move(ctx)), stream_(ctx_->stream()) {}

  std::string describe() const override {
    return "fused (flash) causal attention, log-sum-exp saved, bf16 tensor cores in bf16 runs; "
           "heads wider than " + std::to_string(kFusedAttentionMaxHeadSize) + ": " +
           reference_.describe();
  }
  Index saved_floats(const AttentionShape& s) const override {
    return fused_attention_takes(s) ? cuda::flash_attention_saved_floats(s.B, s.T, s.NH)
                                    : reference_.saved_floats(s);
  }
  Index scratch_floats(const AttentionShape& s) const override {
    return fused_attention_takes(s) ? cuda::flash_attention_scratch_floats(s.B, s.T, s.NH)
                                    : reference_.scratch_floats(s);
  }
  void forward(float* out, float* saved, float* scratch, const float* qkv,
               const AttentionShape& s) override {
    if (!fused_attention_takes(s)) return reference_.forward(out, saved, scratch, qkv, s);
    cuda::flash_attention_forward(stream_, out, saved, qkv, s.B, s.T, s.C, s.NH, s.bf16_inputs);
  }
  void backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                const float* out, const float* saved, const AttentionShape& s) override {
    if (!fused_attention_takes(s))
      return reference_.backward(dqkv, scratch, dout, qkv, out, saved, s);
    cuda::flash_attention_backward(stream_, dqkv, scratch, dout, qkv, out, saved, s.B, s.T, s.C,
                                   s.NH, s.bf16_inputs);
  }
  // bf16 activations: read and written by the same kernels, no conversion pass (bf16 tiles).
  void forward(bf16* out, float* saved, float* scratch, const bf16* qkv,
               const AttentionShape& s) override {
    if (!fused_attention_takes(s)) return reference_.forward(out, saved, scratch, qkv, s);
    cuda::flash_attention_forward(stream_, out, saved, qkv, s.B, s.T, s.C, s.NH, s.bf16_inputs);
  }
  void backward(float* dqkv, float* scratch, const float* dout, const bf16* qkv, const bf16* out,
                const float* saved, const AttentionShape& s) override {
    if (!fused_attention_takes(s))
      return reference_.backward(dqkv, scratch, dout, qkv, out, saved, s);
    cuda::flash_attention_backward(stream_, dqkv, scratch, dout, qkv, out, saved, s.B, s.T, s.C,
                                   s.NH, s.bf16_inputs);
  }

 private:
  CudaAttention reference_;
  Context ctx_;
  cudaStream_t stream_;
};

class CudaLoss final : public LossOps {
 public:
  explicit CudaLoss(Context ctx) : ctx_(std::move(ctx)), stream_(ctx_->stream()) {}

  void crossentropy_rowmax(float* rowmax, const float* logits, int N, int V, int ld) override {
    cuda::crossentropy_rowmax(stream_, rowmax, logits, N, V, ld);
  }
  void crossentropy_partials(float* stats, const float* logits, const float* rowmax,
                             const I32* targets, int v0, int N, int V, int ld) override {
    cuda::crossentropy_partials(stream_, stats, logits, rowmax, targets, v0, N, V, ld);
  }
  void crossentropy_losses(float* losses, const float* stats, int N) override {
    cuda::crossentropy_losses(stream_, losses, stats, N);
  }
  void crossentropy_backward(float* logits, const float* rowmax, const float* stats,
                             const I32* targets, const float* dlosses, int v0, int N, int V,
                             int ld) override {
    cuda::crossentropy_backward(stream_, logits, rowmax, stats, targets, dlosses, v0, N, V, ld);
  }
  void crossentropy_forward(float* rowmax, float* stats, const bf16* logits, const I32* targets,
                            int v0, int N, int V, int ld) override {
    cuda::crossentropy_forward(stream_, rowmax, stats, logits, targets, v0, N, V, ld);
  }
  void crossentropy_rescale(float* stats, const float* rowmax, const I32* targets, int v0, int N,
                            int V) override {
    cuda::crossentropy_rescale(stream_, stats, rowmax, targets, v0, N, V);
  }
  void crossentropy_backward(bf16* logits, const float* rowmax, const float* stats,
                             const I32* targets, const float* dlosses, int v0, int N, int V,
                             int ld) override {
    cuda::crossentropy_backward(stream_, logits, rowmax, stats, targets, dlosses, v0, N, V, ld);
  }
  void sum_losses(double* sum, const float* losses, int n) override {
    cuda::sum_losses(stream_, sum, losses, n);
  }

 private:
  Context ctx_;
  cudaStream_t stream_;
};

class CudaOptimizer final : public OptimizerOps {
 public:
  explicit CudaOptimizer(Context ctx) : ctx_(std::move(ctx)), stream_(ctx_->stream()) {}

  void gather_tiles(float* packed, const float* src, const std::vector<Tile>& tiles) override {
    copy_tiles(tiles, true, packed, const_cast<float*>(src), nullptr);
  }
  void scatter_tiles(float* dst, bf16* dst_bf16, const float* packed,
                     const std::vector<Tile>& tiles) override {
    copy_tiles(tiles, false, const_cast<float*>(packed), dst, dst_bf16);
  }
  void block_sums_of_squares(double* sumsq, const float* packed,
                             const std::vector<Index>& sizes) override {
    const int n = static_cast<int>(sizes.size());
    cuda::block_sums_of_squares(stream_,
                                ctx_->descriptors(cuda::sumsq_scratch_bytes(sizes.data(), n)),
                                sumsq, packed, sizes.data(), n);
  }
  void adamw(float* param, float* m, float* v, const float* grad, Index n,
             const AdamWStep& step) override {
    cuda::adamw(stream_, param, m, v, grad, n, step);
  }

 private:
  // Tiles with their packed offsets, then one launch (to_packed: gather, else scatter).
  void copy_tiles(const std::vector<Tile>& tiles, bool to_packed, float* packed, float* data,
                  bf16* data_bf16) {
    std::vector<cuda::TileDesc> desc;
    Index at = 0, most = 0;
    for (const Tile& t : tiles) {
      desc.push_back({t.offset, t.rows, t.cols, t.ld, at});
      at += t.rows * t.cols;
      most = std::max(most, t.rows * t.cols);
    }
    cuda::copy_tiles(stream_, ctx_->descriptors(cuda::tiles_scratch_bytes(desc.size())),
                     desc.data(), static_cast<int>(desc.size()), most, to_packed, packed, data,
                     data_bf16);
  }

  Context ctx_;
  cudaStream_t stream_;
};

// pdtrain's attention, or cuDNN's in front of it (cudnn_attention.hpp; workspace from the
// context's scratch).
std::unique_ptr<AttentionOps> make_attention(const Context& ctx, AttentionChoice choice) {
  auto own = std::make_unique<CudaFusedAttention>(ctx);
  if (choice == AttentionChoice::pdtrain) return own;
  return cuda::make_cudnn_attention(
      ctx->stream(), [ctx](Index floats) { return ctx->scratch(floats); }, std::move(own),
      choice == AttentionChoice::cudnn);
}

std::unique_ptr<KernelOps> make_cuda_kernel_ops(CudaDevice& device, AttentionChoice attention) {
  const Context ctx = std::make_shared<CudaContext>(device);
  OpFamilies f;
  f.elementwise = std::make_unique<CudaElementwise>(ctx);
  f.norm = std::make_unique<CudaNorm>(ctx);
  f.gemm = std::make_unique<CudaGemm>(ctx);
  f.attention = make_attention(ctx, attention);
  f.loss = std::make_unique<CudaLoss>(ctx);
  f.optimizer = std::make_unique<CudaOptimizer>(ctx);
  return std::make_unique<KernelOps>(
      "cuda: " + device.describe() + ", cuBLASLt " + cublaslt_version() +
          " (fp32 without TF32; bf16 inputs with fp32 accumulation)",
      std::move(f), kGpuActivations);
}

// The registry's "cuda": pdtrain's attention (the deck's choice goes through
// make_cuda_backend(gpu, attention)).
ComputeBackend make_registered_cuda_backend(int gpu) {
  return make_cuda_backend(gpu, AttentionChoice::pdtrain);
}

}  // namespace

// The CUDA backend on GPU `gpu` of this node.
ComputeBackend make_cuda_backend(int gpu, AttentionChoice attention) {
  std::string why_none;
  const int count = cuda_device_count(&why_none);
  if (count == 0)
    throw Error(ExitCode::runtime,
                "compute.device = cuda but no GPU is visible (" + why_none + ")");
  if (gpu < 0 || gpu >= count)
    throw Error(ExitCode::runtime, "compute.device = cuda: GPU " + std::to_string(gpu) +
                                       " asked for, but only " + std::to_string(count) +
                                       " GPU(s) are visible (CUDA_VISIBLE_DEVICES?)");
  auto device = std::make_unique<CudaDevice>(gpu);
  ComputeBackend backend;
  backend.device = device.get();
  backend.gpu_uuid = device->uuid();
  backend.ops = make_cuda_kernel_ops(*device, attention);
  backend.owned_device = std::move(device);
  return backend;
}

bool cuda_backend_built() { return true; }

int cuda_device_count(std::string* why_none) {
  int count = 0;
  // Without a driver (cudaErrorInsufficientDriver: also a driver too old for this runtime) or a
  // device (cudaErrorNoDevice), or with any other reason the runtime cannot start, this process
  // has no GPU; the reason is CUDA's own. Clear the error it leaves.
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    if (why_none != nullptr)
      *why_none = std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
    return 0;
  }
  if (count == 0 && why_none != nullptr) *why_none = "no CUDA device";
  return count;
}

std::string cuda_gpu_uuid(int gpu) { return gpu_uuid(gpu); }

bool cuda_gpu_shareable(int gpu) {
  int mode = cudaComputeModeDefault;
  if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, gpu) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return mode == cudaComputeModeDefault;
}

void register_cuda_backends(std::vector<BackendEntry>& registry) {
  registry.push_back({"cuda",
                      std::string("cuda (") + PDTRAIN_CUDA_ARCH_LIST + ") with attention by cuDNN " +
                          cuda::cudnn_version() + " or pdtrain (compute.attention)",
                      make_registered_cuda_backend});
}

}  // namespace pdtrain::kernels
