// The CPU backend's op families: the Kokkos kernels of gpt_kernels.hpp on the default execution
// space (Serial with Debian's Kokkos, OpenMP with a standalone Kokkos built so) and the GEMM
// layer. Each op fences before returning, so host memory is consistent when it returns (the
// CPU device has no queue to synchronize).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "pdtrain/kernels/backend_registry.hpp"
#include "pdtrain/kernels/bf16.hpp"
#include "pdtrain/kernels/gemm.hpp"
#include "pdtrain/kernels/gpt_kernels.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"
#include "pdtrain/optim/adamw.hpp"

namespace pdtrain::kernels {
namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using I32 = std::int32_t;

// The float values of n bf16 elements (empty for null).
std::vector<float> widened(const bf16* p, Index n) {
  std::vector<float> out(p != nullptr ? static_cast<std::size_t>(n) : 0);
  if (p != nullptr) kernels::to_float(p, out.data(), n);
  return out;
}

class CpuElementwise final : public ElementwiseOps {
 public:
  void fill(float* p, Index n, float value) override {
    fill_value(exec_, p, n, value);
    exec_.fence();
  }
  void to_bf16(bf16* out, const float* in, Index n) override { kernels::to_bf16(in, out, n); }

  void encoder_forward(float* out, const I32* tokens, const float* wte, const float* wpe, int B,
                       int T, int C, int v0, int v1) override {
    kernels::encoder_forward(exec_, out, tokens, wte, wpe, B, T, C, v0, v1);
    exec_.fence();
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const I32* tokens, int B,
                        int T, int C, int v0, int v1) override {
    kernels::encoder_backward(exec_, dwte, dwpe, dout, tokens, B, T, C, v0, v1);
    exec_.fence();
  }

  void gelu_forward(float* out, const float* inp, Index n) override {
    kernels::gelu_forward(exec_, out, inp, n);
    exec_.fence();
  }
  void gelu_forward(bf16* out, const float* inp, Index n) override {
    kernels::gelu_forward(exec_, out, inp, n);
    exec_.fence();
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, Index n,
                     GradWrite write) override {
    kernels::gelu_backward(exec_, dinp, inp, dout, n, write);
    exec_.fence();
  }

  void residual_forward(float* out, const float* a, const float* b, Index n) override {
    kernels::residual_forward(exec_, out, a, b, n);
    exec_.fence();
  }
  void bias_add_forward(float* out, const float* bias, int N, int OC) override {
    kernels::bias_add_forward(exec_, out, bias, N, OC);
    exec_.fence();
  }
  void bias_residual_forward(float* out, const float* residual, float* branch, const float* bias,
                             int N, int C) override {
    bias_residual(exec_, out, residual, branch, bias, N, C);
  }

  // bias_add_forward then residual_forward (also CpuNorm's fused op's first half).
  static void bias_residual(const Exec& exec, float* out, const float* residual, float* branch,
                            const float* bias, int N, int C) {
    kernels::bias_add_forward(exec, branch, bias, N, C);
    exec.fence();
    kernels::residual_forward(exec, out, residual, branch, Index(N) * C);
    exec.fence();
  }

 private:
  Exec exec_;
};

class CpuNorm final : public NormOps {
 public:
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override {
    kernels::layernorm_forward(exec_, out, mean, rstd, inp, w, b, N, C);
    exec_.fence();
  }
  void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override {
    kernels::layernorm_forward(exec_, out, mean, rstd, inp, w, b, N, C);
    exec_.fence();
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N, int C,
                          GradWrite dinp_write) override {
    kernels::layernorm_backward(exec_, dinp, dw, db, dout, inp, w, mean, rstd, N, C, dinp_write);
    exec_.fence();
  }
  void residual_layernorm_forward(float* residual_out, float* out, float* mean, float* rstd,
                                  const float* residual, float* branch, const float* branch_bias,
                                  const float* w, const float* b, int N, int C) override {
    CpuElementwise::bias_residual(exec_, residual_out, residual, branch, branch_bias, N, C);
    layernorm_forward(out, mean, rstd, residual_out, w, b, N, C);
  }
  void residual_layernorm_forward(float* residual_out, bf16* out, float* mean, float* rstd,
                                  const float* residual, float* branch, const float* branch_bias,
                                  const float* w, const float* b, int N, int C) override {
    CpuElementwise::bias_residual(exec_, residual_out, residual, branch, branch_bias, N, C);
    layernorm_forward(out, mean, rstd, residual_out, w, b, N, C);
  }

