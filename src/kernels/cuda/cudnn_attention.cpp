// The cuDNN attention family: AttentionOps over cuDNN's fused attention (cudnn_sdpa.hpp).
//
// What runs where: the bf16 overloads (a bf16 run's activations) and the fp32 overloads with
// bf16_inputs (their q, k, v rounded to bf16 first, as the contract allows) run cuDNN when it
// takes the shape; the fp32 overloads without bf16_inputs (an fp32 run: cuDNN's fused attention
// takes FP16/BF16 only) and refused shapes run pdtrain's family. saved: cuDNN's stats [B,NH,T]
// (the log-sum-exp pdtrain's fused kernel saves too); saved_floats and scratch_floats are the
// pdtrain family's wherever that could run the call (they are never smaller than cuDNN's
// B*NH*T), so a stage's buffers fit whichever runs.
//
// cuDNN computes in bf16 what it reads and writes: dout is rounded to bf16 and the gradients
// come back in bf16, added onto the fp32 dqkv (+=, the family contract: kernel_ops.hpp) by
// widening them exactly and one fp32 addition each. All of that and cuDNN's workspace live in
// the device's scratch.
#include "cudnn_attention.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <utility>

#include "cudnn_sdpa.hpp"
#include "launch.hpp"
#include "pdtrain/core/error.hpp"

namespace pdtrain::kernels::cuda {
namespace {

Index floats_for_bytes(std::size_t bytes) { return static_cast<Index>((bytes + 3) / 4); }
Index bf16_floats(Index n) { return (n + 1) / 2; }  // floats holding n bf16 (rounded up)

class CudnnAttention final : public AttentionOps {
 public:
  CudnnAttention(cudaStream_t stream, std::function<float*(Index)> device_scratch,
                 std::unique_ptr<AttentionOps> pdtrain_attention, bool required)
      : stream_(stream),
        scratch_(std::move(device_scratch)),
        pdtrain_(std::move(pdtrain_attention)),
        sdpa_(stream),
        required_(required) {}

  std::string describe() const override {
    return "cuDNN " + cudnn_version() +
           " fused attention (bf16 Q/K/V/O, fp32 log-sum-exp saved, causal, deterministic "
           "backward); where cuDNN cannot run it: " + pdtrain_->describe();
  }

  Index saved_floats(const AttentionShape& s) const override {
    if (!runs_fp32_call(s) && cudnn_takes(s)) return rows(s);
    return pdtrain_->saved_floats(s);
  }
  Index scratch_floats(const AttentionShape& s) const override {
    return pdtrain_->scratch_floats(s);
  }

  void forward(float* out, float* saved, float* scratch, const float* qkv,
               const AttentionShape& s) override {
    if (runs_fp32_call(s) || !cudnn_takes(s)) return pdtrain_->forward(out, saved, scratch, qkv, s);
    const Index n = channels(s);
    char* ws = workspace(s, bf16_floats(4 * n));
    auto* qkv16 = reinterpret_cast<bf16*>(ws + cudnn_bytes(s));  // qkv [3n], then out [n]
    bf16* out16 = qkv16 + 3 * n;
    to_bf16(stream_, qkv16, qkv, 3 * n);
    sdpa_.forward(shape(s), out16, saved, qkv16, ws);
    to_float(stream_, out, out16, n);
  }
  void backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                const float* out, const float* saved, const AttentionShape& s) override {
    if (runs_fp32_call(s) || !cudnn_takes(s))
      return pdtrain_->backward(dqkv, scratch, dout, qkv, out, saved, s);
    const Index n = channels(s);
    char* ws = workspace(s, gradient_floats(n) + bf16_floats(4 * n));
    // After cudnn_backward's floats: qkv [3n], then out [n], in bf16.
    auto* qkv16 = reinterpret_cast<bf16*>(ws + cudnn_bytes(s) +
                                          static_cast<std::size_t>(gradient_floats(n)) * 4);
    bf16* out16 = qkv16 + 3 * n;
    to_bf16(stream_, qkv16, qkv, 3 * n);
    to_bf16(stream_, out16, out, n);
    cudnn_backward(dqkv, dout, qkv16, out16, saved, s, ws);
  }

  void forward(bf16* out, float* saved, float* scratch, const bf16* qkv,
               const AttentionShape& s) override {
    if (!cudnn_takes(s)) return pdtrain_->forward(out, saved, scratch, qkv, s);
    sdpa_.forward(shape(s), out, saved, qkv, workspace(s, 0));
  }
  void backward(float* dqkv, float* scratch, const float* dout, const bf16* qkv, const bf16* out,
                const float* saved, const AttentionShape& s) override {
    if (!cudnn_takes(s)) return pdtrain_->backward(dqkv, scratch, dout, qkv, out, saved, s);
    cudnn_backward(dqkv, dout, qkv, out, saved, s, workspace(s, gradient_floats(channels(s))));
  }

