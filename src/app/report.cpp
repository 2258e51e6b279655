#include "pdtrain/app/report.hpp"

#include "pdtrain/app/compute_device.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>

#include "pdtrain/layout/placement.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/plan/model.hpp"
#include "pdtrain/schedule/pipeline_schedule.hpp"
#include "pdtrain/version.hpp"

namespace pdtrain {

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", b, unit[u]);
  return buf;
}

namespace {

// A holder's line of the dry run: its node and the blocks it owns.
void print_holder(const Setup& s, int r) {
  const ParamCatalog& cat = *s.catalog;
  std::int64_t n = 0, bytes = 0;
  for (std::size_t b = 0; b < s.owner.size(); ++b)
    if (s.owner[b] == r) ++n, bytes += cat.block(static_cast<int>(b)).bytes();
  std::printf(" on node %d: owns %lld blocks, %s params + %s AdamW state\n", s.node[r],
              static_cast<long long>(n), human_bytes(static_cast<double>(bytes)).c_str(),
              human_bytes(2.0 * static_cast<double>(bytes)).c_str());
}

// A compute rank's line of the dry run: its layers, the blocks it fetches (and from where),
// and its memory.
void print_compute_rank(const Deck& deck, const Setup& s, const StagePosition& pos, int r) {
  const ParamCatalog& cat = *s.catalog;
  const LayoutShape& ls = s.shape;
  const int p = pos.pp, t = pos.tp;
  const StageSpec& spec = pos.shapes.spec();
  const int fetcher = ls.fetcher_rank(p, t);
  std::int64_t bytes = 0, local = 0;
  for (int b : pos.shapes.needed_blocks()) {
    bytes += cat.block(b).bytes();
    if (ls.holders > 0 && s.node[s.owner[b]] == s.node[fetcher]) local += cat.block(b).bytes();
  }
  // Memory from the performance model (pdtrain plan's, one model for both: src/plan), with
  // the PD gradients GradStreamer's exact bound: PD ranks hold at most pd.cache_mb of
  // parameters; the baseline also holds its replica (parameters, AdamW moments, gradients).
  plan::PlanInput in = plan::plan_input(deck, ls, 1);
  in.model = cat.shape();  // completed by an llm.c init file's header
  in.pd_grad_bytes = [&](int) {
    return static_cast<double>(GradStreamer::bound_bytes(
        pos.shapes, backward_passes(deck), ls.dp, static_cast<int>(deck.pd.pushes_in_flight),
        deck.compute.device != "cpu"));
  };
  int slots = 0;
  const plan::ComputeMemory mem = plan::compute_memory(in, p, t, false, &slots);
  const double b = static_cast<double>(bytes), params = mem.params, grads = mem.grads;
  const double copies = deck.train.precision == Precision::bf16 ? 1.5 : 1.0;
  const double cap = deck.pd.cache_mb * 1048576.0;
  std::string params_text = human_bytes(params);
  if (ls.holders > 0 && cap > 0 && deck.pd.cache_warm_steps > 0)  // the cold start's warm phase
    params_text += " (" + human_bytes(copies * b) + " in the first " +
                   std::to_string(deck.pd.cache_warm_steps) + " steps)";
  std::string where;
  if (ls.holders > 0 && fetcher == r)
    where = ", " + std::to_string(static_cast<int>(100.0 * static_cast<double>(local) / b)) +
            " % of them from holders on its node " + std::to_string(s.node[r]);
  else if (ls.holders > 0)
    where = ", relayed by rank " + std::to_string(fetcher);
  std::printf(": layers %lld..%lld%s%s, fetches %zu blocks (%s%s); memory: params %s, grads %s, "
              "activations %s (%d slot(s))%s; device: %s\n",
              static_cast<long long>(spec.layer_begin),
              static_cast<long long>(spec.layer_end - 1),
              spec.has_embedding ? " + embedding" : "", spec.has_head ? " + head" : "",
              pos.shapes.needed_blocks().size(), human_bytes(b).c_str(), where.c_str(),
              params_text.c_str(), human_bytes(grads).c_str(),
              human_bytes(mem.activations).c_str(), slots,
              ls.holders == 0 ? (" + replica (params, AdamW, grads) " + human_bytes(mem.optimizer)).c_str()
                              : "",
              describe_compute_device(deck, s, r).c_str());
}

}  // namespace