 private:
  Exec exec_;
};

class CpuGemm final : public GemmOps {
 public:
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N,
                      int C, int OC, int ld) override {
    kernels::matmul_forward(exec_, out, inp, w, bias, N, C, OC, ld);
    exec_.fence();
  }
  void matmul_forward(float* out, const bf16* inp, const bf16* w, const float* bias, int N, int C,
                      int OC, int ld) override {
    kernels::matmul_forward(exec_, out, inp, w, bias, N, C, OC, ld);
    exec_.fence();
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC, int ld,
                       GradWrite dinp_write) override {
    kernels::matmul_backward(exec_, dinp, dw, dbias, dout, inp, w, N, C, OC, dinp_write, ld);
    exec_.fence();
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, bf16* dout_bf16,
                       const bf16* inp, const bf16* w, int N, int C, int OC, int ld,
                       GradWrite dinp_write) override {
    kernels::matmul_backward(exec_, dinp, dw, dbias, dout, dout_bf16, inp, w, N, C, OC,
                             dinp_write, ld);
    exec_.fence();
  }

  // Unfused: the matmul, then the GELU (the bits of the two ops called one after the other).
  void matmul_gelu_forward(float* pre, float* out, const float* inp, const float* w,
                           const float* bias, int N, int C, int OC) override {
    kernels::matmul_forward(exec_, pre, inp, w, bias, N, C, OC);
    kernels::gelu_forward(exec_, out, pre, Index(N) * OC);
    exec_.fence();
  }
  void matmul_gelu_forward(float* pre, bf16* out, const bf16* inp, const bf16* w,
                           const float* bias, int N, int C, int OC) override {
    kernels::matmul_forward(exec_, pre, inp, w, bias, N, C, OC);
    kernels::gelu_forward(exec_, out, pre, Index(N) * OC);
    exec_.fence();
  }
  // dpre = dout w first, then gelu'(pre) * dpre in place (element by element: each element is
  // read before it is written, so the bits are those of a separate buffer).
  void matmul_backward_gelu(float* dpre, float* dw, float* dbias, const float* dout,
                            const float* pre, const float* inp, const float* w, int N, int C,
                            int OC) override {
    kernels::matmul_backward(exec_, dpre, dw, dbias, dout, inp, w, N, C, OC, GradWrite::overwrite);
    kernels::gelu_backward(exec_, dpre, pre, dpre, Index(N) * C, GradWrite::overwrite);
    exec_.fence();
  }
  void matmul_backward_gelu(float* dpre, float* dw, float* dbias, const float* dout,
                            bf16* dout_bf16, const float* pre, const bf16* inp, const bf16* w,
                            int N, int C, int OC) override {
    kernels::matmul_backward(exec_, dpre, dw, dbias, dout, dout_bf16, inp, w, N, C, OC,
                             GradWrite::overwrite);
    kernels::gelu_backward(exec_, dpre, pre, dpre, Index(N) * C, GradWrite::overwrite);
    exec_.fence();
  }

  // bf16 outputs (the reference a GPU's bf16 activations are checked against; the CPU's own
  // runs keep fp32 outputs, kCpuActivations): the fp32 results above, rounded once.
  void matmul_forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C,
                      int OC, int ld) override {
    std::vector<float> out32(sz(Index(N) * OC));
    const std::vector<float> bias32 = widened(bias, OC);
    kernels::matmul_forward(exec_, out32.data(), inp, w, bias ? bias32.data() : nullptr, N, C,
                            OC);
    exec_.fence();
    for (int n = 0; n < N; ++n)
      kernels::to_bf16(out32.data() + Index(n) * OC, out + Index(n) * ld, OC);
  }
  void matmul_gelu_forward(bf16* pre, bf16* out, const bf16* inp, const bf16* w, const bf16* bias,
                           int N, int C, int OC) override {
    std::vector<float> pre32(sz(Index(N) * OC));
    const std::vector<float> bias32 = widened(bias, OC);
    kernels::matmul_forward(exec_, pre32.data(), inp, w, bias ? bias32.data() : nullptr, N, C,
                            OC);
    kernels::gelu_forward(exec_, out, pre32.data(), Index(N) * OC);
    exec_.fence();
    kernels::to_bf16(pre32.data(), pre, Index(N) * OC);
  }
  void matmul_backward_gelu(bf16* dpre, float* dw, float* dbias, const float* dout,
                            bf16* dout_bf16, const bf16* pre, const bf16* inp, const bf16* w, int N,
                            int C, int OC) override {
    const Index n = Index(N) * C;
    std::vector<float> dpre32(sz(n));
    const std::vector<float> pre32 = widened(pre, n);
    kernels::matmul_backward(exec_, dpre32.data(), dw, dbias, dout, dout_bf16, inp, w, N, C, OC,
                             GradWrite::overwrite);
    kernels::gelu_backward(exec_, dpre32.data(), pre32.data(), dpre32.data(), n,
                           GradWrite::overwrite);
    exec_.fence();
    kernels::to_bf16(dpre32.data(), dpre, n);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const bf16* dout, const bf16* inp,
                       const bf16* w, int N, int C, int OC, int ld,
                       GradWrite dinp_write) override {
    const float beta = dinp_write == GradWrite::overwrite ? 0.0f : 1.0f;
    if (dinp != nullptr) gemm(false, false, N, C, OC, 1.0f, dout, ld, w, C, beta, dinp, C);
    gemm(true, false, OC, C, N, 1.0f, dout, ld, inp, C, 1.0f, dw, C);
    if (dbias != nullptr) {
      const std::vector<float> dout32 = widened(dout, Index(N) * ld);
      kernels::column_sums_add(exec_, dbias, dout32.data(), N, OC, ld);
      exec_.fence();
    }
  }

 private:
  static std::size_t sz(Index n) { return static_cast<std::size_t>(n); }

  Exec exec_;
};