 private:
  static SdpaShape shape(const AttentionShape& s) {
    return {s.B, s.T, s.NH, s.NH > 0 ? s.C / s.NH : 0};
  }
  static Index channels(const AttentionShape& s) { return Index(s.B) * s.T * s.C; }
  static Index rows(const AttentionShape& s) { return Index(s.B) * s.NH * s.T; }
  // Floats of cudnn_backward's bf16 dout [n] and bf16 dqkv [3n], then the widened dqkv [3n].
  static Index gradient_floats(Index n) { return bf16_floats(n) + bf16_floats(3 * n) + 3 * n; }

  // An fp32 run's call (fp32 overload without bf16_inputs): pdtrain's kernel, said once.
  bool runs_fp32_call(const AttentionShape& s) const {
    if (s.bf16_inputs) return false;
    say_once("cuDNN's fused attention is 16-bit only: an fp32 run's attention is pdtrain's "
             "kernel");
    return true;
  }

  // Whether cuDNN runs the shape (its plans build); says once why not, or throws when cuDNN
  // was required for a bf16 run.
  bool cudnn_takes(const AttentionShape& s) const {
    const bool heads = s.NH > 0 && s.C > 0 && s.C % s.NH == 0;
    const std::string why =
        heads ? sdpa_.refusal(shape(s)) : std::string("the heads do not divide the channels");
    if (why.empty()) return true;
    const std::string what = "cuDNN cannot run attention of " + std::to_string(s.NH) +
                             " heads of " + std::to_string(heads ? s.C / s.NH : 0) +
                             " channels, T " + std::to_string(s.T) + ": " + why;
    if (required_ && s.bf16_inputs)
      throw Error(ExitCode::runtime,
                  "compute.attention = \"cudnn\": " + what +
                      " (compute.attention = \"auto\" runs pdtrain's kernel there)");
    say_once(what + "; pdtrain's kernel runs it");
    return false;
  }

  void say_once(const std::string& line) const {
    if (said_.insert(line).second)
      std::fprintf(stderr, "pdtrain: note: compute.attention: %s\n", line.c_str());
  }

  // Bytes of the device's scratch cuDNN uses: its workspace, the backward's softmax sums
  // (256-byte multiples).
  std::size_t cudnn_bytes(const AttentionShape& s) const {
    return std::max(sdpa_.workspace_bytes(shape(s)), sdpa_.backward_scratch_bytes(shape(s)));
  }
  // The device's scratch: cudnn_bytes(s), then `extra_floats` floats.
  char* workspace(const AttentionShape& s, Index extra_floats) {
    return reinterpret_cast<char*>(scratch_(floats_for_bytes(cudnn_bytes(s)) + extra_floats));
  }

  // dqkv += the gradients cuDNN writes in bf16, from bf16 q, k, v and out; ws from workspace()
  // with at least gradient_floats(n) extra floats.
  void cudnn_backward(float* dqkv, const float* dout, const bf16* qkv, const bf16* out,
                      const float* saved, const AttentionShape& s, char* ws) {
    const Index n = channels(s);
    auto* dout16 = reinterpret_cast<bf16*>(ws + cudnn_bytes(s));
    auto* dqkv16 = reinterpret_cast<bf16*>(reinterpret_cast<float*>(dout16) + bf16_floats(n));
    float* dqkv_f = reinterpret_cast<float*>(dqkv16) + bf16_floats(3 * n);
    to_bf16(stream_, dout16, dout, n);
    sdpa_.backward(shape(s), dqkv16, dout16, qkv, out, saved, ws);
    to_float(stream_, dqkv_f, dqkv16, 3 * n);
    residual_forward(stream_, dqkv, dqkv, dqkv_f, 3 * n);
  }

  cudaStream_t stream_;
  std::function<float*(Index)> scratch_;
  std::unique_ptr<AttentionOps> pdtrain_;
  mutable CudnnSdpa sdpa_;  // builds and caches plans when asked about a shape
  bool required_;
  mutable std::set<std::string> said_;
};

}  // namespace

std::unique_ptr<AttentionOps> make_cudnn_attention(
    cudaStream_t stream, std::function<float*(Index floats)> device_scratch,
    std::unique_ptr<AttentionOps> pdtrain_attention, bool required) {
  return std::make_unique<CudnnAttention>(stream, std::move(device_scratch),
                                          std::move(pdtrain_attention), required);
}

}  // namespace pdtrain::kernels::cuda