std::function<double(int)> pd_grad_bound(const Deck& deck, const LayoutShape& shape) {
  auto cat = std::make_shared<const ParamCatalog>(resolve_model_shape(deck.model));
  std::vector<StageSpec> specs;
  for (int p = 0; p < shape.pp; ++p) specs.push_back(stage_spec(deck, shape, p, 0));
  const int passes = backward_passes(deck), replicas = shape.dp;
  const int in_flight = static_cast<int>(deck.pd.pushes_in_flight);
  const bool staged = deck.compute.device != "cpu";
  const Precision prec = deck.train.precision;
  return [cat, specs, passes, replicas, in_flight, staged, prec](int p) {
    const StageParams shapes(*cat, specs[static_cast<std::size_t>(p)], StageParams::Storage::shapes_only, prec);
    return static_cast<double>(GradStreamer::bound_bytes(shapes, passes, replicas, in_flight, staged));
  };
}

void connect_plan_to_training(plan::PlanOptions& options) {
  options.pd_grad_bytes = pd_grad_bound;
  options.check_layout = check_layout;
}

namespace {

std::string links_text(const char* kind, int size, const GroupLinks& l) {
  return std::string(kind) + " " + std::to_string(size) + ": " + std::to_string(l.intra_node) +
         " group(s) within a node, " + std::to_string(l.inter_node) + " across nodes";
}

// Which links each kind of collective group crosses, and the transport asked for.
void print_group_links(const Deck& deck, const Setup& s) {
  const GridLinks l = grid_links(s.shape, s.node);
  std::printf("groups: %s; %s; %s | parallel.comm = %s (resolved at start-up: nccl needs a GPU "
              "of its own per compute rank)\n",
              links_text("tp", s.shape.tp, l.tp).c_str(), links_text("pp", s.shape.pp, l.pp).c_str(),
              links_text("dp", s.shape.dp, l.dp).c_str(), deck.parallel.comm.c_str());
}

}  // namespace

void print_dry_run(const Deck& deck, const Setup& s, const Layout& layout) {
  const ParamCatalog& cat = *s.catalog;
  const LayoutShape& ls = s.shape;
  std::printf("pdtrain %s dry run: %d ranks = %d holder(s) + dp %d x pp %d x tp %d compute\n",
              PDTRAIN_VERSION, ls.world(), ls.holders, ls.dp, ls.pp, ls.tp);
  std::printf("model: %lld parameters in %zu blocks (%s); micro-batch %lld x %lld tokens, "
              "%lld micro-batch(es) per replica, %s schedule\n",
              static_cast<long long>(cat.total_numel()), cat.blocks().size(),
              human_bytes(static_cast<double>(cat.total_numel()) * 4).c_str(),
              static_cast<long long>(micro_batch_size(deck, ls)),
              static_cast<long long>(deck.model.seq_len),
              static_cast<long long>(deck.parallel.micro_batches),
              deck.parallel.order == StageOrder::layer ? "layer-major"
                                                     : deck.parallel.schedule.c_str());
  const std::vector<StagePosition> stages = stage_positions(deck, ls, cat);
  for (int r = 0; r < ls.world(); ++r) {
    std::printf("  %s", layout.describe_rank(r).c_str());
    if (s.job_rank[r] != r) std::printf(" [job rank %d]", s.job_rank[r]);
    if (r < ls.holders) {
      print_holder(s, r);
    } else {
      const int c = r - ls.holders, t = c % ls.tp, p = (c / ls.tp) % ls.pp;
      print_compute_rank(deck, s, stages[static_cast<std::size_t>(p * ls.tp + t)], r);
    }
  }
  print_group_links(deck, s);
}