// gpt_kernels.hpp's attention: saved = the probabilities att [B,NH,T,T]; scratch = the scores
// preatt in forward, dpreatt then datt in backward (each [B,NH,T,T]). The execution space is
// made per call: cpu_attention() sizes buffers where Kokkos may not be initialized.
class CpuAttention final : public AttentionOps {
 public:
  std::string describe() const override {
    return "T x T probabilities saved, Kokkos softmax between GEMMs";
  }
  Index saved_floats(const AttentionShape& s) const override { return square(s); }
  Index scratch_floats(const AttentionShape& s) const override { return 2 * square(s); }
  void forward(float* out, float* saved, float* scratch, const float* qkv,
               const AttentionShape& s) override {
    const Exec exec;
    kernels::attention_forward(exec, out, scratch, saved, qkv, s.B, s.T, s.C, s.NH);
    exec.fence();
  }
  void backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                const float* /*out*/, const float* saved, const AttentionShape& s) override {
    const Exec exec;
    kernels::attention_backward(exec, dqkv, scratch, scratch + square(s), dout, qkv, saved, s.B,
                                s.T, s.C, s.NH);
    exec.fence();
  }

  // bf16 activations: the fp32 algorithm on qkv widened (exact), out rounded once. The
  // backward needs no out (the saved probabilities carry what it would give).
  void forward(bf16* out, float* saved, float* scratch, const bf16* qkv,
               const AttentionShape& s) override {
    const std::vector<float> qkv_f = widened(qkv, 3 * rows_by_channels(s));
    std::vector<float> out_f(static_cast<std::size_t>(rows_by_channels(s)));
    forward(out_f.data(), saved, scratch, qkv_f.data(), s);
    kernels::to_bf16(out_f.data(), out, rows_by_channels(s));
  }
  void backward(float* dqkv, float* scratch, const float* dout, const bf16* qkv,
                const bf16* /*out*/, const float* saved, const AttentionShape& s) override {
    const std::vector<float> qkv_f = widened(qkv, 3 * rows_by_channels(s));
    backward(dqkv, scratch, dout, qkv_f.data(), nullptr, saved, s);
  }

 private:
  static Index square(const AttentionShape& s) { return Index(s.B) * s.NH * s.T * s.T; }
  static Index rows_by_channels(const AttentionShape& s) { return Index(s.B) * s.T * s.C; }
};

