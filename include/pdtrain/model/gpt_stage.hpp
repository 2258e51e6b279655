#pragma once
// Forward and backward of one pipeline stage of GPT-2 (llm.c's architecture) over its layers,
// on this rank's tensor-parallel shard. A single rank with one stage is the whole model.
//
// The stage runs on its parameters' Device through a KernelOps of that device (the CPU's
// Kokkos kernels, or CUDA kernels on a GPU): activations, gradients and losses live in device
// memory, attention's sized by the backend's attention family (what it saves per layer, the
// scratch it works in); inputs (tokens, a previous stage's activations, a next stage's
// gradient) may come from host memory and are copied in. Losses stay on the device until
// take_loss_sum(), one read per step.
//
// Tensor parallelism is inside the stage, at Megatron's points: one all-reduce after each
// row-parallel layer in forward, one before each column-parallel layer's input gradient in
// backward, and the vocabulary-parallel embedding and cross-entropy, all through
// TensorParallelOps (on device memory: NCCL, or MPI staged through the host on a GPU rank).
// With NoTensorParallel the same code is the single-rank model.
#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/model/stage_program.hpp"

namespace pdtrain {

// Activation recomputation (gradient checkpointing): `attention` drops what the attention
// saves for backward (the reference's T x T probabilities) of every layer and recomputes it in
// backward; `full` keeps only each layer's
// output and reruns the layer's forward before its backward. Kernels are deterministic, so the
// gradients (and losses) are bit-identical to `none`.
enum class Recompute { none, attention, full };

class GptStage {
 public:
  // `micro_batch` sequences of `seq_len` tokens per forward; `slots` activation sets kept for
  // micro-batches whose backward is still pending (1 without pipelining). `ops` must run on
  // params.device() (the default: the CPU's kernels).
  // `order` layer: `slots` is the micro-batch count of a step (see forward_layer_major).
  GptStage(StageParams& params, std::int64_t micro_batch, std::int64_t seq_len,
           TensorParallelOps& tp, int slots = 1, Recompute recompute = Recompute::none,
           kernels::KernelOps& ops = kernels::cpu_kernel_ops(),
           StageOrder order = StageOrder::micro_batch);

  // Forward of one micro-batch into activation slot `slot`. The first stage reads `tokens`
  // [B*T]; other stages read `input` [B*T*C]. The last stage also needs `targets` and adds the
  // micro-batch's sum of per-token losses to the stage's loss ledger. Host or device pointers.
  void forward(int slot, const std::int32_t* tokens, const float* input,
               const std::int32_t* targets);
  // Backward of the micro-batch in `slot`, accumulating parameter gradients. The last stage
  // seeds d(loss_i)/d(logits) with `dloss` per token (1 / tokens in the global batch); other
  // stages receive `doutput` [B*T*C] (host or device memory) from the next stage.
  void backward(int slot, float dloss, const float* doutput);
  // Layer-major order (StageOrder::layer; a stage with the embedding and the head): load()
  // each micro-batch's tokens into slots 0..n-1, then forward_layer_major(n) runs the embedding
  // of every micro-batch, then layer 0 of every micro-batch, ..., then the head (losses added to
  // the ledger in micro-batch order), and backward_layer_major(n) the reverse. Each unit is
  // announced once (the same StageProgram use lists as one micro-batch's pass). Every parameter's gradient adds its micro-batches in the same order as
  // micro-batch-major, except the tied embedding's: all head parts, then all lookup parts.
  // Both orders walk the stage's StageProgram, which announces every unit use (need(),
  // grads_begin()/grads_end()) in the order its use lists say.
  void load(int slot, const std::int32_t* tokens, const std::int32_t* targets);
  void forward_layer_major(int n);
  void backward_layer_major(int n, float dloss);
  // The sum of the losses of every forward since the last call, added micro-batch by
  // micro-batch in forward order (each micro-batch's tokens in order, in double): one device
  // read. 0 on stages without the head.
  double take_loss_sum();

  const StageProgram& program() const { return program_; }

