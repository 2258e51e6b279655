#pragma once
// Forward and backward of one pipeline stage of GPT-2 (llm.c's architecture) over its layers,
// on this rank's tensor-parallel shard. A single rank with one stage is the whole model.
//
// Tensor parallelism reaches the model only through TensorParallelOps (one all-reduce after each
// row-parallel layer in forward, one before each column-parallel layer's input gradient in
// backward), so the same code runs on one rank with the no-op version.
#include <cstdint>
#include <vector>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/model/stage_params.hpp"

namespace pdtrain {

// Activation recomputation (gradient checkpointing): `attention` drops the T x T attention
// probabilities of every layer and recomputes them in backward; `full` keeps only each layer's
// output and reruns the layer's forward before its backward. Kernels are deterministic, so the
// gradients (and losses) are bit-identical to `none`.
enum class Recompute { none, attention, full };

class GptStage {
 public:
  // `micro_batch` sequences of `seq_len` tokens per forward; `slots` activation sets kept for
  // micro-batches whose backward is still pending (1 without pipelining).
  GptStage(StageParams& params, std::int64_t micro_batch, std::int64_t seq_len,
           TensorParallelOps& tp, int slots = 1, Recompute recompute = Recompute::none);

  // Forward of one micro-batch into activation slot `slot`. The first stage reads `tokens`
  // [B*T]; other stages read `input` [B*T*C]. The last stage also needs `targets` and returns
  // the sum of per-token losses (0 on other stages).
  double forward(int slot, const std::int32_t* tokens, const float* input,
                 const std::int32_t* targets);
  // Backward of the micro-batch in `slot`, accumulating parameter gradients. The last stage
  // seeds d(loss_i)/d(logits) with `dloss` per token (1 / tokens in the global batch); other
  // stages receive `doutput` [B*T*C] from the next stage.
  void backward(int slot, float dloss, const float* doutput);

  // The parameter units one forward / backward uses, in the order it announces them through
  // StageParams::need().
  static std::vector<std::vector<int>> forward_uses(const StageParams& p);
  static std::vector<std::vector<int>> backward_uses(const StageParams& p);

  const float* output(int slot) const;  // residual stream after the last layer [B*T*C]
  const float* dinput() const { return g_.dresidual.data(); }  // d(input) after backward
  const float* probs(int slot) const { return slot_[slot].probs.data(); }
  // Bytes of activations (all slots) and backward scratch a stage allocates; for --dry-run.
  static std::int64_t memory_bytes(const ModelShape& m, const StageSpec& s,
                                   std::int64_t micro_batch, std::int64_t seq_len, int slots);

 private:
  using bf16 = kernels::bf16;
  // In bf16 precision the matmul inputs are kept as bf16 only (ln1, ln2, fch_gelu, lnf are
  // then empty; atty is kept in both: attention writes it in fp32).
  struct LayerActs {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, residual2;
    std::vector<float> ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, residual3;
    std::vector<bf16> ln1_h, atty_h, ln2_h, fch_gelu_h;
  };
  struct SlotActs {
    std::vector<std::int32_t> tokens, targets;
    std::vector<float> input;  // embedding output or the previous stage's output
    std::vector<LayerActs> layers;
    std::vector<float> lnf, lnf_mean, lnf_rstd, logits, probs, losses;
    std::vector<bf16> lnf_h;
    std::vector<float> rowmax, ce_stats;  // cross-entropy row statistics (combined over tp)
  };
  struct GradScratch {
    std::vector<float> dresidual, dln, dqkv, datty, dpreatt, datt, dfch, dfch_gelu, dlogits,
        dlosses;
    std::vector<bf16> dout_h;  // bf16 precision: a matmul's output gradient, rounded
  };
  // A matmul of this stage's precision: out = x W^T (+ b), x given in fp32 and in bf16 (the
  // one of the precision in use is read), and its backward.
  void linear_forward(float* out, const float* x, const bf16* x_h, TensorId w, std::int64_t l,
                      const float* bias, std::int64_t C, std::int64_t OC);
  void linear_backward(float* dx, float* dweight, float* dbias, const float* dout,
                       const float* x, const bf16* x_h, TensorId w, std::int64_t l,
                       std::int64_t C, std::int64_t OC);

  void allocate(LayerActs& l, bool keep_att);
  float* att_of(LayerActs& a) { return a.att.empty() ? att_scratch_.data() : a.att.data(); }
  void layer_forward(std::int64_t l, const float* residual, LayerActs& a);
  void layer_backward(std::int64_t l, const float* residual, LayerActs& a);
  void head_forward(SlotActs& s, const float* residual);
  void head_backward(SlotActs& s, const float* residual, float dloss);

  StageParams& p_;
  TensorParallelOps& tp_;
  std::int64_t B_, T_, C_, Cl_, NHl_, layers_;
  std::int64_t v0_ = 0, v1_ = 0, V_ = 0;  // vocabulary shard rows, real-token logits here
  std::vector<SlotActs> slot_;
  std::vector<float> preatt_;  // scratch: attention scores before softmax
  Recompute recompute_;
  bool bf16_ = false;  // mixed precision (the parameters' precision)
  LayerActs scratch_;                      // full: the one layer being recomputed
  std::vector<float> att_scratch_, atty_scratch_;  // attention: recomputed probabilities
  GradScratch g_;
};

}  // namespace pdtrain
