// `pdtrain plan`: reads the machine, resolves the layout as training would, prints the model's
// prediction (or the ranked layouts of --search).
#include "pdtrain/plan/command.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/plan/machine.hpp"
#include "pdtrain/plan/model.hpp"

namespace pdtrain::plan {

namespace {

constexpr const char* kDefaultMachine = "cpu-local";

// A path, or a name of a shipped file ("h100-sxm" -> machines/h100-sxm.toml).
std::string machine_path(const std::string& given) {
  const std::string name = given.empty() ? kDefaultMachine : given;
  if (name.find('/') != std::string::npos || (name.size() > 5 && name.substr(name.size() - 5) == ".toml"))
    return name;
  return std::string(PDTRAIN_MACHINES_DIR) + "/" + name + ".toml";
}

std::string gib(double b) {
  char buf[32];
  if (b < 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  if (s < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1)
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

// The nodes a job of `world` ranks spans: a GPU per compute rank, or as given.
int nodes_for(const PlanOptions& o, const Machine& m, const LayoutShape& shape) {
  if (o.nodes > 0) return o.nodes;
  if (!m.device.gpu) return 1;
  return (shape.compute() + m.node.devices - 1) / m.node.devices;
}

// The job's rank count: --ranks, or --nodes' devices plus the holders, or the deck's own
// layout when it fixes dp.
int world_for(const Deck& deck, const PlanOptions& o, const Machine& m) {
  if (o.ranks > 0) return o.ranks;
  if (o.nodes > 0 && m.device.gpu) return static_cast<int>(deck.parallel.holders) + o.nodes * m.node.devices;
  if (deck.parallel.dp > 0)
    return static_cast<int>(deck.parallel.holders + deck.parallel.dp * deck.parallel.tp * deck.parallel.pp);
  throw Error(ExitCode::deck,
              "pdtrain plan: parallel.dp = 0 takes every rank of the job; give --ranks N or --nodes N");
}

// Whether the compute ranks' collectives go GPU to GPU (NCCL) rather than through pinned host
// memory: --nccl, else parallel.comm as a run resolves it (nccl, or auto where every compute
// rank has a GPU of its own, which a GPU machine file's ranks have). A CPU machine has no GPU
// for NCCL: training refuses nccl there, and so does the plan.
bool collectives_on_gpus(const Deck& deck, const PlanOptions& o, const Machine& m) {
  if (!m.device.gpu) {
    if (o.nccl)
      throw Error(ExitCode::deck, "pdtrain plan --nccl: " + m.name + " has no GPUs (device.kind = \"cpu\")");
    if (deck.parallel.comm == "nccl")
      throw Error(ExitCode::deck, deck.where("parallel.comm") + ": nccl, but " + m.name +
                                      " has no GPUs (device.kind = \"cpu\"): NCCL moves GPU memory");
    return false;
  }
  return o.nccl || deck.parallel.comm != "mpi";
}

PlanInput input_for(const Deck& deck, const PlanOptions& o, const Machine& m, const LayoutShape& shape) {
  PlanInput in = plan_input(deck, shape, nodes_for(o, m, shape));
  // A run's NCCL carries every group (tp, dp and pp: app/compute_comms.cpp), MPI none.
  in.tp_host_staged = in.host_staged = !collectives_on_gpus(deck, o, m);
  if (shape.holders > 0) {
    PDT_CHECK(static_cast<bool>(o.pd_grad_bytes), "pdtrain plan: PlanOptions::pd_grad_bytes is not connected");
    in.pd_grad_bytes = o.pd_grad_bytes(deck, shape);
  }
  return in;
}

// The node of each job rank as mpirun places `world` ranks on `nodes` nodes by slot: equal
// slots per node, consecutive ranks together.
std::vector<int> job_nodes(int world, int nodes) {
  const int per_node = (world + nodes - 1) / nodes;
  std::vector<int> node;
  for (int r = 0; r < world; ++r) node.push_back(r / per_node);
  return node;
}

// What training's set-up checks of the layout (app's check_layout, through the options).
void check_as_training(const Deck& deck, const PlanOptions& o, const Machine& m, const LayoutShape& shape) {
  PDT_CHECK(static_cast<bool>(o.check_layout), "pdtrain plan: PlanOptions::check_layout is not connected");
  o.check_layout(deck, shape, job_nodes(shape.world(), nodes_for(o, m, shape)));
}

// One micro-batch's compute through a stage by kind of kernel (the issue a user reads first:
// where a step's time goes on the device).
void print_kernel_times(const char* direction, const KernelTimes& k) {
  std::printf("    %s: GEMMs %s, attention %s, classifier %s, elementwise %s\n", direction,
              seconds(k.gemm).c_str(), seconds(k.attention).c_str(), seconds(k.classifier).c_str(),
              seconds(k.elementwise).c_str());
}

void print_prediction(const Deck& deck, const Machine& m, const PlanInput& in, const Prediction& p) {
  const LayoutShape& L = in.layout;
  std::printf("pdtrain plan: %s on %s, %d node(s): %d holder(s) + dp %d x pp %d x tp %d compute ranks "
              "(%d per node)\n",
              deck.source_name.c_str(), m.name.c_str(), in.nodes, L.holders, L.dp, L.pp, L.tp,
              p.compute_ranks_per_node);
  if (m.device.gpu)
    std::printf("collectives: tensor-parallel all-reduces, pipeline messages and the data-parallel "
                "reduce %s (parallel.comm = %s)\n",
                in.host_staged ? "through pinned host memory (MPI)" : "GPU to GPU (NCCL)",
                deck.parallel.comm.c_str());
  std::printf("step of %.0f tokens: %lld micro-batch(es) of %lld sequence(s) per replica, %s precision, "
              "recompute %s%s\n",
              p.tokens_per_step, static_cast<long long>(in.micro_batches),
              static_cast<long long>(in.batch_size / (L.dp * in.micro_batches)),
              in.precision == Precision::bf16 ? "bf16" : "fp32", deck.train.recompute.c_str(),
              L.holders > 0 ? (", staleness " + std::to_string(in.staleness)).c_str() : ", replicated baseline");
  const char* where = m.device.gpu ? "device" : "node memory";
  std::printf("per micro-batch, each stage: forward / backward (in them: tensor-parallel all-reduces, pipeline messages)\n");
  for (const StagePrediction& s : p.stages) {
    std::printf("  stage %d: %s / %s (tp %s, p2p %s)\n", s.pp, seconds(s.forward).c_str(),
                seconds(s.backward).c_str(), seconds(s.tp_comm).c_str(), seconds(s.p2p).c_str());
    print_kernel_times("forward ", s.forward_kernels);
    print_kernel_times("backward", s.backward_kernels);
  }
  if (!p.stages.empty()) std::printf("  attention: %s\n", p.stages.front().attention_kernels.c_str());
  std::printf("memory per compute rank (%s):\n", where);
  for (const StagePrediction& s : p.stages)
    std::printf("  stage %d (rank %d, %lld layer(s), %.4g parameters): params %s, grads %s, optimizer %s, "
                "activations %s (%d slot(s)) = %s of %s%s\n",
                s.pp, L.compute_rank(0, s.pp, 0), static_cast<long long>(s.layers), s.param_count,
                gib(s.memory.params).c_str(), gib(s.memory.grads).c_str(), gib(s.memory.optimizer).c_str(),
                gib(s.memory.activations).c_str(), s.activation_slots, gib(s.memory.device_total()).c_str(),
                gib(m.device.gpu ? m.device.memory_bytes : m.node.cpu_memory_bytes).c_str(),
                s.memory.staging > 0 ? ("; pinned host staging " + gib(s.memory.staging)).c_str() : "");
  if (L.holders > 0)
    std::printf("memory per holder: %.4g parameters, %s (value, gradient, AdamW moments, served copies); "
                "%d holder(s) per node, %d core(s) each\n",
                p.holder.param_count, gib(p.holder.memory).c_str(), p.holders_per_node, p.holder.cores);
  const StepTime& t = p.step;
  std::printf("step time %s:\n", seconds(t.total).c_str());
  std::printf("  compute            %s (slowest stage, every micro-batch; of it tensor-parallel all-reduces %s, "
              "pipeline messages %s)\n",
              seconds(t.compute).c_str(), seconds(t.tp_comm).c_str(), seconds(t.p2p).c_str());
  std::printf("  pipeline bubble    %s\n", seconds(t.bubble).c_str());
  if (!m.device.gpu)
    std::printf("  cores shared       %s (the node's ranks working, and waking from their waits, for longer "
                "than its cores have, or holders displacing compute ranks that wait for each other)\n",
                seconds(t.cores_shared).c_str());
  std::printf("  data-parallel      %s\n", seconds(t.dp_reduce).c_str());
  if (L.holders > 0) {
    std::printf("  fetch              %s, exposed %s\n", seconds(t.fetch).c_str(), seconds(t.fetch_exposed).c_str());
    std::printf("  push               %s, exposed %s\n", seconds(t.push).c_str(), seconds(t.push_exposed).c_str());
    const bool receiver_copies = !m.device.gpu && !in.fetch_thread;  // as model.cpp decides
    std::printf("  holder update      %s, exposed %s (the wait for parameters is %s)\n",
                seconds(t.update).c_str(), seconds(t.update_exposed).c_str(),
                receiver_copies ? "the update front, then the fetch: this rank's core receives it"
                                : "the later of fetch and update");
  } else {
    std::printf("  optimizer          %s (AdamW on the device)\n", seconds(t.update).c_str());
  }
  std::printf("throughput: %.4g tokens/s, MFU %.1f %% (%.4g model TFLOP per step)\n", p.tokens_per_s,
              100 * p.mfu, p.model_flops_per_step / 1e12);
  if (p.fits()) std::printf("fits: yes\n");
  // One line for scripts (tests/cli/check_plan_cpu.sh): the step and each stage's rank 0 bytes.
  std::printf("predicted: step_s=%.6g tokens_per_s=%.6g", t.total, p.tokens_per_s);
  for (const StagePrediction& s : p.stages)
    std::printf(" stage%d_bytes=%.0f", s.pp, s.memory.device_total());
  std::printf("\n");
  for (const Overflow& o : p.overflows) std::printf("DOES NOT FIT: %s: %s\n", o.who.c_str(), o.what.c_str());
}

std::vector<int> powers_of_two_up_to(std::int64_t n) {
  std::vector<int> v;
  for (std::int64_t x = 1; x <= n; x *= 2) v.push_back(static_cast<int>(x));
  return v;
}

}  // namespace

std::vector<RankedLayout> search_layouts(const Deck& deck, const PlanOptions& o, const Machine& m) {
  const int world = world_for(deck, o, m);
  std::vector<int> holder_counts = {0, 1, 2, 4};
  if (o.nodes > 0) holder_counts.insert(holder_counts.end(), {o.nodes, 2 * o.nodes});
  std::sort(holder_counts.begin(), holder_counts.end());
  holder_counts.erase(std::unique(holder_counts.begin(), holder_counts.end()), holder_counts.end());
  std::vector<RankedLayout> found;
  // The set-up's checks depend on the holders and the grid, not on micro-batches or recompute.
  std::map<std::array<int, 4>, bool> accepted;
  for (int h : holder_counts)
    for (int tp : powers_of_two_up_to(deck.model.n_head))
      for (int pp : powers_of_two_up_to(deck.model.n_layer))
        for (int mb : powers_of_two_up_to(deck.train.batch_size))
          for (const char* rc : {"none", "full"}) {
            Deck d = deck;
            d.parallel.holders = h, d.parallel.tp = tp, d.parallel.pp = pp, d.parallel.dp = 0;
            d.parallel.micro_batches = mb, d.train.recompute = rc;
            if (h == 0) d.pd.staleness = 0;
            // --ranks fixes the job; --nodes fixes the GPUs (holders are extra CPU processes).
            const int w = o.ranks > 0 || !m.device.gpu ? world : world - static_cast<int>(deck.parallel.holders) + h;
            LayoutShape shape;
            try {
              shape = resolve_layout(d, w);
              const std::array<int, 4> grid = {shape.holders, shape.dp, shape.tp, shape.pp};
              if (auto it = accepted.find(grid); it != accepted.end() && !it->second) continue;
              if (!accepted.count(grid)) {
                accepted[grid] = false;
                check_as_training(d, o, m, shape);
                accepted[grid] = true;
              }
            } catch (const Error&) {
              continue;  // not a layout training would accept
            }
            if (d.train.batch_size / (shape.dp * mb) < 1) continue;
            PlanInput in = input_for(d, o, m, shape);
            found.push_back({in, predict(in, m), rc});
          }
  if (found.empty())
    throw Error(ExitCode::layout, "pdtrain plan --search: no layout of " + std::to_string(world) +
                                      " ranks is valid for " + deck.source_name);
  std::stable_sort(found.begin(), found.end(), [](const RankedLayout& a, const RankedLayout& b) {
    if (a.prediction.fits() != b.prediction.fits()) return a.prediction.fits();
    return a.prediction.tokens_per_s > b.prediction.tokens_per_s;
  });
  return found;
}

namespace {

struct Width {
  std::int64_t d_model, n_head;
};
// The family --largest grows: GPT-3's widths (Brown et al. 2020, table 2.1: 768 to 12288), the
// wider ones of the largest dense models (16384: Gopher 280B's; 20480, 25600 beyond), with
// heads of 64 channels up to 1024 and of 128 from there (GPT-3's 6.7B and up).
constexpr Width kFamily[] = {{768, 12},    {1024, 16},   {1536, 12},   {2048, 16},
                             {2560, 20},   {4096, 32},   {5120, 40},   {8192, 64},
                             {12288, 96},  {16384, 128}, {20480, 160}, {25600, 200}};
constexpr std::int64_t kMostLayers = 1 << 14;

// The most parameters one use of a PD stage can take (the tied embedding with the position
// table and the final LayerNorm together, or one layer), in cache bytes: fp32, and the bf16
// copy beside it in bf16 precision. An upper bound of what training's check asks.
double largest_use_bytes(const ModelShape& s, int tp, Precision precision) {
  const double C = static_cast<double>(s.d_model);
  const double layer = 12 * C * C / tp + 13 * C;
  const double ends = static_cast<double>(s.padded_vocab) * C / tp + static_cast<double>(s.max_seq_len) * C + 2 * C;
  return (precision == Precision::bf16 ? 1.5 : 1.0) * 4 * std::max(layer, ends);
}

double layer_cache_bytes(const ModelShape& s, int tp, Precision precision) {
  const double C = static_cast<double>(s.d_model);
  return (precision == Precision::bf16 ? 1.5 : 1.0) * 4 * (12 * C * C / tp + 13 * C);
}

// The deck at width w and `layers` layers, with `holders` holders on `gpus` compute ranks:
// whether it fits (a layout training accepts, and the prediction's memory fits).
struct Trial {
  bool fits = false;
  LargestAtWidth at;
};

Trial try_model(const Deck& deck, const PlanOptions& o, const Machine& m, const Width& w, std::int64_t layers,
                int holders, int gpus) {
  Deck d = deck;
  d.model.n_layer = layers, d.model.d_model = w.d_model, d.model.n_head = w.n_head;
  d.parallel.holders = holders, d.parallel.dp = 0;
  if (m.device.gpu) d.compute.device = "cuda";  // the gradient bound of a GPU rank (staged)
  if (holders == 0) d.pd.staleness = 0;
  // PD on one stage in layer order (L2L): every micro-batch through a layer before the next, so
  // the rank holds one layer's gradients at a time; in micro-batch order each unit's gradient
  // accumulates over the step's micro-batches, and the whole stage's would be on the device.
  if (holders > 0 && d.parallel.pp == 1) d.parallel.order = StageOrder::layer;
  Trial t;
  t.at.d_model = w.d_model, t.at.n_head = w.n_head, t.at.n_layer = layers;
  try {
    const ModelShape shape = resolve_model_shape(d.model);
    if (holders > 0) {
      const int tp = static_cast<int>(deck.parallel.tp);
      const double need = largest_use_bytes(shape, tp, d.train.precision) +
                          layer_cache_bytes(shape, tp, d.train.precision);
      d.pd.cache_mb = std::max(d.pd.cache_mb, std::ceil(need / 1048576.0));
    }
    t.at.cache_mb = holders > 0 ? d.pd.cache_mb : 0;
    t.at.params = model_params(shape);
    const LayoutShape L = resolve_layout(d, holders + gpus);
    check_as_training(d, o, m, L);
    t.at.input = input_for(d, o, m, L);
  } catch (const Error&) {
    return t;  // not a layout training would accept (too few layers for pp, a holder without a block)
  }
  t.at.prediction = predict(t.at.input, m);
  t.fits = t.at.prediction.fits();
  return t;
}

// The most layers of width w that fit (fitting only gets harder with more layers): doubling,
// then bisecting.
LargestAtWidth most_layers(const Deck& deck, const PlanOptions& o, const Machine& m, const Width& w, int holders,
                           int gpus) {
  Trial best = try_model(deck, o, m, w, 1, holders, gpus);
  if (!best.fits) {
    LargestAtWidth none;
    none.d_model = w.d_model, none.n_head = w.n_head;
    none.cache_mb = best.at.cache_mb;
    return none;
  }
  std::int64_t lo = 1, hi = 0;  // lo fits; hi (when > 0) does not
  while (hi == 0 && lo < kMostLayers) {
    const std::int64_t next = std::min(2 * lo, kMostLayers);
    Trial t = try_model(deck, o, m, w, next, holders, gpus);
    if (t.fits) lo = next, best = std::move(t);
    else hi = next;
  }
  while (hi > lo + 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    Trial t = try_model(deck, o, m, w, mid, holders, gpus);
    if (t.fits) lo = mid, best = std::move(t);
    else hi = mid;
  }
  return best.at;
}

void print_search(const std::vector<RankedLayout>& found, const Machine& m) {
  std::printf("pdtrain plan --search: %zu valid layouts on %s, best predicted first\n", found.size(),
              m.name.c_str());
  std::printf("  %4s %7s %5s %4s %4s %5s %9s %10s %6s %10s %10s  %s\n", "rank", "holders", "dp", "tp", "pp",
              "micro", "recompute", "tokens/s", "MFU", "step", "peak rank", "fits");
  const std::size_t shown = std::min<std::size_t>(found.size(), 10);
  for (std::size_t i = 0; i < shown; ++i) {
    const RankedLayout& c = found[i];
    double peak = 0;
    for (const StagePrediction& s : c.prediction.stages) peak = std::max(peak, s.memory.device_total());
    const LayoutShape& L = c.input.layout;
    std::printf("  %4zu %7d %5d %4d %4d %5lld %9s %10.4g %5.1f%% %10s %10s  %s\n", i + 1, L.holders, L.dp, L.tp,
                L.pp, static_cast<long long>(c.input.micro_batches), c.recompute.c_str(),
                c.prediction.tokens_per_s, 100 * c.prediction.mfu, seconds(c.prediction.step.total).c_str(),
                gib(peak).c_str(), c.prediction.fits() ? "yes" : c.prediction.overflows[0].who.c_str());
  }
}

}  // namespace

double model_params(const ModelShape& s) {
  const double C = static_cast<double>(s.d_model);
  return static_cast<double>(s.padded_vocab) * C + static_cast<double>(s.max_seq_len) * C +
         static_cast<double>(s.n_layer) * (12 * C * C + 13 * C) + 2 * C;
}

const LargestAtWidth* LargestModels::largest(bool with_holders) const {
  const LargestAtWidth* best = nullptr;
  for (const LargestAtWidth& w : with_holders ? pd : baseline)
    if (w.n_layer > 0 && (!best || w.params > best->params)) best = &w;
  return best;
}

LargestModels largest_models(const Deck& deck, const PlanOptions& o, const Machine& m) {
  // The job's GPUs (its compute ranks); PD adds its holders as CPU processes.
  const int gpus = world_for(deck, o, m) - static_cast<int>(deck.parallel.holders);
  if (gpus < 1)
    throw Error(ExitCode::deck, "pdtrain plan --largest: the job has no compute rank (" +
                                    std::to_string(world_for(deck, o, m)) + " ranks, " +
                                    std::to_string(deck.parallel.holders) + " holders)");
  LargestModels out;
  out.gpus = gpus;
  out.holders = deck.parallel.holders > 0 ? static_cast<int>(deck.parallel.holders) : 1;
  for (const Width& w : kFamily) {
    out.pd.push_back(most_layers(deck, o, m, w, out.holders, gpus));
    out.baseline.push_back(most_layers(deck, o, m, w, 0, gpus));
  }
  return out;
}

namespace {

std::string billions(double params) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g B", params / 1e9);
  return buf;
}

double peak_device(const Prediction& p) {
  double peak = 0;
  for (const StagePrediction& s : p.stages) peak = std::max(peak, s.memory.device_total());
  return peak;
}

void print_largest_line(const char* who, const LargestAtWidth* w, const Machine& m) {
  if (!w) {
    std::printf("largest %s: none of the family fits\n", who);
    return;
  }
  const StagePrediction& s = *std::max_element(
      w->prediction.stages.begin(), w->prediction.stages.end(),
      [](const StagePrediction& a, const StagePrediction& b) { return a.memory.device_total() < b.memory.device_total(); });
  const ComputeMemory& mem = s.memory;
  std::printf("largest %s: %lld layers x d_model %lld (%lld heads), %s parameters; its fullest GPU (stage %d): "
              "params %s, grads %s, optimizer %s, activations %s, workspace %s = %s of %s; pinned host %s",
              who, static_cast<long long>(w->n_layer), static_cast<long long>(w->d_model),
              static_cast<long long>(w->n_head), billions(w->params).c_str(), s.pp, gib(mem.params).c_str(),
              gib(mem.grads).c_str(), gib(mem.optimizer).c_str(), gib(mem.activations).c_str(),
              gib(mem.workspace).c_str(), gib(mem.device_total()).c_str(), gib(m.device.memory_bytes).c_str(),
              gib(mem.staging).c_str());
  if (w->input.layout.holders > 0)
    std::printf("; %d holder(s) of %s (node memory %s), pd.cache_mb %g", w->input.layout.holders,
                gib(w->prediction.holder.memory).c_str(), gib(m.node.cpu_memory_bytes).c_str(), w->cache_mb);
  std::printf("; predicted step %s\n", seconds(w->prediction.step.total).c_str());
}

void print_largest(const Deck& deck, const LargestModels& r, const Machine& m) {
  std::printf("pdtrain plan --search --largest: the largest GPT of the family on %d GPU(s) of %s, vocabulary %lld, sequence %lld, "
              "batch %lld, %s, recompute %s: with %d holder(s) (PD: a bounded parameter cache, gradients streamed "
              "per unit, layer order on one stage) against the replicated baseline (parallel.holders = 0) on the same GPUs\n",
              r.gpus, m.name.c_str(), static_cast<long long>(deck.model.vocab_size), static_cast<long long>(deck.model.seq_len),
              static_cast<long long>(deck.train.batch_size),
              deck.train.precision == Precision::bf16 ? "bf16" : "fp32", deck.train.recompute.c_str(), r.holders);
  std::printf("  %7s %5s | %12s %10s %10s %10s | %12s %10s %10s\n", "d_model", "heads", "PD layers", "params",
              "device", "holder", "base layers", "params", "device");
  for (std::size_t i = 0; i < r.pd.size(); ++i) {
    const LargestAtWidth &p = r.pd[i], &b = r.baseline[i];
    std::printf("  %7lld %5lld | %12lld %10s %10s %10s | %12lld %10s %10s\n", static_cast<long long>(p.d_model),
                static_cast<long long>(p.n_head), static_cast<long long>(p.n_layer),
                p.n_layer ? billions(p.params).c_str() : "-", p.n_layer ? gib(peak_device(p.prediction)).c_str() : "-",
                p.n_layer ? gib(p.prediction.holder.memory).c_str() : "-", static_cast<long long>(b.n_layer),
                b.n_layer ? billions(b.params).c_str() : "-", b.n_layer ? gib(peak_device(b.prediction)).c_str() : "-");
  }
  const LargestAtWidth *pd = r.largest(true), *base = r.largest(false);
  print_largest_line("with holders", pd, m);
  print_largest_line("as the baseline", base, m);
  // One line for scripts and tests.
  std::printf("largest: pd_params=%.0f baseline_params=%.0f ratio=%.3g\n", pd ? pd->params : 0.0,
              base ? base->params : 0.0, pd && base ? pd->params / base->params : 0.0);
}

}  // namespace

PlanInput checked_input(const Deck& deck, const PlanOptions& o, const Machine& m) {
  const LayoutShape shape = resolve_layout(deck, world_for(deck, o, m));
  check_as_training(deck, o, m, shape);
  return input_for(deck, o, m, shape);
}

void run_plan(const Deck& deck, const PlanOptions& o, MPI_Comm comm) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  if (!o.calibrate.empty()) return calibrate(o.calibrate, comm);
  if (o.nodes > 0 && o.ranks > 0)
    throw Error(ExitCode::deck, "pdtrain plan: give --nodes or --ranks, not both");
  const Machine m = load_machine(machine_path(o.machine));
  if (o.largest) {
    const LargestModels r = largest_models(deck, o, m);
    if (rank == 0) print_largest(deck, r, m), std::fflush(stdout);
    return;
  }
  if (o.search) {
    const std::vector<RankedLayout> found = search_layouts(deck, o, m);
    if (rank == 0) print_search(found, m), std::fflush(stdout);
    return;
  }
  const PlanInput in = checked_input(deck, o, m);
  const Prediction p = predict(in, m);
  if (rank == 0) print_prediction(deck, m, in, p), std::fflush(stdout);
  if (!p.fits())
    throw Error(ExitCode::layout, "the layout does not fit: " + p.overflows[0].who + ": " + p.overflows[0].what);
}

}  // namespace pdtrain::plan