namespace {

// Bounded staleness as it will run: the delay, the synchronous warm-up and the correction.
void print_staleness(const Deck& deck) {
  const StalenessPlan plan = staleness_plan(deck);
  std::printf(" | staleness %d", plan.staleness);
  if (plan.warmup > 0)
    std::printf(" after %lld synchronous steps", static_cast<long long>(plan.warmup));
  if (plan.ramp > 0 && plan.staleness > 1)
    std::printf(", rising by one every %lld steps", static_cast<long long>(plan.ramp));
  const Prediction p = prediction_coefficients(plan.correction, plan.staleness);
  if (p.exact())
    std::printf(", plain delayed AdamW");
  else if (p.trend == 0.0f)
    std::printf(", versions predicted %.2f updates ahead", static_cast<double>(p.lead));
  else
    std::printf(", versions predicted %.2f updates ahead + %.2f x the momentum's change",
                static_cast<double>(p.lead), static_cast<double>(p.trend));
}

}  // namespace

void print_run_header(const Deck& deck, const Setup& setup, const Layout& layout,
                      const std::string& compute, const std::string& comm) {
  const ModelShape& m = setup.catalog->shape();
  const LayoutShape& ls = layout.shape();
  std::printf("pdtrain %s | %s | %d ranks: %d holder(s) + %d compute (dp %d x pp %d x tp %d)%s\n",
              PDTRAIN_VERSION, deck.source_name.c_str(), ls.world(), ls.holders, ls.compute(),
              ls.dp, ls.pp, ls.tp,
              layout.replicated() ? " | replicated baseline" : " | parameter/compute decoupled");
  std::printf("model: GPT-2 %lld layers, d_model %lld, %lld heads, vocab %lld (padded %lld), "
              "seq %lld | %lld parameters | batch %lld x %lld tokens",
              static_cast<long long>(m.n_layer), static_cast<long long>(m.d_model),
              static_cast<long long>(m.n_head), static_cast<long long>(m.vocab_size),
              static_cast<long long>(m.padded_vocab), static_cast<long long>(m.seq_len),
              static_cast<long long>(setup.catalog->total_numel()),
              static_cast<long long>(deck.train.batch_size),
              static_cast<long long>(deck.model.seq_len));
  if (ls.pp > 1)
    std::printf(" | %d micro-batches, %s schedule", static_cast<int>(deck.parallel.micro_batches),
                to_string(*pipeline_kind_from_string(deck.parallel.schedule)));
  if (deck.parallel.order == StageOrder::layer)
    std::printf(" | %d micro-batches, layer-major", static_cast<int>(deck.parallel.micro_batches));
  if (deck.train.precision == Precision::bf16)
    std::printf(" | bf16 matmuls (fp32 accumulation, fp32 master weights)");
  if (!layout.replicated()) {
    const WireCodec f = fetch_codec(deck);
    const WireCodec p = *wire_codec_from_string(deck.pd.push_codec);
    std::printf("\nwire: fetch %s, push %s%s", to_string(f), to_string(p),
                deck.train.precision == Precision::bf16 && !is_lossy(p)
                    ? " (bf16 precision: holders serve bf16 copies of fp32 masters)"
                : is_lossy(f) || is_lossy(p)
                    ? " | LOSSY: numerics differ from exact synchronous training"
                    : " (lossless)");
    if (deck.pd.staleness > 0) print_staleness(deck);
  }
  std::printf("\ncompute: %s", compute.c_str());
  if (layout.shape().compute() > 1) std::printf("\ncomm: %s", comm.c_str());
  std::printf("\ndata: %s\n", setup.source->describe().c_str());
  std::printf("output: %s\n", deck.run.out_dir.c_str());
  std::fflush(stdout);
}

