#pragma once
// The performance model of `pdtrain plan` (docs/performance-model.md): for a model, a layout
// and a machine, the memory every compute rank and holder needs and the time one training step
// takes, broken into its parts. Pure arithmetic: no MPI, no allocation of the model.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pdtrain/deck/deck.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/plan/machine.hpp"

namespace pdtrain::plan {

// Bytes per element of the activations the elementwise kernels read and write.
struct ActivationTraffic {
  double residual = 4;  // the residual stream: LayerNorm inputs, the residual adds, embedding
  double branch = 4;    // LayerNorm outputs, GELU's input and output
  double scores = 4;    // the reference attention's T x T scores and probabilities
  bool gelu_in_gemm = false;  // GELU in the GEMM's epilogue: only its input written besides
  // The projections' bias and residual add fused, the first with LayerNorm 2 (a GPU's kernels)
  bool fused_residual = false;
  bool bf16_logits = false;  // the fused classifier on bf16 logits (a GPU's bf16 runs)
  // Bytes per token and channel a layer's backward elementwise kernels move (LayerNorm and
  // residual gradients, bias-gradient column sums, the bf16 copies of gradients), counted from
  // the kernels' reads and writes; 0: twice the forward's (what --calibrate assumes on a CPU).
  double backward_per_channel = 0;
};

// What the model needs to know of a run: the deck's settings as numbers.
struct PlanInput {
  ModelShape model{};
  LayoutShape layout{};
  std::int64_t batch_size = 1;     // sequences per step, global
  std::int64_t micro_batches = 1;  // per replica and step
  bool gpipe = false;
  bool layer_major = false;
  Recompute recompute = Recompute::none;
  Precision precision = Precision::fp32;
  std::int64_t staleness = 0;
  std::int64_t prefetch_depth = 64;
  bool fetch_thread = false;  // pd.fetch_thread: a thread of its own receives the fetches
  // pd.fetch_path = auto with a fixed-width codec: holders publish into shared segments and a
  // compute rank on their node copies and checks a block in one pass.
  bool shared_memory_fetch = true;
  double cache_bytes = 0;  // PD parameter cache per compute rank; 0: the whole stage
  double fetch_bytes_per_param = 4, push_bytes_per_param = 4;  // wire codecs (raw 4, bf16 2)
  // What the elementwise kernels move per activation element; unset: pdtrain's own on the
  // machine's device (pdtrain_traffic); set to model another implementation (Megatron: 16-bit
  // activations throughout).
  std::optional<ActivationTraffic> activations;
  // Which attention kernels a GPU rank runs (compute.attention): "auto" (cuDNN's fused SDPA
  // where it takes the shape, else pdtrain's fused kernels where they do), "cudnn", "pdtrain",
  // or "unfused" (the T x T products as GEMMs, the softmax in memory: Megatron-LM's of 2021).
  std::string attention = "auto";
  // Bytes of one element of the tensor-parallel all-reduces and pipeline messages (pdtrain: 4).
  double message_bytes = 4;
  // pdtrain moves a GPU rank's pipeline messages and data-parallel gradients through pinned
  // host memory (device/host_staging); false models GPU-direct transfers (NCCL: Megatron,
  // `pdtrain plan --nccl`).
  bool host_staged = true;
  // The tensor-parallel all-reduces alike, as parallel.comm resolves: mpi stages them through
  // host memory, nccl (and auto, where every compute rank has a GPU of its own) runs them GPU to
  // GPU (pipeline messages and the data-parallel reduce stay on MPI either way: host_staged).
  bool tp_host_staged = true;
  int nodes = 1;  // nodes the job spans
  // A PD stage's gradient bytes: GradStreamer's replay of a step, what the run holds (the app's
  // pd_grad_bound; plan/ cannot compute it). Required for a PD layout: compute_memory throws
  // Error(runtime) without it.
  std::function<double(int pp)> pd_grad_bytes;
};

// The bytes the model counts for a stage's elementwise kernels in the forward of one
// micro-batch of B sequences (backward: twice these): the layers' LayerNorms, residual adds and
// GELU, attention's softmax, the embedding lookup (first stage) and the logits' passes
// (last stage). --calibrate divides them by what the kernels take to measure
// `device.elementwise_gbs`, so the two must count the same.
struct ElementwiseBytes {
  double layers = 0, softmax = 0, embedding = 0, head = 0;
  double total() const { return layers + softmax + embedding + head; }
  double layers_backward = 0;  // the layers' backward (not in total(): forward only)
};
ElementwiseBytes forward_elementwise_bytes(const ModelShape& s, const StageSpec& spec, double B,
                                           const ActivationTraffic& a);
// pdtrain's activations (kernel_ops.hpp's ActivationLayout): fp32 everywhere on a CPU's
// elementwise kernels; on a GPU the GELU in the GEMM's epilogue, the residual adds fused, and
// in bf16 runs the LayerNorm outputs, the GELU's activations and the logits in bf16 (the
// residual stream stays fp32).
ActivationTraffic pdtrain_traffic(bool gpu, Precision precision);

// The deck's run on `nodes` nodes with layout `shape` (resolved: dp known).
PlanInput plan_input(const Deck& deck, const LayoutShape& shape, int nodes);

// Bytes one compute rank holds on its device (a CPU rank: in the node's memory).
struct ComputeMemory {
  double params = 0, grads = 0, optimizer = 0, activations = 0;
  double workspace = 0;  // a GPU rank's GEMM workspace (cuBLASLt's), whatever the model
  // Pinned host memory of a GPU rank: the host mirrors of its parameters (PD: the cache's
  // slots), gradients and (baseline) replica; not device memory.
  double staging = 0;
  double device_total() const { return params + grads + optimizer + activations + workspace; }
};

// Seconds of one micro-batch's kernels through a stage, by kind (pdtrain plan prints them).
struct KernelTimes {
  double gemm = 0;         // the layers' weight GEMMs
  double attention = 0;    // attention (fused kernels, or products and softmax)
  double classifier = 0;   // the head's GEMM and the passes over the logits (last stage)
  double elementwise = 0;  // LayerNorms, residuals, GELU, embedding, launches
  double total() const { return gemm + attention + classifier + elementwise; }
  KernelTimes& operator+=(const KernelTimes& o) {
    gemm += o.gemm, attention += o.attention, classifier += o.classifier, elementwise += o.elementwise;
    return *this;
  }
};

struct StagePrediction {
  int pp = 0;               // pipeline stage (its tensor rank 0 stands for the others)
  std::int64_t layers = 0;  // transformer layers of the stage
  double param_count = 0;   // parameters of one of its ranks (its tp shard)
  ComputeMemory memory;
  int activation_slots = 1;
  // Seconds per micro-batch: forward and backward (recomputation included), and of them the
  // tensor-parallel all-reduces and the point-to-point messages to the neighbouring stages.
  double forward = 0, backward = 0, tp_comm = 0, p2p = 0;
  double gemm_flops = 0;  // per micro-batch, forward + backward (+ recomputation)
  // The compute of forward and backward (recomputation included) by kind of kernel, and what
  // priced the attention.
  KernelTimes forward_kernels, backward_kernels;
  std::string attention_kernels;
};

struct HolderPrediction {
  double param_count = 0;  // parameters one holder owns
  double memory = 0;       // its bytes: value, gradient, AdamW moments, served copies
  double update = 0;       // seconds of one update (AdamW + encode + CRC) on its cores
  double serve = 0;        // seconds to send a step's fetch replies and take its pushes
  int cores = 1;
};

// One step's time; `total` is what a step takes, the parts say where it goes (the exposed
// parts are what overlap leaves on the critical path).
struct StepTime {
  double compute = 0;        // forward + backward of the slowest stage, all micro-batches
  double tp_comm = 0;        // tensor-parallel all-reduces inside that
  double p2p = 0;            // pipeline messages inside that
  double bubble = 0;         // pipeline fill and drain
  double cores_shared = 0;   // a CPU node: busier (work and waits) than its cores, what its ranks wait for a core
  double dp_reduce = 0;      // data-parallel gradient reduction (blocking)
  double fetch = 0, fetch_exposed = 0;  // PD: parameter fetch, and what compute does not hide
  double push = 0, push_exposed = 0;    // PD: gradient push
  double update = 0, update_exposed = 0;  // holder update (PD) or the device optimizer (baseline)
  double total = 0;
};

struct Overflow {
  std::string who;   // "compute rank 3 (stage 1, tp 0)" / "holder 0" / "node 0"
  std::string what;  // what overflows, with figures
};

struct Prediction {
  std::vector<StagePrediction> stages;
  HolderPrediction holder;  // when layout.holders > 0
  StepTime step;
  double tokens_per_step = 0, tokens_per_s = 0;
  double model_flops_per_step = 0;  // 6 x tokens x weights + attention (no recomputation)
  double mfu = 0;                   // model flops / (step time x peak of all compute devices)
  int compute_ranks_per_node = 1, holders_per_node = 0;
  std::vector<Overflow> overflows;  // empty: the layout fits
  bool fits() const { return overflows.empty(); }
};

Prediction predict(const PlanInput& in, const Machine& machine);

// What stage p's tensor rank t holds (predict() reports rank 0's, the dry run prints every
// rank's); `slots`, if given, receives the activation sets it keeps (micro-batches in flight).
ComputeMemory compute_memory(const PlanInput& in, int p, int t, bool gpu, int* slots = nullptr);

// The model's FLOPs of one step (what MFU divides by): every weight matrix once forward and
// twice backward, the tied head with the real vocabulary, attention over the causal half.
double model_flops(const ModelShape& m, double sequences);

}  // namespace pdtrain::plan