  // Device memory: the residual stream after the last layer [B*T*C], d(input) after backward.
  const float* output(int slot) const;
  const float* dinput() const { return acts_.grads.dresidual.data(); }
  // Device memory: the last stage's logits of the forward in `slot`, B*T rows of this rank's
  // real vocabulary columns, logits_row_stride() floats apart (what a sampler reads; the loss has
  // been taken from them already; the slot's backward overwrites them with their gradient).
  // Not with bf16 activations (Bf16Activations::gemm_io: the logits are bf16 there).
  const float* logits(int slot) const;
  std::int64_t logits_row_stride() const { return dims_.ld; }
  std::int64_t activation_numel() const { return dims_.B * dims_.T * dims_.C; }
  // Bytes of activations (all slots), backward scratch and loss ledger a stage allocates: the
  // same allocation plan the constructor follows (for --dry-run and `pdtrain plan`), with the
  // attention buffers `attention` asks for and the activation layout `layout` (by default the
  // CPU backend's).
  static std::int64_t memory_bytes(const ModelShape& m, const StageSpec& s,
                                   std::int64_t micro_batch, std::int64_t seq_len, int slots,
                                   Recompute recompute = Recompute::none,
                                   Precision precision = Precision::fp32,
                                   StageOrder order = StageOrder::micro_batch,
                                   const kernels::AttentionFootprint& attention =
                                       kernels::cpu_attention(),
                                   kernels::ActivationLayout layout = kernels::kCpuActivations);

 private:
  template <class T>
  using Buf = Buffer<T>;
  // In bf16 precision the matmul inputs are kept as bf16 only (ln1, ln2, fch_gelu, lnf are
  // then empty; with the CPU's layout atty is kept in both: attention writes it in fp32); with a
  // GPU's (Bf16Activations::gemm_io) qkv, atty and fch are bf16 only (qkv_h, atty_h, fch_h).
  // attn_saved: what the attention keeps for its backward (empty when recomputed).
  struct LayerActs {
    Buf<float> ln1, ln1_mean, ln1_rstd, qkv, atty, attn_saved, attproj, residual2;
    Buf<float> ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, residual3;
    Buf<bf16> ln1_h, qkv_h, atty_h, ln2_h, fch_h, fch_gelu_h;
  };
  struct SlotActs {
    Buf<std::int32_t> tokens, targets;
    Buf<float> input;  // embedding output or the previous stage's output
    std::vector<LayerActs> layers;
    Buf<float> lnf, lnf_mean, lnf_rstd, losses;
    Buf<float> logits;  // [B*T, ld]; the head's backward turns them into dlogits in place
    Buf<bf16> logits_h;  // gemm_io: the logits in bf16 instead (dlogits in place too)
    Buf<bf16> lnf_h;
    Buf<float> rowmax, ce_stats;  // cross-entropy row statistics (combined over tp; gemm_io: 3N)
    Buf<float> dresidual;  // layer-major: this micro-batch's residual gradient between units
  };
  struct GradScratch {
    Buf<float> dresidual, dln, dqkv, datty, dfch, dlosses;
    Buf<bf16> dout_h;  // bf16 precision: a matmul's output gradient, rounded
    Buf<bf16> dfch_h;  // gemm_io: the MLP's hidden gradient as the DGELU GEMM writes it
  };
  // Everything the stage allocates, sized by allocate() from the stage's dimensions.
  struct Activations {
    std::vector<SlotActs> slots;
    Buf<float> attn_scratch;  // the attention's scratch (one forward or backward at a time)
    LayerActs recompute_layer;  // full: the one layer being recomputed
    Buf<float> attn_saved_scratch, atty_scratch;  // attention: its recomputed forward
    Buf<bf16> atty_scratch_h;                     // (gemm_io: its output in bf16)
    GradScratch grads;
    Buf<double> loss_ledger;  // one loss sum per forward since take_loss_sum()
  };
  struct Dims {
    std::int64_t B = 0, T = 0, C = 0, Cl = 0, NHl = 0, layers = 0;
    std::int64_t v0 = 0, v1 = 0, V = 0;  // vocabulary shard rows, real-token logits here
    std::int64_t ld = 0;                 // logits' row stride (kernels::logits_row_stride)
    kernels::AttentionShape attn;         // one layer's attention call
    std::int64_t attn_saved = 0, attn_scratch = 0;  // its floats (the attention family's)
    bool embedding = false, head = false, bf16 = false, layer_major = false;
    bool gemm_io = false;  // bf16 with Bf16Activations::gemm_io: GEMMs write bf16 activations
    int slots = 1;
    Recompute recompute = Recompute::none;
  };
  static constexpr std::int64_t kLedgerSize = 64;  // forwards between two device reads