void report_step(MetricsWriter& metrics, const StepRecord& rec, const Deck& deck, bool verbose,
                 double eta) {
  metrics.append(rec);
  const bool last = rec.step == deck.run.steps;
  if (verbose && (rec.step % deck.run.log_every == 0 || last || rec.step == 1)) {
    std::printf("%s\n", format_step_line(rec, deck.run.steps, eta).c_str());
    std::fflush(stdout);
  }
}

void print_run_summary(const Deck& deck, const TrainResult& r, std::int64_t start_step,
                       const PhaseTimers& timers, const ParameterFigures& figures,
                       std::int64_t stage_bytes, const Device& device) {
  const ParameterService& service = figures.owner;
  const StageCache* cache = figures.cache;
  const std::int64_t train_fetched_bytes = figures.train_fetched_bytes;
  const GradStreamer* grads = figures.grads;
  const double tokens = static_cast<double>((r.final_step - start_step) * deck.train.batch_size *
                                            deck.model.seq_len);
  std::printf("summary: wall %.2f s | %.0f tok/s | fetch %.2f s | compute %.2f s | "
              "reduce %.2f s | push %.2f s | eval %.2f s | fetched %s | pushed %s\n",
              r.wall_seconds, tokens / r.wall_seconds, timers.get("fetch"),
              timers.get("compute"), timers.get("reduce"), timers.get("push"),
              timers.get("eval"),
              human_bytes(static_cast<double>(service.bytes_fetched())).c_str(),
              human_bytes(static_cast<double>(service.bytes_pushed())).c_str());
  if (cache)
    std::printf("%s (this rank; per-block table in %s/pd_heat/)\n",
                cache->summary(timers.get("compute")).c_str(), deck.run.out_dir.c_str());
  if (cache && r.final_step > start_step)
    std::printf("fetched per training step: %s = %.2f x the stage's parameters (%s)\n",
                human_bytes(static_cast<double>(train_fetched_bytes) /
                            static_cast<double>(r.final_step - start_step))
                    .c_str(),
                static_cast<double>(train_fetched_bytes) /
                    static_cast<double>((r.final_step - start_step) * stage_bytes),
                human_bytes(static_cast<double>(stage_bytes)).c_str());
  if (grads)
    std::printf("grads: streamed per unit during backward | peak %s held (bound %s; exactly "
                "%lld and %lld B) | reduce + push inside backward %.2f s\n",
                human_bytes(static_cast<double>(grads->peak_bytes())).c_str(),
                human_bytes(static_cast<double>(grads->bound())).c_str(),
                static_cast<long long>(grads->peak_bytes()),
                static_cast<long long>(grads->bound()), grads->stream_seconds());
  if (!device.is_host())
    std::printf("device: %s | peak %s allocated by this rank\n", device.describe().c_str(),
                human_bytes(static_cast<double>(device.peak_bytes())).c_str());
  if (r.losses.empty()) return;
  if (r.final_step < deck.run.steps && r.diverged_step == 0)
    std::printf("stopped after step %lld of %lld: checkpoint written; continue with "
                "--restart auto\n",
                static_cast<long long>(r.final_step), static_cast<long long>(deck.run.steps));
  std::printf("final step=%lld loss=%.9g params_crc32c=%08x\n",
              static_cast<long long>(r.final_step), r.losses.back(), r.params_crc32c);
  std::fflush(stdout);
}

void print_eval_result(const Deck& deck, std::int64_t batches, double loss, std::uint32_t crc) {
  std::printf("eval batches=%lld tokens=%lld loss=%.9g params_crc32c=%08x\n",
              static_cast<long long>(batches),
              static_cast<long long>(batches * deck.train.batch_size * deck.model.seq_len), loss,
              crc);
  std::fflush(stdout);
}

}  // namespace pdtrain