class CpuLoss final : public LossOps {
 public:
  void crossentropy_rowmax(float* rowmax, const float* logits, int N, int V, int ld) override {
    kernels::crossentropy_rowmax(exec_, rowmax, logits, N, V, ld);
    exec_.fence();
  }
  void crossentropy_partials(float* stats, const float* logits, const float* rowmax,
                             const I32* targets, int v0, int N, int V, int ld) override {
    kernels::crossentropy_partials(exec_, stats, logits, rowmax, targets, v0, N, V, ld);
    exec_.fence();
  }
  void crossentropy_losses(float* losses, const float* stats, int N) override {
    kernels::crossentropy_losses(exec_, losses, stats, N);
    exec_.fence();
  }
  void crossentropy_backward(float* logits, const float* rowmax, const float* stats,
                             const I32* targets, const float* dlosses, int v0, int N, int V,
                             int ld) override {
    kernels::crossentropy_backward(exec_, logits, rowmax, stats, targets, dlosses, v0, N, V, ld);
    exec_.fence();
  }
  // bf16 logits: the fp32 phases above on their float values (exact), the max copied to
  // stats[2N, 3N); the backward's dlogits rounded once.
  void crossentropy_forward(float* rowmax, float* stats, const bf16* logits, const I32* targets,
                            int v0, int N, int V, int ld) override {
    const std::vector<float> z = widened(logits, Index(N) * ld);
    crossentropy_rowmax(rowmax, z.data(), N, V, ld);
    crossentropy_partials(stats, z.data(), rowmax, targets, v0, N, V, ld);
    std::copy_n(rowmax, N, stats + 2 * Index(N));
  }
  void crossentropy_rescale(float* stats, const float* rowmax, const I32* targets, int v0, int N,
                            int V) override {
    for (Index n = 0; n < N; ++n) {
      const float shift = stats[2 * Index(N) + n] - rowmax[n];
      const I32 t = targets[n] - v0;
      stats[n] *= std::exp(shift);
      if (t >= 0 && t < V) stats[N + n] += shift;
    }
  }
  void crossentropy_backward(bf16* logits, const float* rowmax, const float* stats,
                             const I32* targets, const float* dlosses, int v0, int N, int V,
                             int ld) override {
    std::vector<float> z = widened(logits, Index(N) * ld);
    crossentropy_backward(z.data(), rowmax, stats, targets, dlosses, v0, N, V, ld);
    kernels::to_bf16(z.data(), logits, Index(N) * ld);
  }
  void sum_losses(double* sum, const float* losses, int n) override {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += losses[i];
    *sum = s;
  }

 private:
  Exec exec_;
};

class CpuOptimizer final : public OptimizerOps {
 public:
  void gather_tiles(float* packed, const float* src, const std::vector<Tile>& tiles) override {
    for (const Tile& t : tiles)
      for (Index r = 0; r < t.rows; ++r, packed += t.cols)
        std::copy_n(src + t.offset + r * t.ld, t.cols, packed);
  }
  void scatter_tiles(float* dst, bf16* dst_bf16, const float* packed,
                     const std::vector<Tile>& tiles) override {
    for (const Tile& t : tiles)
      for (Index r = 0; r < t.rows; ++r, packed += t.cols) {
        float* out = dst + t.offset + r * t.ld;
        if (dst_bf16 == nullptr) {
          std::copy_n(packed, t.cols, out);
          continue;
        }
        bf16* out_h = dst_bf16 + t.offset + r * t.ld;
        for (Index c = 0; c < t.cols; ++c) {
          out_h[c] = pdtrain::to_bf16(packed[c]);
          out[c] = to_float(out_h[c]);
        }
      }
  }
  void block_sums_of_squares(double* sumsq, const float* packed,
                             const std::vector<Index>& sizes) override {
    for (std::size_t i = 0; i < sizes.size(); packed += sizes[i++])
      sumsq[i] = sum_of_squares(packed, sizes[i]);
  }
  void adamw(float* param, float* m, float* v, const float* grad, Index n,
             const AdamWStep& step) override {
    adamw_elements(step, grad, param, m, v, n);
  }
};

std::unique_ptr<KernelOps> make_cpu_kernel_ops() {
  OpFamilies f;
  f.elementwise = std::make_unique<CpuElementwise>();
  f.norm = std::make_unique<CpuNorm>();
  f.gemm = std::make_unique<CpuGemm>();
  f.attention = std::make_unique<CpuAttention>();
  f.loss = std::make_unique<CpuLoss>();
  f.optimizer = std::make_unique<CpuOptimizer>();
  return std::make_unique<KernelOps>(
      std::string("cpu: Kokkos ") + Exec::name() + ", GEMM " + gemm_backend_description(),
      std::move(f), kCpuActivations);
}

ComputeBackend make_cpu_backend(int /*gpu*/) {
  ComputeBackend b;
  b.device = &cpu_device();
  b.ops = make_cpu_kernel_ops();
  return b;
}

}  // namespace

KernelOps& cpu_kernel_ops() {
  static const std::unique_ptr<KernelOps> ops = make_cpu_kernel_ops();
  return *ops;
}

const AttentionOps& cpu_attention() {
  static const CpuAttention attention;
  return attention;
}

void register_cpu_backend(std::vector<BackendEntry>& registry) {
  registry.push_back({"cpu", "cpu", make_cpu_backend});
}

}  // namespace pdtrain::kernels