  static Dims dims_of(const ModelShape& m, const StageSpec& s, std::int64_t micro_batch,
                      std::int64_t seq_len, int slots, Recompute recompute, bool bf16,
                      StageOrder order, const kernels::AttentionFootprint& attention,
                      kernels::ActivationLayout layout);
  // Sizes every buffer of `a` with alloc(buffer, elements): the constructor allocates,
  // memory_bytes() counts.
  template <class Alloc>
  static void allocate(const Dims& d, Activations& a, Alloc&& alloc);
  template <class Alloc>
  static void allocate_layer(const Dims& d, LayerActs& l, bool keep_saved, Alloc&& alloc);
  // The bytes allocate() asks for, and what an out-of-memory error names while it does.
  static std::int64_t allocated_bytes(const Dims& d);
  static std::string activations_label(const Dims& d, std::int64_t bytes);

  // A matmul of this stage's precision: out = x W^T (+ b), x given in fp32 and in bf16 (the
  // one of the precision in use is read), and its backward (dx overwritten, the parameter
  // gradients added to). out's (dout's) rows are ld apart (0: OC, dense).
  void linear_forward(float* out, const Buf<float>& x, const Buf<bf16>& x_h, TensorId w,
                      std::int64_t l, const float* bias, std::int64_t C, std::int64_t OC,
                      std::int64_t ld = 0);
  void linear_backward(float* dx, float* dweight, float* dbias, const float* dout,
                       const Buf<float>& x, const Buf<bf16>& x_h, TensorId w, std::int64_t l,
                       std::int64_t C, std::int64_t OC, std::int64_t ld = 0);
  void layernorm_forward(Buf<float>& out, Buf<bf16>& out_h, Buf<float>& mean, Buf<float>& rstd,
                         const float* inp, TensorId w, TensorId b, std::int64_t l);

  float* attn_saved_of(LayerActs& a) {
    return a.attn_saved.empty() ? acts_.attn_saved_scratch.data() : a.attn_saved.data();
  }
  // The traversals: run the program's steps forward or backward, announcing each step's units
  // around `body` (one step's arithmetic, for one micro-batch or all of them).
  template <class Body>
  void run_forward(Body&& body);
  template <class Body>
  void run_backward(Body&& body);
  void forward_step(const StageStep& s, SlotActs& a);
  void backward_step(const StageStep& s, int slot, float dloss);
  void embed(SlotActs& a);
  // Layer i (of the stage) of the micro-batch in `a`, keeping what its backward needs.
  void forward_kept(std::int64_t i, SlotActs& a);
  void backward_kept(std::int64_t i, SlotActs& a);
  const float* layer_input(const SlotActs& a, std::int64_t i) const {
    return i > 0 ? a.layers[i - 1].residual3.data() : a.input.data();
  }
  void head_and_loss(SlotActs& a);
  void encoder_backward(SlotActs& a);
  // Runs f with the micro-batch's own residual gradient as the backward's (layer-major).
  template <class F>
  void with_dresidual_of(SlotActs& a, F&& f) {
    std::swap(acts_.grads.dresidual, a.dresidual);
    f();
    std::swap(acts_.grads.dresidual, a.dresidual);
  }
  void layer_forward(std::int64_t l, const float* residual, LayerActs& a);
  void layer_backward(std::int64_t l, const float* residual, LayerActs& a);
  void qkv_and_attention_forward(std::int64_t l, LayerActs& a);
  void mlp_hidden_forward(std::int64_t l, LayerActs& a);
  void attention_backward(LayerActs& a);
  void mlp_backward(std::int64_t l, LayerActs& a);
  void head_forward(SlotActs& s, const float* residual);
  void head_backward(SlotActs& s, const float* residual, float dloss);
  // The classifier after the final LayerNorm: logits, statistics and losses forward; dlogits,
  // d(lnf) in grads.dln (this shard's part) and dwte backward. fused_*: bf16 logits (gemm_io).
  void fused_classifier_forward(SlotActs& s);
  void classifier_backward(SlotActs& s);
  void fused_classifier_backward(SlotActs& s);
  void zero(Buf<float>& b) { dev_.zero(b.data(), b.bytes()); }
  void copy_in(void* dst, const void* src, std::size_t bytes) { dev_.copy(dst, src, bytes); }
  void flush_ledger();

  StageParams& p_;
  StageProgram program_;
  TensorParallelOps& tp_;
  kernels::KernelOps& k_;
  Device& dev_;
  Dims dims_;
  Activations acts_;
  int ledger_count_ = 0;             // loss sums in the device ledger
  std::vector<double> ledger_host_;  // loss sums read back, in forward order
};

}  // namespace pdtrain
