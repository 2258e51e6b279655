// The performance model: every formula here is written out in docs/performance-model.md, in the
// same order, with where each constant comes from.
#include "pdtrain/plan/model.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "pdtrain/core/error.hpp"
#include "pdtrain/schedule/pipeline_schedule.hpp"

namespace pdtrain::plan {

namespace {

// Bytes the fused AdamW moves per parameter: read value, gradient, two moments; write value
// and two moments (7 x 4 bytes; perf/bench_holder's "bytes_per_element=28").
constexpr double kAdamwBytes = 28;
// Elementwise traffic of one layer's forward (forward_elementwise_bytes): every tensor-parallel
// rank runs LayerNorm 1 and 2 (read x, write y) and the two residual adds (read 2, write 1)
// over all C channels (the residual stream is replicated, as in Megatron); fused (a GPU's
// kernels) LayerNorm 2 makes its input in the same pass as the first residual add (read 2,
// write 2), 7 r + 2 a instead of 8 r + 2 a; GELU over 4C (read, write; in a GEMM's epilogue only
// its input written beside the GEMM's output) runs on the rank's C/tp columns. The softmax's passes over the T x T scores are counted with attention
// (forward_pass). Backward moves twice the forward's.
// Kernels of one layer: forward 12 (2 LayerNorms, 4 GEMMs, 2 attention products, softmax, GELU,
// 2 residuals), backward twice as many.
constexpr double kKernelsPerLayer = 12;
// The CUDA backend's cuBLASLt workspace, allocated once per compute rank
// (src/kernels/cuda/cuda_kernel_ops.cpp, kGemmWorkspaceBytes).
constexpr double kGemmWorkspaceBytes = 32.0 * 1048576;

struct Costs {
  const Machine& m;
  const PlanInput& in;
  double peak() const {
    return in.precision == Precision::bf16 ? m.device.peak_bf16 : m.device.peak_fp32;
  }
  // Share of a device one compute rank has: a CPU node's ranks share its cores and memory.
  double share = 1;
  double gemm(double flops, double calls = 1) const {
    if (flops <= 0) return 0;
    const double per_call = flops / calls;
    return flops / (peak() * share * m.device.gemm_efficiency(per_call));
  }
  double memory(double bytes) const { return bytes / (m.device.memory_bandwidth * share); }
  double elementwise(double bytes) const { return bytes / (m.device.elementwise() * share); }
};

// The link between two ranks of one group: within a node while the group fits on one.
const LinkSpec& link_for(const Machine& m, int span_ranks, int ranks_per_node) {
  return span_ranks <= ranks_per_node ? m.intra : m.inter;
}

// Ring all-reduce of `bytes` over `n` ranks (reduce-scatter + all-gather, what
// core/fixed_order_reduce does): 2 (n-1)/n of the data over each rank's link, 2 (n-1) latencies.
double all_reduce(const LinkSpec& l, double bytes, int n) {
  if (n <= 1 || bytes <= 0) return 0;
  return 2.0 * (n - 1) * l.latency_s + 2.0 * (n - 1) / n * bytes / l.bandwidth;
}
double reduce_scatter(const LinkSpec& l, double bytes, int n) {
  if (n <= 1 || bytes <= 0) return 0;
  return (n - 1) * l.latency_s + static_cast<double>(n - 1) / n * bytes / l.bandwidth;
}
// The additions of a ring all-reduce or reduce-scatter where a host CPU does them (a CPU node;
// a GPU rank's host-staged collectives): each rank adds (n-1)/n of the buffer into its own,
// reading two operands and writing one, at `bandwidth` (the rank's share of the memory). The
// link time above is only the moving.
double host_sum(double bytes, int n, double bandwidth) {
  if (n <= 1 || bytes <= 0) return 0;
  return 3.0 * (n - 1) / n * bytes / bandwidth;
}

// Parameters of one tp rank of a stage: its layers' shard, the embedding's vocabulary rows
// (first and last stage: the tied head), wpe on the first, the final LayerNorm on the last.
double stage_params(const ModelShape& s, const StageSpec& spec) {
  const double C = static_cast<double>(s.d_model), tp = static_cast<double>(spec.tp_size);
  // Split by t: the four weight matrices and the column-parallel biases (qkv 3C, fc 4C);
  // replicated: the two LayerNorms (4C) and the row-parallel biases (attention and MLP
  // projections, 2C).
  const double per_layer = 12.0 * C * C / tp + 7.0 * C / tp + 6.0 * C;
  double n = per_layer * static_cast<double>(spec.layer_end - spec.layer_begin);
  // wte: this rank's vocabulary rows, cut at head boundaries as GptStage::dims_of cuts them.
  const std::int64_t v0 = spec.tp_rank * s.n_head / spec.tp_size * s.padded_vocab / s.n_head;
  const std::int64_t v1 = (spec.tp_rank + 1) * s.n_head / spec.tp_size * s.padded_vocab / s.n_head;
  if (spec.has_embedding || spec.has_head) n += static_cast<double>(v1 - v0) * C;
  if (spec.has_embedding) n += static_cast<double>(s.max_seq_len) * C;
  if (spec.has_head) n += 2.0 * C;
  return n;
}

double layer_params(const ModelShape& s, int tp) {
  const double C = static_cast<double>(s.d_model);
  return 12.0 * C * C / tp + 7.0 * C / tp + 6.0 * C;  // as in stage_params
}

// One micro-batch through a stage, forward and backward: seconds by kind of kernel, its GEMM
// flops and its tensor-parallel traffic.
struct Pass {
  KernelTimes forward, backward;
  double flops = 0, tp_bytes = 0;
  int tp_calls = 0;
  std::string attention_kernels;  // what priced the attention
};

// Which attention kernels a GPU rank runs for heads of `hs` channels (compute.attention as a
// run resolves it, src/kernels/cuda/cudnn_attention.cpp): cuDNN's SDPA takes bf16 runs with
// head sizes that are multiples of 8 up to 128 (cudnn_takes: its backward's documented limit,
// which the emulated cuDNN enforces too); pdtrain's fused kernels take heads up to 64
// (fused_attention_takes); anything else runs the T x T products as GEMMs with the softmax in
// memory.
enum class AttentionKernels { cudnn, fused, unfused };

bool cudnn_takes(const kernels::AttentionShape& a, Precision precision) {
  const int hs = a.NH > 0 && a.C % a.NH == 0 ? a.C / a.NH : 0;
  return precision == Precision::bf16 && hs > 0 && hs % 8 == 0 && hs <= 128;
}

AttentionKernels attention_kernels(const PlanInput& in, const kernels::AttentionShape& a, bool gpu) {
  if (!gpu || in.attention == "unfused") return AttentionKernels::unfused;
  if (in.attention != "pdtrain" && cudnn_takes(a, in.precision)) return AttentionKernels::cudnn;
  return kernels::fused_attention_takes(a) ? AttentionKernels::fused : AttentionKernels::unfused;
}

// A fused, flash-style attention (cuDNN's or pdtrain's) priced at a library's published rates
// on this device, in FlashAttention's count: forward 4·B·heads·T²·hs over the causal half,
// backward 2.5 times that (five T x T products against two) at the causal backward rate. A
// machine file without the library's table leaves only the GEMM rate to price it with: said
// in the label, since a FLOP count alone flatters a kernel that is not a GEMM.
void price_flash(const Costs& c, const char* library, const char* who, double B, double heads, double T,
                 double hs, double layers, Pass& p) {
  const double forward_flops = 4 * B * heads * T * T * hs / 2;
  const AttentionRates* r = c.m.device.attention_rates(library);
  if (!r) {
    p.forward.attention = layers * c.gemm(forward_flops, 1);
    p.backward.attention = 2.5 * p.forward.attention;
    p.attention_kernels = std::string(who) + " at the GEMM rate (the machine file has no " + library +
                          " attention table: a guess)";
    return;
  }
  // The tables are 16-bit tensor-core rates; an fp32 run's kernels (pdtrain's fp32 tiles run on
  // the CUDA cores) reach at most the same share of the fp32 peak.
  const double precision = c.in.precision == Precision::bf16 ? 1.0 : c.m.device.peak_fp32 / c.m.device.peak_bf16;
  const double f = r->head_factor(hs) * c.share * std::min(1.0, precision);
  p.forward.attention = layers * forward_flops / (r->forward_causal_at(T) * f);
  p.backward.attention = layers * 2.5 * forward_flops / (r->backward_causal_at(T) * f);
  const bool counted = std::string(library) == "pdtrain";
  p.attention_kernels = std::string(who) + (counted ? ", at the rates its counted lower bound allows (" : ", at ") +
                        (counted ? "" : std::string(library) + "'s published rates (") + r->source + ")";
}

Pass forward_and_backward(const Costs& c, const StageSpec& spec, double B) {
  const ModelShape& s = c.in.model;
  const double T = static_cast<double>(s.seq_len), C = static_cast<double>(s.d_model);
  const double tp = static_cast<double>(spec.tp_size), N = B * T, Cl = C / tp;
  const double heads = static_cast<double>(s.n_head) / tp, hs = C / static_cast<double>(s.n_head);
  const double layers = static_cast<double>(spec.layer_end - spec.layer_begin);
  const ElementwiseBytes bytes = forward_elementwise_bytes(
      s, spec, B, c.in.activations.value_or(pdtrain_traffic(c.m.device.gpu, c.in.precision)));
  Pass p;
  // The four weight GEMMs of a layer, each by its own size; backward: the input's and the
  // weight's gradient, each a product of the forward's size.
  const double weights[] = {2 * N * C * 3 * Cl, 2 * N * Cl * C, 2 * N * C * 4 * Cl, 2 * N * 4 * Cl * C};
  for (double f : weights) p.forward.gemm += layers * c.gemm(f), p.flops += layers * f;
  p.backward.gemm = 2 * p.forward.gemm;
  // Attention: fused kernels (cuDNN's or pdtrain's) at published rates; otherwise QK^T and
  // att.V as full T x T products (the causal mask applied after, as in pdtrain's reference
  // kernels and Megatron's), per sequence and head (on a GPU the heads of a sequence are one
  // strided-batch GEMM; on a CPU each (sequence, head) is its own), and the softmax over the
  // T x T scores in memory; backward twice that.
  const double att = 2 * 2 * B * heads * T * T * hs;
  const kernels::AttentionShape shape{static_cast<int>(B), static_cast<int>(T), static_cast<int>(Cl),
                                      static_cast<int>(heads), false};
  switch (attention_kernels(c.in, shape, c.m.device.gpu)) {
    case AttentionKernels::cudnn:
      price_flash(c, "cudnn", "cuDNN's fused SDPA", B, heads, T, hs, layers, p);
      break;
    case AttentionKernels::fused: {
      // pdtrain's own kernels: the slower of FlashAttention-2's published rates (they are
      // written its way) and the lower bound counted of them in the emulation.
      price_flash(c, "flash2", "pdtrain's fused kernels, no faster than FlashAttention-2", B, heads, T, hs, layers, p);
      Pass counted;
      price_flash(c, "pdtrain", "pdtrain's fused kernels, no faster than their counted bound", B, heads, T, hs, layers,
                  counted);
      if (c.m.device.attention_rates("pdtrain") && counted.forward.attention + counted.backward.attention >
                                                       p.forward.attention + p.backward.attention) {
        p.forward.attention = counted.forward.attention, p.backward.attention = counted.backward.attention;
        p.attention_kernels = counted.attention_kernels;
      }
      break;
    }
    case AttentionKernels::unfused:
      p.forward.attention = layers * c.gemm(att, c.m.device.gpu ? 2 * B : 2 * B * heads) + c.elementwise(bytes.softmax);
      p.backward.attention = 2 * p.forward.attention;
      p.attention_kernels = "T x T products as GEMMs, the softmax in memory";
      break;
  }
  p.flops += layers * att;
  p.forward.elementwise = c.elementwise(bytes.layers + bytes.embedding) +
                          layers * kKernelsPerLayer * c.m.device.kernel_overhead_s;
  p.backward.elementwise = c.elementwise(bytes.layers_backward + 2 * bytes.embedding) +
                           2 * layers * kKernelsPerLayer * c.m.device.kernel_overhead_s;
  p.tp_calls = 2 * static_cast<int>(layers);  // after attention projection and MLP down
  p.tp_bytes = c.in.message_bytes * N * C;
  if (spec.has_embedding) ++p.tp_calls;  // the vocabulary-parallel lookups are summed
  if (spec.has_head) {
    // The classifier: the tied head's GEMM and the passes over the logits (loss forward,
    // dlogits backward); backward: the GEMM's two gradient products and twice the passes.
    const double V = static_cast<double>(s.padded_vocab) / tp;
    const double head_gemm = c.gemm(2 * N * C * V);
    p.forward.classifier = head_gemm + c.elementwise(bytes.head);
    p.backward.classifier = 2 * head_gemm + 2 * c.elementwise(bytes.head);
    p.flops += 2 * N * C * V;
  }
  return p;
}

// The baseline's step after the reduction on a rank of n parameters (threads: a CPU rank's BLAS
// threads): AdamW over its whole replica (every replica updates all of it), memory bound on a
// GPU, on a CPU the slower of its arithmetic on the rank's threads (the holders' AdamW rate: the
// same element loop) and its 28 bytes per parameter through memory; and two copies of the
// stage's fp32 bytes through the device's memory (read and write): the gradients packed for the
// reduction, the updated parameters published to the stage (ComputeLoop's reduce_and_push and
// publish).
double baseline_optimizer(const Costs& c, double n, int threads) {
  const double adamw_compute = c.m.device.gpu ? 0 : n / (threads * c.m.holder.adamw_params_per_core);
  return std::max(c.memory(kAdamwBytes * n), adamw_compute) + c.memory(2 * 2 * 4 * n);
}

std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

struct Biggest {
  const char* name;
  double bytes;
};

std::string overflow_text(const ComputeMemory& mem, double capacity) {
  const Biggest parts[] = {{"parameters", mem.params}, {"gradients", mem.grads},
                           {"optimizer state", mem.optimizer}, {"activations", mem.activations}};
  const Biggest* big = std::max_element(std::begin(parts), std::end(parts),
                                        [](const Biggest& a, const Biggest& b) { return a.bytes < b.bytes; });
  return "needs " + gib(mem.device_total()) + " (parameters " + gib(mem.params) + ", gradients " +
         gib(mem.grads) + ", optimizer state " + gib(mem.optimizer) + ", activations " +
         gib(mem.activations) + ") but has " + gib(capacity) + "; the largest part is its " +
         big->name;
}

// What a CPU node's cores must run in a step beyond the ranks' own critical path. Its cores run
// every rank's work (`work_core_s`: compute ranks' forward, backward and host sums times their
// threads, holders' updates, pushes and CRCs), and every rank's waits are not free: a waiting
// rank polls MPI and sleeps (core/quiet_wait), and each timer wake-up costs CPU time, a share
// `wait_share` of a core over the wait (node.wait_core_share, --calibrate; 0.08 in the KVM
// guest of perf/RESULTS.md, where one wake-up costs 25-30 us). Measured on 2 cores: a holder
// beside one compute rank takes 21 % of a core for an update of 4 %; 4 compute ranks and a
// holder use 1.8 cores for work the model counts as 1.5 (perf/RESULTS.md, "Revision 5").
// A rank waits for the part of the step it does not work: wall time, not its threads' time.
struct NodeLoad {
  double work_core_s = 0;       // core-seconds of work in a step, all ranks, all nodes
  double work_rank_s = 0;       // seconds the ranks work in a step (each once), summed
  double ranks = 0;             // ranks (compute and holders), all nodes
  double cores = 1;             // cores, all nodes
  double wait_share = 0;        // node.wait_core_share
  double holders_per_node = 0;  // holders the compute ranks wait for (0: none)
  double holder_busy_s = 0;     // one holder's core-seconds of work in a step
  double holder_work_s = 0;     // and the seconds it works
};

// Two bounds, the larger counts. The node: a step of S takes at least the core-seconds of work
// and of waiting (every rank waits for the part of S it does not work) over the cores (a
// work-conserving scheduler's bound). The holders, where compute ranks meet in lockstep and
// fill the cores: a holder's work and waits displace one of them and the others wait for it.
// S is on both sides; each bound grows by less than S does (slope wait_share x ranks / cores,
// wait_share x holders: the share is held below 1 over that), so iterating converges.
double cores_shared(const NodeLoad& n, double pipe, double uncontended) {
  const double slope = std::max(n.ranks / n.cores, n.holders_per_node);
  const double share = slope > 0 ? std::min(n.wait_share, 0.9 / slope) : n.wait_share;
  auto shared = [&](double step) {
    const double waits = share * std::max(0.0, n.ranks * step - n.work_rank_s);
    const double node = (n.work_core_s + waits) / n.cores - pipe;
    const double holders = n.holders_per_node * (n.holder_busy_s + share * std::max(0.0, step - n.holder_work_s));
    return std::max({0.0, node, holders});
  };
  double step = uncontended;
  for (int i = 0; i < 200; ++i) step = uncontended + shared(step);
  return step - uncontended;
}

}  // namespace

ActivationTraffic pdtrain_traffic(bool gpu, Precision precision) {
  if (!gpu) return {};
  const bool bf16 = precision == Precision::bf16;
  // A bf16 layer's backward outside its GEMMs and attention moves 118 bytes per token and
  // channel (perf/RESULTS.md, "Fused classifier and elementwise chain": each kernel's global
  // reads and writes counted), more than twice its forward's 40: the gradients' bf16 copies and
  // the LayerNorm backward's re-reads have no forward counterpart.
  return {.residual = 4, .branch = bf16 ? 2.0 : 4.0, .scores = 4, .gelu_in_gemm = true,
          .fused_residual = true, .bf16_logits = bf16, .backward_per_channel = bf16 ? 118.0 : 0.0};
}

ElementwiseBytes forward_elementwise_bytes(const ModelShape& s, const StageSpec& spec, double B,
                                           const ActivationTraffic& a) {
  const double T = static_cast<double>(s.seq_len), C = static_cast<double>(s.d_model);
  const double tp = static_cast<double>(spec.tp_size), N = B * T, Cl = C / tp;
  const double heads = static_cast<double>(s.n_head) / tp;
  const double layers = static_cast<double>(spec.layer_end - spec.layer_begin);
  ElementwiseBytes e;
  const double layernorms = 2 * (a.residual + a.branch),
               residual_adds = (a.fused_residual ? 5 : 6) * a.residual;
  const double gelu = a.gelu_in_gemm ? 4 * a.branch : 2 * 4 * a.branch;
  e.layers = layers * N * ((layernorms + residual_adds) * C + gelu * Cl);
  e.layers_backward = a.backward_per_channel > 0 ? layers * N * C * a.backward_per_channel : 2 * e.layers;
  // The softmax reads the scores and writes the probabilities and the zeroed upper half.
  e.softmax = layers * 3 * a.scores * B * heads * T * T;
  if (spec.has_embedding) e.embedding = 3 * a.residual * N * C;
  // fp32 logits: write, max, partials; bf16 (fused): write, one pass.
  const double logit_bytes = a.bf16_logits ? 2.0 * 2 : 4.0 * 3;
  if (spec.has_head) e.head = logit_bytes * N * static_cast<double>(s.padded_vocab) / tp;
  return e;
}

ComputeMemory compute_memory(const PlanInput& in, int p, int t, bool gpu, int* slots) {
  const LayoutShape& L = in.layout;
  const StageSpec spec = split_stage(in.model.n_layer, L.pp, p, L.tp, t);
  const bool pd = L.holders > 0;
  const int m = static_cast<int>(in.micro_batches);
  const int in_flight = in.layer_major ? m
                                       : pipeline_in_flight(in.gpipe ? PipelineKind::gpipe : PipelineKind::one_f_one_b,
                                                            L.pp, p, m);
  if (slots) *slots = in_flight;
  ComputeMemory mem;
  // The same allocation plan the stage allocates (GptStage::memory_bytes), with the attention
  // buffers and activation layout of the backend that runs it: a GPU's fused kernels keep B*NH*T
  // floats per layer where the CPU reference keeps the T x T probabilities, and a GPU's bf16 run
  // keeps qkv, the attention output and the MLP's hidden activations in bf16 only.
  const kernels::AttentionFootprint& attention =
      gpu ? kernels::cuda_attention_footprint() : kernels::cpu_attention();
  const kernels::ActivationLayout layout = gpu ? kernels::kGpuActivations : kernels::kCpuActivations;
  mem.activations = static_cast<double>(GptStage::memory_bytes(
      in.model, spec, in.batch_size / (L.dp * in.micro_batches), in.model.seq_len, in_flight, in.recompute,
      in.precision, in.layer_major ? StageOrder::layer : StageOrder::micro_batch, attention,
      layout));
  const double n = stage_params(in.model, spec), bytes = 4 * n;
  const double copies = in.precision == Precision::bf16 ? 1.5 : 1.0;  // bf16 copy beside fp32
  mem.params = copies * bytes;
  if (pd && in.cache_bytes > 0) mem.params = std::min(in.cache_bytes, copies * bytes);
  // PD: GradStreamer's bound (the pool arithmetic the rank itself runs), the one formula.
  if (pd && !in.pd_grad_bytes)
    throw Error(ExitCode::runtime, "plan::compute_memory: a PD layout's gradient bytes are GradStreamer's bound: "
                                   "give PlanInput::pd_grad_bytes (pdtrain::pd_grad_bound)");
  mem.grads = pd ? in.pd_grad_bytes(p) : bytes;
  // The baseline's replica: its packed parameters, two AdamW moments and reduced gradients.
  mem.optimizer = pd ? 0 : 4 * bytes;
  // What lives on the device has a pinned host mirror beside it (Mirrored, the cache's slots):
  // PD's bounded cache and gradient units, the baseline's whole stage and replica.
  mem.staging = gpu ? mem.params + mem.grads + mem.optimizer : 0;
  mem.workspace = gpu ? kGemmWorkspaceBytes : 0;
  return mem;
}

double model_flops(const ModelShape& m, double sequences) {
  const double B = sequences, T = static_cast<double>(m.seq_len), C = static_cast<double>(m.d_model);
  const double L = static_cast<double>(m.n_layer), V = static_cast<double>(m.vocab_size);
  return 6 * B * T * (12 * L * C * C + V * C) + 6 * L * B * T * T * C;
}

PlanInput plan_input(const Deck& deck, const LayoutShape& shape, int nodes) {
  PlanInput in;
  in.model = resolve_model_shape(deck.model);
  in.layout = shape;
  in.batch_size = deck.train.batch_size;
  in.micro_batches = deck.parallel.micro_batches;
  in.gpipe = deck.parallel.schedule == "gpipe";
  in.layer_major = deck.parallel.order == StageOrder::layer;
  in.recompute = deck.train.recompute == "full"        ? Recompute::full
                 : deck.train.recompute == "attention" ? Recompute::attention
                                                       : Recompute::none;
  in.precision = deck.train.precision;
  in.attention = deck.compute.attention;
  in.staleness = deck.pd.staleness;
  in.prefetch_depth = deck.pd.prefetch_depth;
  in.fetch_thread = deck.pd.fetch_thread;
  in.cache_bytes = deck.pd.cache_mb * 1048576.0;
  const bool bf16_fetch = deck.pd.fetch_codec == "bf16" || in.precision == Precision::bf16;
  in.fetch_bytes_per_param = bf16_fetch ? 2 : 4;
  in.shared_memory_fetch = deck.pd.fetch_path == "auto" && (bf16_fetch || deck.pd.fetch_codec == "raw");
  in.push_bytes_per_param = deck.pd.push_codec == "bf16" ? 2 : 4;
  in.nodes = std::max(1, nodes);
  return in;
}

Prediction predict(const PlanInput& in, const Machine& machine) {
  const LayoutShape& L = in.layout;
  const ModelShape& s = in.model;
  Prediction out;
  const int compute = L.compute();
  out.compute_ranks_per_node = (compute + in.nodes - 1) / in.nodes;
  out.holders_per_node = L.holders > 0 ? (L.holders + in.nodes - 1) / in.nodes : 0;
  Costs c{machine, in};
  // A GPU rank has its device. On a CPU node every rank runs max(1, cores / ranks on the node)
  // BLAS threads, holders counted (the app's choose_blas_threads; scripts/mpirun-local: 1),
  // each on a core of its own while the node has enough: a compute rank has its threads' share
  // of the node's GEMM rate and memory bandwidth. Ranks beyond the cores share them: see
  // `cores_shared` below.
  const int cores = machine.node.cpu_cores;
  const int threads = std::max(1, cores / std::max(1, out.compute_ranks_per_node + out.holders_per_node));
  if (!machine.device.gpu) c.share = std::min(1.0, static_cast<double>(threads) / cores);
  // Where a host CPU sums the collectives' data, and at what rate: a CPU rank's share of the
  // node, a host-staged GPU rank's share of its node's memory.
  const bool tp_host_sums = !machine.device.gpu || in.tp_host_staged;
  const bool dp_host_sums = !machine.device.gpu || in.host_staged;
  const double sum_bandwidth = machine.device.gpu
                                   ? machine.node.cpu_memory_bandwidth / std::max(1, out.compute_ranks_per_node)
                                   : machine.device.memory_bandwidth * c.share;
  const int per_node = machine.device.gpu ? machine.node.devices : out.compute_ranks_per_node;
  const LinkSpec& tp_link = link_for(machine, L.tp, per_node);
  const LinkSpec& pp_link = link_for(machine, L.tp * L.pp, per_node);
  const LinkSpec& dp_link = link_for(machine, compute, per_node);
  const double B = static_cast<double>(in.batch_size) /
                   static_cast<double>(L.dp * in.micro_batches);  // micro-batch size
  const double m = static_cast<double>(in.micro_batches);
  const double T = static_cast<double>(s.seq_len), C = static_cast<double>(s.d_model);
  const bool pd = L.holders > 0;
  const double copies = in.precision == Precision::bf16 ? 1.5 : 1.0;  // bf16 copy beside fp32

  double slowest = 0, sum_stages = 0, stage_params_max = 0, backward_max = 0;
  double busy_core_s = 0;  // a CPU node: core-seconds its compute ranks work in a step
  double busy_rank_s = 0;  // and the seconds they work (each rank once)
  double holder_busy_s = 0, holder_work_s = 0;  // one holder's core-seconds and seconds (PD)
  for (int p = 0; p < L.pp; ++p) {
    const StageSpec spec = split_stage(s.n_layer, L.pp, p, L.tp, 0);
    StagePrediction st;
    st.pp = p;
    st.layers = spec.layer_end - spec.layer_begin;
    st.param_count = stage_params(s, spec);
    const Pass f = forward_and_backward(c, spec, B);
    const double fwd = f.forward.total();
    // Backward: its own kernels (forward_and_backward); recomputation adds a forward (full) or
    // attention's forward (attention).
    double bwd = f.backward.total(), flops = 3 * f.flops;
    int tp_calls = 2 * f.tp_calls;
    if (in.recompute == Recompute::full) bwd += fwd, flops += f.flops, tp_calls += f.tp_calls;
    if (in.recompute == Recompute::attention) bwd += f.forward.attention;
    st.forward_kernels = f.forward;
    st.backward_kernels = f.backward;
    if (in.recompute == Recompute::full) st.backward_kernels += f.forward;
    if (in.recompute == Recompute::attention) st.backward_kernels.attention += f.forward.attention;
    st.attention_kernels = f.attention_kernels;
    st.gemm_flops = flops;
    // pdtrain moves tensor-parallel and pipeline traffic through pinned host memory on a GPU
    // (device/host_staging): each message is downloaded and uploaded once more.
    const bool staged = machine.device.gpu && in.host_staged;
    const double stage_copy = machine.device.gpu && in.tp_host_staged ? 2 * machine.host.time(f.tp_bytes) : 0;
    const double tp_sum = tp_host_sums ? host_sum(f.tp_bytes, L.tp, sum_bandwidth) : 0;
    const double tp_one = L.tp > 1 ? all_reduce(tp_link, f.tp_bytes, L.tp) + tp_sum + stage_copy : 0;
    st.tp_comm = (f.tp_calls + tp_calls) * tp_one;
    const double msg = in.message_bytes * B * T * C;
    st.p2p = L.pp > 1 ? pp_link.time(msg) + (staged ? 2 * machine.host.time(msg) : 0) : 0;
    const int neighbours = (p > 0) + (p < L.pp - 1);
    st.forward = fwd + f.tp_calls * tp_one + (p < L.pp - 1 ? st.p2p : 0);
    st.backward = bwd + tp_calls * tp_one + (p > 0 ? st.p2p : 0);
    st.p2p *= neighbours;
    st.memory = compute_memory(in, p, 0, machine.device.gpu, &st.activation_slots);
    const double per_micro = st.forward + st.backward;
    slowest = std::max(slowest, per_micro);
    sum_stages += per_micro;
    stage_params_max = std::max(stage_params_max, st.param_count);
    backward_max = std::max(backward_max, st.backward);
    // Every tp rank and replica of the stage computes and sums, on its threads.
    const double stage_work_s = L.dp * L.tp * m * (fwd + bwd + (f.tp_calls + tp_calls) * tp_sum);
    busy_rank_s += stage_work_s;
    busy_core_s += stage_work_s * threads;
    out.step.tp_comm = std::max(out.step.tp_comm, m * st.tp_comm);
    out.step.p2p = std::max(out.step.p2p, m * st.p2p);
    out.stages.push_back(st);
  }
  // Pipeline: every micro-batch through the slowest stage, plus filling and draining through
  // the others (1F1B and GPipe take the same time with non-blocking sends).
  const double pipe = (m - 1) * slowest + sum_stages;
  out.step.compute = m * slowest;
  out.step.bubble = pipe - out.step.compute;

  // Data-parallel reduction of a stage's fp32 gradients: PD reduce-scatters unit by unit inside
  // backward (blocking) and pushes its segment; the baseline reduce-scatters and all-gathers.
  const double grad_bytes = 4 * stage_params_max;
  const double units = static_cast<double>(s.n_layer / L.pp + 3);
  const double download = machine.device.gpu && in.host_staged ? machine.host.time(grad_bytes) : 0;
  out.step.dp_reduce = (pd ? reduce_scatter(dp_link, grad_bytes, L.dp) : all_reduce(dp_link, grad_bytes, L.dp)) +
                       (dp_host_sums ? host_sum(grad_bytes, L.dp, sum_bandwidth) : 0) + (L.dp > 1 ? download : 0);

  double wait = 0;
  if (pd) {
    HolderPrediction& h = out.holder;
    const double total = static_cast<double>(s.padded_vocab) * C + static_cast<double>(s.max_seq_len) * C +
                         s.n_layer * layer_params(s, 1) + 2 * C;
    h.param_count = total / L.holders;
    // A holder's cores: a GPU node's CPU cores split among its holders; on a CPU node the
    // cores the compute ranks leave, at least one.
    const int cores_of_holder = machine.device.gpu
                                    ? machine.node.cpu_cores / std::max(1, out.holders_per_node)
                                    : std::max(1, (machine.node.cpu_cores - out.compute_ranks_per_node) /
                                                      std::max(1, out.holders_per_node));
    h.cores = cores_of_holder;
    const double per_param = 1.0 / (cores_of_holder * machine.holder.adamw_params_per_core) +
                             in.fetch_bytes_per_param / (cores_of_holder * machine.holder.crc_bytes_per_core);
    const double bw_bound = kAdamwBytes * out.holders_per_node / machine.node.cpu_memory_bandwidth;
    h.update = h.param_count * std::max(per_param, bw_bound);
    // Served copies: the last staleness + 1 versions, encoded (raw at staleness 0 is served from
    // the parameters themselves, unless published into a shared segment).
    const double versions = in.staleness > 0 || in.fetch_bytes_per_param != 4 || in.shared_memory_fetch
                                ? static_cast<double>(in.staleness + 1) : 0;
    h.memory = h.param_count * (16 + versions * in.fetch_bytes_per_param);

    // Fetch: replica 0 of each position asks for its stage once per step if the cache holds
    // it, else once per use (forward and backward of every micro-batch; twice in layer order).
    const double stage_fetch = stage_params_max * in.fetch_bytes_per_param;
    const bool whole = in.cache_bytes <= 0 || in.cache_bytes >= copies * 4 * stage_params_max;
    const double passes = whole ? 1 : (in.layer_major ? 2 : 2 * m);
    const double fetched = passes * stage_fetch;
    // From holders on the fetcher's node where there are enough holders, else across nodes.
    const double local = std::min(1.0, static_cast<double>(L.holders) / in.nodes);
    // A holder on the fetcher's node reaches it through shared memory (on a GPU node: into the
    // pinned staging, at the node's memory bandwidth shared by its compute ranks, then over
    // PCIe), not over the GPUs' NVLink.
    const LinkSpec near = machine.device.gpu
                              ? LinkSpec{machine.intra.latency_s,
                                         machine.node.cpu_memory_bandwidth / std::max(1, out.compute_ranks_per_node)}
                              : machine.intra;
    double fetch = local * fetched / near.bandwidth + (1 - local) * fetched / machine.inter.bandwidth +
                   units * passes * (local * near.latency_s + (1 - local) * machine.inter.latency_s);
    if (machine.device.gpu) fetch += fetched / machine.host.bandwidth;  // upload to the device
    if (L.dp > 1) fetch += 2 * fetched / dp_link.bandwidth;  // relayed down the replica tree
    // A holder sends each block once per fetching position and pass and takes every push.
    const double served = passes * total * in.fetch_bytes_per_param / L.holders;
    const double pushed = total * in.push_bytes_per_param / L.holders;
    const double nic = machine.device.gpu
                           ? machine.inter.bandwidth * machine.node.devices / std::max(1, out.holders_per_node)
                           : machine.intra.bandwidth;
    // Served from a shared segment (pd.fetch_path = auto), the on-node share costs the holder
    // nothing: the fetching rank copies and checks it.
    const double served_by_holder = in.shared_memory_fetch ? (1 - local) * served : served;
    h.serve = (served_by_holder + pushed) / nic +
              (served_by_holder + pushed) / (cores_of_holder * machine.holder.crc_bytes_per_core);
    out.step.fetch = std::max(fetch, h.serve);
    // Push: each replica pushes its reduced segment as units become final, one on the wire.
    const double push_bytes = stage_params_max * in.push_bytes_per_param / L.dp;
    out.step.push = push_bytes / (local * near.bandwidth + (1 - local) * machine.inter.bandwidth) +
                    units * machine.inter.latency_s;
    out.step.update = h.update;
    // Overlap. Prefetch runs fetches during compute; what it cannot hide is the first unit and
    // whatever the fetch takes beyond the pipeline's time. Pushes hide behind backward but the
    // last unit's. At staleness 0 a step's forward follows the holders' update front (blocks
    // are published in block order), so it waits for the update beyond the forward's time;
    // with staleness >= 1 the version it needs is older and only an update slower than the
    // whole step shows.
    //
    // On a CPU node a fetch is received by the compute rank's own core: shared-memory MPI moves
    // a message by one copy the receiving rank makes inside its MPI calls (Open MPI's CMA), and
    // the rank then checks every byte's CRC. Without pd.fetch_thread that work cannot hide
    // behind the rank's compute, and it starts only once the holders have published the blocks:
    // it adds to the wait for the update instead of overlapping it (traced: the first layer's
    // wait is the update front, then the copy of the stage).
    //
    // From a holder's shared segment (pd.fetch_path = auto) the rank's copy takes the CRC in the
    // same pass: the check adds nothing to what came from holders on its node.
    const bool receiver_copies = !machine.device.gpu && !in.fetch_thread;
    const double hide = in.prefetch_depth > 0 && !receiver_copies ? pipe : 0;
    const double checked_apart = in.shared_memory_fetch ? 1 - local : 1;
    if (receiver_copies) out.step.fetch += checked_apart * fetched / machine.holder.crc_bytes_per_core;
    out.step.fetch_exposed = receiver_copies
                                 ? out.step.fetch
                                 : std::max(0.0, out.step.fetch - hide) + out.step.fetch / (units * passes);
    out.step.push_exposed = std::max(0.0, out.step.push - m * backward_max) + out.step.push / units;
    const double forward_time = pipe - m * backward_max;
    out.step.update_exposed = in.staleness == 0
                                  ? std::max(0.0, h.update - forward_time) + h.update / units
                                  : std::max(0.0, h.update - pipe);
    // The wait for parameters is one wait: for the fetch or the update front, whichever is later.
    wait = (receiver_copies ? out.step.fetch_exposed + out.step.update_exposed
                            : std::max(out.step.fetch_exposed, out.step.update_exposed)) +
           out.step.push_exposed;
    // A holder's core-seconds: its update, and the pushes it takes (shared-memory MPI: the
    // receiver copies them) and checks with the replies it serves.
    const double receive_and_check = pushed / machine.intra.bandwidth +
                                     (served_by_holder + pushed) / machine.holder.crc_bytes_per_core;
    holder_busy_s = h.update * cores_of_holder + receive_and_check;
    holder_work_s = h.update + receive_and_check;
    busy_core_s += L.holders * holder_busy_s;
    busy_rank_s += L.holders * holder_work_s;
  } else {
    out.step.update = baseline_optimizer(c, stage_params_max, threads);
    out.step.update_exposed = out.step.update;
    wait = out.step.update;
    busy_rank_s += compute * out.step.update;  // work, not a wait (the step counts it as `wait`)
  }
  // A CPU node's cores run every rank's work, and the wake-ups of every rank's waits: see
  // NodeLoad. What the pipeline does not already take is the cost.
  const double uncontended = pipe + out.step.dp_reduce + wait;
  if (!machine.device.gpu) {
    NodeLoad load;
    load.work_core_s = busy_core_s;
    load.work_rank_s = busy_rank_s;
    load.ranks = compute + L.holders;
    load.cores = static_cast<double>(in.nodes) * cores;
    load.wait_share = machine.node.wait_core_share;
    // Where the compute ranks alone fill the node's cores, a holder's work is not shared out
    // either: the compute ranks meet every unit (the data-parallel reduce), every layer (tensor
    // parallelism) or every micro-batch (the pipeline), so whichever rank the holder displaces,
    // the others wait for it at the next meeting, and the step takes the holder's whole time.
    if (L.holders > 0 && out.compute_ranks_per_node * threads >= cores && compute > 1) {
      load.holders_per_node = std::max(1, out.holders_per_node);
      load.holder_busy_s = holder_busy_s;
      load.holder_work_s = holder_work_s;
    }
    out.step.cores_shared = cores_shared(load, pipe, uncontended);
  }
  out.step.total = uncontended + out.step.cores_shared;

  out.tokens_per_step = static_cast<double>(in.batch_size) * T;
  out.tokens_per_s = out.tokens_per_step / out.step.total;
  out.model_flops_per_step = model_flops(s, static_cast<double>(in.batch_size));
  const double devices = machine.device.gpu ? compute : in.nodes;  // a CPU node is one device
  out.mfu = out.model_flops_per_step / (out.step.total * c.peak() * devices);

  // What fits: each stage's rank on its device; on a CPU node, all its ranks in its memory.
  const double device_memory = machine.device.gpu ? machine.device.memory_bytes
                                                  : machine.node.cpu_memory_bytes;
  double node_need = 0;
  for (const StagePrediction& st : out.stages) {
    const double need = st.memory.device_total();
    const int rank = L.compute_rank(0, st.pp, 0);
    if (machine.device.gpu && need > device_memory)
      out.overflows.push_back({"compute rank " + std::to_string(rank) + " (stage " + std::to_string(st.pp) +
                                   ", tp 0, and its tp peers)",
                               "device memory: " + overflow_text(st.memory, device_memory)});
    node_need = std::max(node_need, need);
  }
  const double host_need = (machine.device.gpu ? out.stages.front().memory.staging : node_need) *
                               out.compute_ranks_per_node +
                           out.holder.memory * out.holders_per_node;
  if (host_need > machine.node.cpu_memory_bytes)
    out.overflows.push_back({pd ? "holder 0 and the ranks of its node" : "node 0",
                             "node memory: needs " + gib(host_need) + " (" + std::to_string(out.holders_per_node) +
                                 " holder(s) of " + gib(out.holder.memory) + ", " +
                                 std::to_string(out.compute_ranks_per_node) + " compute rank(s)) but has " +
                                 gib(machine.node.cpu_memory_bytes)});
  return out;
}

}  // namespace pdtrain::plan
