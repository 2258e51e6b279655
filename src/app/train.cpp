// The training run: set-up shared by every rank, then the holders' server loop or the compute
// ranks' step loop. The step loop reads like the algorithm:
//   fetch parameters of version s-1 -> forward/backward on this replica's slice of batch s
//   -> reduce gradients over replicas in a fixed order -> push -> (report step s-1's record)
#include "pdtrain/app/train.hpp"

#include <Kokkos_Core.hpp>
#include <cmath>
#include <deque>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "pdtrain/app/checkpointing.hpp"
#include "pdtrain/app/stage_cache.hpp"
#include "pdtrain/core/agreement.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/signals.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/data/token_source.hpp"
#include "pdtrain/io/metrics.hpp"
#include "pdtrain/kernels/blas_runtime.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/layout/placement.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/model/llmc_format.hpp"
#include "pdtrain/optim/adamw.hpp"
#include "pdtrain/pd/fetch_client.hpp"
#include "pdtrain/pd/holder_server.hpp"
#include "pdtrain/pd/local_replica.hpp"
#include "pdtrain/schedule/grad_reduce.hpp"
#include "pdtrain/schedule/pipeline_executor.hpp"
#include "pdtrain/layout/tensor_parallel_group.hpp"
#include "pdtrain/io/trace.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/version.hpp"

namespace pdtrain {

namespace {

AdamWConfig adamw_config(const Deck& d) {
  const OptimizerConfig& o = d.optimizer;
  return AdamWConfig{o.lr,       o.min_lr,    o.warmup_steps, d.run.steps, o.weight_decay,
                     o.grad_clip, o.beta1,    o.beta2,        o.eps};
}

data::SourceSpec source_spec(const Deck& d) {
  data::SourceSpec s;
  s.kind = *data::source_kind_from_string(d.data.source);
  s.path = d.data.path;
  s.val_path = d.data.val_path;
  s.val_fraction = d.data.val_fraction;
  s.vocab_size = d.model.vocab_size;
  s.seq_len = d.model.seq_len;
  s.seed = d.run.seed;
  s.copy_lag = d.data.copy_lag;
  s.copy_prob = d.data.copy_prob;
  s.batch_size = d.train.batch_size;
  return s;
}

std::string llmc_init_path(const Deck& d) {
  return d.model.init.rfind("llmc:", 0) == 0 ? d.model.init.substr(5) : std::string();
}

// The deck's model, completed by the header of an llm.c init file (its position table and
// padded vocabulary when the deck leaves them 0) and checked against it.
ModelShape model_shape(const Deck& d) {
  ModelShape s = resolve_model_shape(d.model);
  const std::string path = llmc_init_path(d);
  if (path.empty()) return s;
  const LlmcHeader h = read_llmc_header(path);
  if (d.model.max_seq_len == 0) s.max_seq_len = h.max_seq_len;
  if (d.model.padded_vocab_size == 0) s.padded_vocab = h.padded_vocab_size;
  check_llmc_shape(h, s, path);
  return s;
}

BlockTable block_table(const ParamCatalog& cat, const Deck& d) {
  BlockTable t;
  for (const BlockInfo& b : cat.blocks())
    t.blocks.push_back(BlockDesc{b.numel(), cat.tensor(b.tensor).weight_decay, cat.block_name(b)});
  const double init_std = d.model.init_std;
  const auto seed = static_cast<std::uint64_t>(d.run.seed);
  if (const std::string path = llmc_init_path(d); !path.empty()) {
    // Read once per process, on the first block asked for (only ranks that hold parameters).
    auto canonical = std::make_shared<std::vector<float>>();
    t.init = [&cat, path, canonical](int id, float* out) {
      if (canonical->empty()) read_llmc_params(path, cat, *canonical);
      cat.gather_block(cat.block(id), canonical->data(), out);
    };
  } else {
    t.init = [&cat, init_std, seed](int id, float* out) {
      cat.init_block(cat.block(id), init_std, seed, out);
    };
  }
  t.canonical_crc = [&cat](const std::vector<const float*>& data) {
    std::vector<float> flat(static_cast<std::size_t>(cat.total_numel()));
    for (const BlockInfo& b : cat.blocks()) cat.scatter_block(b, data[b.id], flat.data());
    return crc32c(flat.data(), flat.size() * sizeof(float));
  };
  return t;
}

// Everything every rank builds the same way before roles diverge.
struct Setup {
  LayoutShape shape;
  std::unique_ptr<ParamCatalog> catalog;
  BlockTable table;
  std::vector<int> owner;  // holder of each block (PD only)
  std::vector<int> node;   // node of every rank (in PD order, see spread_holders)
  std::vector<int> job_rank;  // PD-ordered rank -> rank in the job's communicator
  std::unique_ptr<data::TokenSource> source;
};

StageSpec stage_spec(const Deck& deck, const LayoutShape& shape, int p, int t);

// World rank of the compute rank that fetches for pipeline stage p, tensor rank t: data-parallel
// replica 0 (it relays to the others). Compute ranks follow the holders, tp fastest.
int fetcher_rank(const LayoutShape& shape, int p, int t) { return shape.holders + p * shape.tp + t; }

// Blocks go to holders by the bytes they serve per step (one copy per fetching rank), on the
// node where most of their fetchers run when a holder is there.
std::vector<int> place_near_fetchers(const Deck& deck, const Setup& s) {
  const std::size_t n = s.catalog->blocks().size();
  std::vector<std::int64_t> served(n, 0);
  std::vector<std::vector<int>> votes(n);  // nodes of each block's fetchers
  for (int p = 0; p < s.shape.pp; ++p)
    for (int t = 0; t < s.shape.tp; ++t) {
      const StageParams shard(*s.catalog, stage_spec(deck, s.shape, p, t),
                              StageParams::Storage::shapes_only);
      for (int b : shard.needed_blocks()) {
        served[b] += s.catalog->block(b).bytes();
        votes[b].push_back(s.node[fetcher_rank(s.shape, p, t)]);
      }
    }
  std::vector<int> block_node(n, 0);
  for (std::size_t b = 0; b < n; ++b) {
    std::sort(votes[b].begin(), votes[b].end());
    int best = 0, best_count = 0;
    for (std::size_t i = 0; i < votes[b].size();) {
      std::size_t j = i;
      while (j < votes[b].size() && votes[b][j] == votes[b][i]) ++j;
      if (static_cast<int>(j - i) > best_count) best = votes[b][i], best_count = static_cast<int>(j - i);
      i = j;
    }
    block_node[b] = best;
  }
  const std::vector<int> holder_node(s.node.begin(), s.node.begin() + s.shape.holders);
  return place_blocks_near(served, block_node, holder_node);
}

// pd.cache_mb must hold the largest single use of every compute rank's stage (a layer, or the
// tied embedding with the final LayerNorm); less could never run.
void check_cache_size(const Deck& deck, const Setup& s) {
  const auto capacity = static_cast<std::int64_t>(deck.pd.cache_mb * 1048576.0);
  for (int p = 0; p < s.shape.pp; ++p)
    for (int t = 0; t < s.shape.tp; ++t) {
      const StageParams shard(*s.catalog, stage_spec(deck, s.shape, p, t),
                              StageParams::Storage::shapes_only);
      auto plan = GptStage::forward_uses(shard);
      for (auto& use : GptStage::backward_uses(shard)) plan.push_back(use);
      const std::int64_t need = ParamCache::min_capacity_bytes(StageCache::units_of(shard), plan);
      if (capacity < need) {
        char mib[32], have[32];
        std::snprintf(mib, sizeof(mib), "%.2f", static_cast<double>(need) / 1048576.0);
        std::snprintf(have, sizeof(have), "%g", deck.pd.cache_mb);
        throw Error(ExitCode::deck,
                    deck.where("pd.cache_mb") + ": " + have + " MiB cannot hold one use of pipeline stage " + std::to_string(p) +
                        " (tp rank " + std::to_string(t) + "): its largest (a layer, or the tied "
                        "embedding with the final LayerNorm) needs " + mib + " MiB");
      }
    }
}

// Holders are ranks 0..H-1 of the run's communicator. Launchers fill nodes in rank order, so
// on several nodes the job's ranks are reordered to put the holders on different nodes (holder
// h on node h mod nodes), each serving the fetchers nearest it; on one node nothing moves.
void spread_holders(Setup& s, const std::vector<int>& job_node) {
  const int n = static_cast<int>(job_node.size());
  const int nodes = 1 + *std::max_element(job_node.begin(), job_node.end());
  std::vector<bool> taken(job_node.size(), false);
  for (int h = 0; h < s.shape.holders; ++h) {
    const int want = nodes > 1 ? h % nodes : 0;
    int pick = -1;
    for (int r = 0; r < n && pick < 0; ++r)
      if (!taken[r] && job_node[r] == want) pick = r;
    for (int r = 0; r < n && pick < 0; ++r)  // that node is full of holders already
      if (!taken[r]) pick = r;
    taken[pick] = true;
    s.job_rank.push_back(pick);
  }
  for (int r = 0; r < n; ++r)
    if (!taken[r]) s.job_rank.push_back(r);
  for (int r : s.job_rank) s.node.push_back(job_node[r]);
}

// `eval_only`: the validation windows are those of data.path itself, from its first token
// (how llm.c computes a validation loss over a file).
Setup make_setup(const Deck& deck, MPI_Comm world, bool eval_only) {
  int world_size = 0;
  MPI_CHECK(MPI_Comm_size(world, &world_size));
  Setup s;
  s.shape = resolve_layout(deck, world_size);
  s.catalog = std::make_unique<ParamCatalog>(model_shape(deck));
  s.table = block_table(*s.catalog, deck);
  spread_holders(s, node_of_ranks(world));
  if (s.shape.holders > 0) {
    s.owner = place_near_fetchers(deck, s);
    std::vector<int> owned(static_cast<std::size_t>(s.shape.holders), 0);
    for (int o : s.owner) ++owned[o];
    for (int h = 0; h < s.shape.holders; ++h)
      if (owned[h] == 0)
        throw Error(ExitCode::layout,
                    deck.where("parallel.holders") + ": holder " + std::to_string(h) +
                        " would own no parameter block (the model has " +
                        std::to_string(s.owner.size()) + " blocks); use fewer holders");
  }
  if (s.shape.holders > 0 && deck.pd.cache_mb > 0) check_cache_size(deck, s);
  // Every rank opens the data so that a bad file is one collective error, not a hang.
  data::SourceSpec spec = source_spec(deck);
  if (eval_only && spec.kind != data::SourceKind::synthetic) spec.val_path = spec.path;
  s.source = data::make_token_source(spec);
  return s;
}

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", b, unit[u]);
  return buf;
}

// The stage of the compute rank at pipeline stage p, tensor-parallel rank t: its contiguous,
// balanced range of layers, the embedding on the first stage, the final LayerNorm and tied head
// on the last, and its tensor-parallel shard.
StageSpec stage_spec(const Deck& deck, const LayoutShape& shape, int p, int t) {
  const std::int64_t L = deck.model.n_layer, pp = shape.pp;
  return StageSpec{p * L / pp, (p + 1) * L / pp, p == 0, p == pp - 1, shape.tp, t};
}

StageSpec stage_spec(const Deck& deck, const Layout& layout) {
  return stage_spec(deck, layout.shape(), layout.pp_rank(), layout.tp_rank());
}

// The fetch codec in use: bf16 precision makes holders serve bf16 copies of their fp32 masters.
WireCodec fetch_codec(const Deck& deck) {
  return deck.train.precision == "bf16" ? WireCodec::bf16
                                        : *wire_codec_from_string(deck.pd.fetch_codec);
}

Precision precision(const Deck& deck) {
  return deck.train.precision == "bf16" ? Precision::bf16 : Precision::fp32;
}

Recompute recompute_mode(const Deck& deck) {
  if (deck.train.recompute == "full") return Recompute::full;
  if (deck.train.recompute == "attention") return Recompute::attention;
  return Recompute::none;
}

std::int64_t micro_batch_size(const Deck& deck, const LayoutShape& shape) {
  return deck.train.batch_size / (shape.dp * deck.parallel.micro_batches);
}

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
              static_cast<long long>(deck.parallel.micro_batches), deck.parallel.schedule.c_str());
  const auto kind = *pipeline_kind_from_string(deck.parallel.schedule);
  for (int r = 0; r < ls.world(); ++r) {
    std::printf("  %s", layout.describe_rank(r).c_str());
    if (s.job_rank[r] != r) std::printf(" [job rank %d]", s.job_rank[r]);
    if (r < ls.holders) {
      std::int64_t n = 0, bytes = 0;
      for (std::size_t b = 0; b < s.owner.size(); ++b)
        if (s.owner[b] == r) ++n, bytes += cat.block(static_cast<int>(b)).bytes();
      std::printf(" on node %d: owns %lld blocks, %s params + %s AdamW state\n", s.node[r],
                  static_cast<long long>(n),
                  human_bytes(static_cast<double>(bytes)).c_str(),
                  human_bytes(2.0 * static_cast<double>(bytes)).c_str());
      continue;
    }
    const int c = r - ls.holders, t = c % ls.tp, p = (c / ls.tp) % ls.pp;
    const StageSpec spec = stage_spec(deck, ls, p, t);
    const StageParams shard(cat, spec, StageParams::Storage::shapes_only);
    std::int64_t bytes = 0, local = 0;
    for (int b : shard.needed_blocks()) {
      bytes += cat.block(b).bytes();
      if (ls.holders > 0 && s.node[s.owner[b]] == s.node[fetcher_rank(ls, p, t)])
        local += cat.block(b).bytes();
    }
    const int slots = pipeline_in_flight(kind, ls.pp, p, static_cast<int>(deck.parallel.micro_batches));
    const std::int64_t acts = GptStage::memory_bytes(cat.shape(), spec, micro_batch_size(deck, ls),
                                                     deck.model.seq_len, slots);
    // PD ranks hold at most pd.cache_mb of parameters (plus the whole stage's gradients); the
    // baseline holds its stage's parameters, gradients and AdamW state.
    const double cap = deck.pd.cache_mb * 1048576.0, b = static_cast<double>(bytes);
    const double params = ls.holders > 0 && cap > 0 ? std::min(cap, b) : b;
    std::string where;
    const int fetcher = fetcher_rank(ls, p, t);
    if (ls.holders > 0 && fetcher == r)
      where = ", " + std::to_string(static_cast<int>(100.0 * static_cast<double>(local) / b)) +
              " % of them from holders on its node " + std::to_string(s.node[r]);
    else if (ls.holders > 0)
      where = ", relayed by rank " + std::to_string(fetcher);
    std::printf(": layers %lld..%lld%s%s, fetches %zu blocks (%s%s); memory: params %s, grads %s, "
                "activations %s (%d slot(s))%s\n",
                static_cast<long long>(spec.layer_begin),
                static_cast<long long>(spec.layer_end - 1),
                spec.has_embedding ? " + embedding" : "", spec.has_head ? " + head" : "",
                shard.needed_blocks().size(), human_bytes(b).c_str(), where.c_str(),
                human_bytes(params).c_str(), human_bytes(b).c_str(),
                human_bytes(static_cast<double>(acts)).c_str(), slots,
                ls.holders == 0 ? (" + AdamW " + human_bytes(2.0 * b)).c_str() : "");
  }
}

// How many gradient pushes of each block make up one step: the tied embedding is used (and
// pushed) by both the first and the last pipeline stage; every other block by one stage.
std::vector<int> push_contributions(const ParamCatalog& cat, int pp) {
  std::vector<int> n(cat.blocks().size(), 1);
  for (const BlockInfo& b : cat.blocks())
    if (b.tensor == TensorId::wte && pp > 1) n[b.id] = 2;
  return n;
}

// Binds the model stage to the pipeline executor: which tokens a micro-batch holds (training
// step or validation batch), which activation slot it uses, and the loss it adds up.
class StageRunner final : public PipelineStageOps {
 public:
  StageRunner(GptStage& stage, const data::TokenSource& source, std::int64_t first_sequence,
              std::int64_t micro_batch, std::int64_t seq_len, int slots, bool has_head)
      : stage_(stage), source_(source), first_(first_sequence), Bm_(micro_batch), T_(seq_len),
        slots_(slots), has_head_(has_head), seq_(static_cast<std::size_t>(Bm_ * (T_ + 1))),
        inputs_(static_cast<std::size_t>(Bm_ * T_)), targets_(inputs_.size()) {}

  // Micro-batch mb of training step `step`, d(loss)/d(token loss) = dloss.
  void train(std::int64_t step, float dloss) {
    step_ = step, val_batches_per_pass_ = 0, dloss_ = dloss, loss_sum_ = 0.0;
  }
  // Micro-batch q = b * micro_batches + j of validation batch b.
  void eval(int micro_batches, std::int64_t batch_size) {
    val_batches_per_pass_ = micro_batches, val_batch_size_ = batch_size, loss_sum_ = 0.0;
  }
  double loss_sum() const { return loss_sum_; }

  void forward(int mb, const float* input) override {
    load_tokens(mb);
    const double loss = stage_.forward(mb % slots_, inputs_.data(), input, targets_.data());
    if (has_head_) loss_sum_ += loss;
  }
  const float* output(int mb) override { return stage_.output(mb % slots_); }
  void backward(int mb, const float* doutput) override {
    stage_.backward(mb % slots_, dloss_, doutput);
  }
  const float* dinput() override { return stage_.dinput(); }

 private:
  void load_tokens(int mb) {
    if (val_batches_per_pass_ == 0) {
      source_.train_sequences(step_, first_ + mb * Bm_, Bm_, seq_.data());
    } else {
      const std::int64_t b = mb / val_batches_per_pass_, j = mb % val_batches_per_pass_;
      source_.val_sequences(b, val_batch_size_, first_ + j * Bm_, Bm_, seq_.data());
    }
    for (std::int64_t i = 0; i < Bm_; ++i)
      for (std::int64_t t = 0; t < T_; ++t) {
        inputs_[i * T_ + t] = seq_[i * (T_ + 1) + t];
        targets_[i * T_ + t] = seq_[i * (T_ + 1) + t + 1];
      }
  }

  GptStage& stage_;
  const data::TokenSource& source_;
  std::int64_t first_, Bm_, T_;
  int slots_;
  bool has_head_;
  std::vector<std::int32_t> seq_, inputs_, targets_;
  std::int64_t step_ = 0, val_batch_size_ = 0;
  int val_batches_per_pass_ = 0;
  float dloss_ = 0.0f;
  double loss_sum_ = 0.0;
};

// The compute ranks' step loop.
class ComputeLoop {
 public:
  ComputeLoop(const Deck& deck, const Setup& setup, const Layout& layout, const RunOptions& opts,
              std::unique_ptr<ParameterService> service, std::int64_t start_step,
              TraceRecorder* trace)
      : deck_(deck), setup_(setup), layout_(layout), opts_(opts), trace_(trace),
        start_step_(start_step),
        tp_(layout.tp_comm()),
        stage_params_(*setup.catalog, stage_spec(deck, layout),
                      layout.replicated() ? StageParams::Storage::resident
                                          : StageParams::Storage::streamed,
                      precision(deck)),
        micro_batches_(static_cast<int>(deck.parallel.micro_batches)),
        kind_(*pipeline_kind_from_string(deck.parallel.schedule)),
        micro_batch_(micro_batch_size(deck, layout.shape())),
        T_(deck.model.seq_len),
        slots_(pipeline_in_flight(kind_, layout.shape().pp, layout.pp_rank(), micro_batches_)),
        stage_(stage_params_, micro_batch_, T_, tp_, slots_, recompute_mode(deck)),
        runner_(stage_, *setup.source, layout.dp_rank() * (deck.train.batch_size / layout.shape().dp),
                micro_batch_, T_, slots_, stage_params_.spec().has_head),
        pipeline_(layout.pp_comm(), kind_, micro_batches_, micro_batch_ * T_ * deck.model.d_model,
                  trace),
        reducer_(layout.dp_comm(), pushed_blocks(), block_sizes(pushed_blocks())),
        service_(std::move(service)) {
    packed_.resize(static_cast<std::size_t>(reducer_.total_numel()));
    // PD: parameters stream through a bounded cache with prefetch; the baseline keeps its
    // whole stage resident.
    if (!layout.replicated()) {
      cache_ = std::make_unique<StageCache>(
          stage_params_, *service_, static_cast<std::int64_t>(deck.pd.cache_mb * 1048576.0),
          static_cast<int>(deck.pd.prefetch_depth), trace);
      step_plan_ = StageCache::step_plan(stage_params_, kind_, layout.shape().pp,
                                         layout.pp_rank(), micro_batches_);
    }
  }

  // Evaluation only: the mean loss of the initial parameters over eval_batches batches.
  TrainResult run_eval(std::int64_t batches) {
    TrainResult result;
    result.reporter = layout_.is_reporter();
    ensure_version(start_step_);
    const double loss = evaluate(batches);
    result.val_losses.push_back(loss);
    result.params_crc32c = service_->finish();
    if (result.reporter && opts_.verbose) {
      std::printf("eval batches=%lld tokens=%lld loss=%.9g params_crc32c=%08x\n",
                  static_cast<long long>(batches),
                  static_cast<long long>(batches * deck_.train.batch_size * T_), loss,
                  result.params_crc32c);
      std::fflush(stdout);
    }
    return result;
  }

  // The step loop. Step k computes on parameter version max(0, k-1-staleness): with
  // staleness 0 that is the version its previous step produced (exact synchronous training);
  // with s > 0 compute runs up to s steps ahead of the holders' updates.
  TrainResult run() {
    TrainResult result;
    result.reporter = layout_.is_reporter();
    if (result.reporter) open_outputs();
    const std::int64_t steps = deck_.run.steps, staleness = deck_.pd.staleness;
    // --stop-after ends the run early with a checkpoint; the schedule still targets run.steps.
    const std::int64_t last =
        opts_.stop_after > 0 ? std::min(steps, opts_.stop_after) : steps;
    const double tokens_per_step = static_cast<double>(deck_.train.batch_size * T_);
    const double t_start = now_seconds();
    double t_prev = t_start;
    std::int64_t k = start_step_;
    while (k < last) {
      ++k;
      StepRecord rec;
      rec.step = k;
      rec.fetch_ms = 1e3 * ensure_version(std::max(start_step_, k - 1 - staleness));
      forward_backward(k, rec);
      reduce_and_push(k, rec);
      rec.loss = reducer_.sum(runner_.loss_sum()) / tokens_per_step;
      if (eval_due(k)) {  // on exactly the parameters after step k
        rec.fetch_ms += 1e3 * ensure_version(k);
        rec.val_loss = evaluate(deck_.train.eval_batches);
      }
      const double t = now_seconds();
      rec.step_ms = 1e3 * (t - t_prev);
      rec.tokens_per_s = tokens_per_step / (t - t_prev);
      t_prev = t;
      result.losses.push_back(rec.loss);
      result.val_losses.push_back(rec.val_loss);
      pending_.push_back(rec);
      const double done = static_cast<double>(k - start_step_);
      if (result.reporter) report_known((t - t_start) / done * static_cast<double>(last - k));
      if (k < last && stop_requested()) {
        result.stopped = true;
        break;
      }
    }
    result.final_step = k;
    learn_updates(k);  // every update is known now
    if (result.reporter) report_known(0.0);
    result.params_crc32c = service_->finish();
    result.wall_seconds = now_seconds() - t_start;
    if (cache_) write_heat_map();
    if (result.reporter) print_final(result);
    return result;
  }

 private:
  // Blocks whose reduced gradient this rank's data-parallel group pushes: its stage's blocks,
  // less those replicated over the tensor-parallel group on tp ranks other than 0.
  std::vector<int> pushed_blocks() const {
    std::vector<int> out;
    for (int b : stage_params_.needed_blocks())
      if (stage_params_.pushes(setup_.catalog->block(b))) out.push_back(b);
    return out;
  }

  std::vector<std::int64_t> block_sizes(const std::vector<int>& blocks) const {
    std::vector<std::int64_t> n;
    for (int b : blocks) n.push_back(setup_.catalog->block(b).numel());
    return n;
  }

  // Makes `version` the parameters in use, fetching only if it is not already; returns the
  // seconds spent. With the PD cache the fetches happen during the passes that use them.
  double ensure_version(std::int64_t version) {
    if (cache_) {
      pass_version_ = version;
      return 0.0;
    }
    if (version == have_version_) return 0.0;
    const double t0 = now_seconds();
    fetch(version);
    have_version_ = version;
    return now_seconds() - t0;
  }

  // The holders' figures (gradient norm, lr) of every update up to `version` arrive with any
  // fetch of it: the baseline has them, a PD rank asks for one small block.
  void learn_updates(std::int64_t version) {
    if (!cache_) {
      ensure_version(version);
      return;
    }
    const std::vector<int>& blocks = stage_params_.needed_blocks();
    int smallest = blocks.front();
    for (int b : blocks)
      if (setup_.catalog->block(b).numel() < setup_.catalog->block(smallest).numel()) smallest = b;
    service_->fetch(version, {smallest}, [](int, const float*) {});
  }

  // Runs `body` as one pass of the PD cache over `plan` (the baseline just runs it); returns
  // the seconds the pass waited for parameters.
  template <class Body>
  double cache_pass(const std::vector<std::vector<int>>& plan, Body&& body) {
    if (!cache_) {
      body();
      return 0.0;
    }
    const double wait0 = cache_->stats().wait_seconds;
    cache_->begin(pass_version_, plan);
    body();
    cache_->end();
    const double waited = cache_->stats().wait_seconds - wait0;
    timers_.add("fetch", waited);
    return waited;
  }

  void write_heat_map() {
    const std::string dir = deck_.run.out_dir + "/pd_heat";
    std::filesystem::create_directories(dir);
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(layout_.world(), &rank));
    cache_->write_heat_map(dir + "/rank-" + std::to_string(rank) + ".csv");
  }

  UpdateInfo fetch(std::int64_t version) {
    ScopedPhase t(timers_, "fetch");
    TraceSpan span(trace_, "fetch v" + std::to_string(version), "pd");
    const ParamCatalog& cat = *setup_.catalog;
    return service_->fetch(version, stage_params_.needed_blocks(), [&](int id, const float* d) {
      stage_params_.unpack_param(cat.block(id), d);
    });
  }

  void forward_backward(std::int64_t step, StepRecord& rec) {
    ScopedPhase t(timers_, "compute");
    const double t0 = now_seconds();
    stage_params_.zero_grads();
    // The loss is the mean over every token of the global batch, so each micro-batch's and
    // each replica's gradient is a partial sum and they simply add.
    runner_.train(step, 1.0f / static_cast<float>(deck_.train.batch_size * T_));
    double waited = 0.0;
    const double fetch_wait =
        cache_pass(step_plan_, [&] { waited = pipeline_.run_step(runner_); });
    rec.fetch_ms += 1e3 * fetch_wait;
    const double elapsed = now_seconds() - t0;
    rec.compute_ms = 1e3 * (elapsed - fetch_wait);  // the wait is fetch_ms
    rec.bubble = mean_over_stages(elapsed > 0 ? waited / elapsed : 0.0);
  }

  // The measured bubble: the share of the pipeline phase each stage spent waiting for its
  // neighbours, averaged over the stages.
  double mean_over_stages(double x) {
    if (layout_.shape().pp == 1) return 0.0;
    MPI_Request r;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, layout_.pp_comm(), &r));
    wait_quietly(&r);
    return x / layout_.shape().pp;
  }

  void reduce_and_push(std::int64_t step, StepRecord& rec) {
    const double t0 = now_seconds();
    const ParamCatalog& cat = *setup_.catalog;
    float* p = packed_.data();
    for (int b : reducer_.blocks()) {
      stage_params_.pack_grad(cat.block(b), p);
      p += cat.block(b).numel();
    }
    const float* mine = reducer_.reduce_scatter(packed_.data());
    if (layout_.replicated()) reducer_.allgather(mine, packed_.data());
    const double t1 = now_seconds();
    rec.reduce_ms = 1e3 * (t1 - t0);
    timers_.add("reduce", t1 - t0);
    trace_event("reduce", "dp", t0, t1);
    if (layout_.replicated())
      service_->push(step, reducer_.blocks(), packed_.data());
    else
      service_->push(step, reducer_.my_blocks(), mine);
    const double t2 = now_seconds();
    rec.push_ms = 1e3 * (t2 - t1);
    timers_.add("push", t2 - t1);
    trace_event("push", "pd", t1, t2);
  }

  void trace_event(const char* name, const char* cat, double t0, double t1) {
    if (trace_) trace_->event(name, cat, t0, t1);
  }

  // Whether any rank (compute or, through its replies, holder) got SIGTERM/SIGUSR1: all compute
  // ranks agree, so they all end after the same step.
  bool stop_requested() {
    int stop = stop_signal_received() || service_->holders_asked_to_stop() ? 1 : 0;
    MPI_Request r;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, layout_.compute_comm(), &r));
    wait_quietly(&r);
    return stop != 0;
  }

  bool eval_due(std::int64_t s) const {
    const std::int64_t every = deck_.train.eval_every;
    return s == deck_.run.steps || (every > 0 && s % every == 0);
  }

  // Mean loss over the first eval_batches validation batches, each split over the replicas and
  // into micro-batches, run forward through the pipeline.
  double evaluate(std::int64_t batches) {
    ScopedPhase t(timers_, "eval");
    TraceSpan span(trace_, "eval", "compute");
    runner_.eval(micro_batches_, deck_.train.batch_size);
    const int forwards = static_cast<int>(batches) * micro_batches_;
    cache_pass(cache_ ? StageCache::eval_plan(stage_params_, forwards)
                      : std::vector<std::vector<int>>{},
               [&] { pipeline_.run_forward(runner_, forwards); });
    const double tokens = static_cast<double>(batches * deck_.train.batch_size * T_);
    return reducer_.sum(runner_.loss_sum()) / tokens;
  }

  void open_outputs() {
    metrics_ = std::make_unique<MetricsWriter>(deck_.run.out_dir + "/metrics.csv", start_step_);
    if (!opts_.verbose) return;
    const ModelShape& m = setup_.catalog->shape();
    const LayoutShape& ls = layout_.shape();
    std::printf("pdtrain %s | %s | %d ranks: %d holder(s) + %d compute (dp %d x pp %d x tp %d)%s\n",
                PDTRAIN_VERSION, deck_.source_name.c_str(), ls.world(), ls.holders, ls.compute(),
                ls.dp, ls.pp, ls.tp,
                layout_.replicated() ? " | replicated baseline" : " | parameter/compute decoupled");
    std::printf("model: GPT-2 %lld layers, d_model %lld, %lld heads, vocab %lld (padded %lld), "
                "seq %lld | %lld parameters | batch %lld x %lld tokens",
                static_cast<long long>(m.n_layer), static_cast<long long>(m.d_model),
                static_cast<long long>(m.n_head), static_cast<long long>(m.vocab_size),
                static_cast<long long>(m.padded_vocab), static_cast<long long>(m.seq_len),
                static_cast<long long>(setup_.catalog->total_numel()),
                static_cast<long long>(deck_.train.batch_size), static_cast<long long>(T_));
    if (ls.pp > 1)
      std::printf(" | %d micro-batches, %s schedule", micro_batches_, to_string(kind_));
    if (deck_.train.precision == "bf16")
      std::printf(" | bf16 matmuls (fp32 accumulation, fp32 master weights)");
    if (!layout_.replicated()) {
      const WireCodec f = fetch_codec(deck_);
      const WireCodec p = *wire_codec_from_string(deck_.pd.push_codec);
      std::printf("\nwire: fetch %s, push %s%s", to_string(f), to_string(p),
                  deck_.train.precision == "bf16" && !is_lossy(p)
                      ? " (bf16 precision: holders serve bf16 copies of fp32 masters)"
                  : is_lossy(f) || is_lossy(p)
                      ? " | LOSSY: numerics differ from exact synchronous training"
                      : " (lossless)");
    }
    std::printf("\ndata: %s\n", setup_.source->describe().c_str());
    std::printf("output: %s\n", deck_.run.out_dir.c_str());
    std::fflush(stdout);
  }

  // Reports, in step order, the records whose update (gradient norm, lr) is known.
  void report_known(double eta) {
    while (!pending_.empty()) {
      const auto info = service_->update_info(pending_.front().step);
      if (!info) break;
      pending_.front().grad_norm = info->grad_norm;
      pending_.front().lr = info->lr;
      report(pending_.front(), eta);
      pending_.pop_front();
    }
  }

  void report(const StepRecord& rec, double eta) {
    metrics_->append(rec);
    const bool last = rec.step == deck_.run.steps;
    if (opts_.verbose && (rec.step % deck_.run.log_every == 0 || last || rec.step == 1)) {
      std::printf("%s\n", format_step_line(rec, deck_.run.steps, eta).c_str());
      std::fflush(stdout);
    }
  }

  void print_final(const TrainResult& r) {
    if (!opts_.verbose) return;
    const double tokens =
        static_cast<double>((r.final_step - start_step_) * deck_.train.batch_size * T_);
    std::printf("summary: wall %.2f s | %.0f tok/s | fetch %.2f s | compute %.2f s | "
                "reduce %.2f s | push %.2f s | eval %.2f s | fetched %s | pushed %s\n",
                r.wall_seconds, tokens / r.wall_seconds, timers_.get("fetch"),
                timers_.get("compute"), timers_.get("reduce"), timers_.get("push"),
                timers_.get("eval"),
                human_bytes(static_cast<double>(service_->bytes_fetched())).c_str(),
                human_bytes(static_cast<double>(service_->bytes_pushed())).c_str());
    if (cache_)
      std::printf("%s (this rank; per-block table in %s/pd_heat/)\n",
                  cache_->summary(timers_.get("compute")).c_str(), deck_.run.out_dir.c_str());
    if (r.losses.empty()) return;
    if (r.final_step < deck_.run.steps)
      std::printf("stopped after step %lld of %lld: checkpoint written; continue with "
                  "--restart auto\n",
                  static_cast<long long>(r.final_step), static_cast<long long>(deck_.run.steps));
    std::printf("final step=%lld loss=%.9g params_crc32c=%08x\n",
                static_cast<long long>(r.final_step), r.losses.back(), r.params_crc32c);
    std::fflush(stdout);
  }

  const Deck& deck_;
  const Setup& setup_;
  const Layout& layout_;
  RunOptions opts_;
  TraceRecorder* trace_;
  std::int64_t start_step_;
  TensorParallelGroup tp_;
  StageParams stage_params_;
  int micro_batches_;
  PipelineKind kind_;
  std::int64_t micro_batch_, T_;
  int slots_;
  GptStage stage_;
  StageRunner runner_;
  PipelineExecutor pipeline_;
  GradReducer reducer_;
  std::unique_ptr<ParameterService> service_;
  std::unique_ptr<StageCache> cache_;        // PD only
  std::vector<std::vector<int>> step_plan_;  // the cache's uses in one step
  std::int64_t pass_version_ = 0;            // the version the next pass computes on
  std::vector<float> packed_;
  std::unique_ptr<MetricsWriter> metrics_;
  PhaseTimers timers_;
  std::int64_t have_version_ = -1;  // parameter version unpacked in stage_params_
  std::deque<StepRecord> pending_;  // records waiting for their update's figures
};

void write_resolved_deck(const Deck& deck) {
  std::filesystem::create_directories(deck.run.out_dir);
  std::ofstream f(deck.run.out_dir + "/deck.resolved.toml");
  f << deck.resolved_toml();
  if (!f) throw Error(ExitCode::runtime, "cannot write " + deck.run.out_dir + "/deck.resolved.toml");
}

// OUT/trace/rank-<r>.json from every rank, then OUT/trace/trace.json merged by rank 0.
void write_traces(const Deck& deck, const TraceRecorder& trace, MPI_Comm world) {
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &size));
  const std::string dir = deck.run.out_dir + "/trace";
  std::filesystem::create_directories(dir);
  trace.write(dir + "/rank-" + std::to_string(rank) + ".json");
  MPI_CHECK(MPI_Barrier(world));
  if (rank != 0) return;
  std::vector<std::string> files;
  for (int r = 0; r < size; ++r) files.push_back(dir + "/rank-" + std::to_string(r) + ".json");
  TraceRecorder::merge(files, dir + "/trace.json");
}

std::string layout_text(const LayoutShape& s) {
  return "holders=" + std::to_string(s.holders) + " dp=" + std::to_string(s.dp) +
         " tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp);
}

std::unique_ptr<ckpt::CheckpointWriter> make_writer(const Deck& deck, const ParamCatalog& cat,
                                                    MPI_Comm comm) {
  std::filesystem::create_directories(deck.checkpoint.dir);
  return std::make_unique<ckpt::CheckpointWriter>(
      comm, cat, ckpt::parse_codec(deck.checkpoint.codec),
      static_cast<int>(deck.checkpoint.anchor_every), deck.checkpoint.dir,
      static_cast<int>(deck.checkpoint.keep));
}

// Loads the restart state into `target` (a holder's server or a baseline replica) for the
// blocks it owns, reading collectively over `comm`; ranks with nothing to load pass a null
// target and MPI_COMM_NULL. A damaged checkpoint is one error for the whole job.
template <class Target>
void restore_collectively(const RestartPoint& rp, const ParamCatalog& cat, MPI_Comm comm,
                          MPI_Comm world, Target* target) {
  if (rp.path.empty()) return;
  run_collectively(world, ErrorScope::job, [&] {
    if (!target) return;
    std::vector<int> ids;
    for (const auto& [id, state] : target->owned_blocks()) ids.push_back(id);
    target->restore(rp.version, read_restart_state(rp, cat, comm, ids));
  });
}

}  // namespace

// The run's communicator: the job's ranks in PD order (see spread_holders), freed at the end.
class OrderedComm {
 public:
  OrderedComm(MPI_Comm job, const std::vector<int>& job_rank) {
    int me = 0;
    MPI_CHECK(MPI_Comm_rank(job, &me));
    const int key = static_cast<int>(std::find(job_rank.begin(), job_rank.end(), me) -
                                     job_rank.begin());
    MPI_CHECK(MPI_Comm_split(job, 0, key, &comm_));
  }
  ~OrderedComm() { MPI_Comm_free(&comm_); }
  OrderedComm(const OrderedComm&) = delete;
  OrderedComm& operator=(const OrderedComm&) = delete;
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

TrainResult run_training(const Deck& deck, MPI_Comm job, const RunOptions& opts) {
  Setup setup;
  run_collectively(job, ErrorScope::job, [&] {
    setup = make_setup(deck, job, opts.eval_batches > 0);
    int job_rank = 0;
    MPI_CHECK(MPI_Comm_rank(job, &job_rank));
    if (job_rank == 0 && !opts.dry_run && opts.eval_batches == 0) write_resolved_deck(deck);
  });
  const OrderedComm ordered(job, setup.job_rank);
  const MPI_Comm world = ordered.get();
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  Layout layout(setup.shape, world);
  if (opts.dry_run) {
    if (rank == 0) print_dry_run(deck, setup, layout);
    return {};
  }
  if (rank == 0 && opts.verbose) {
    const std::string hint = kernels::blas_misdetection_hint();
    if (!hint.empty()) std::printf("hint: %s\n", hint.c_str());
  }
  // One epoch for every rank's trace, so the timelines line up in the merged file.
  double epoch = now_seconds();
  MPI_CHECK(MPI_Bcast(&epoch, 1, MPI_DOUBLE, 0, world));
  TraceRecorder trace;
  if (deck.output.trace)
    trace = TraceRecorder(rank, layout.is_holder() ? "holder" : "compute", epoch);
  const RestartPoint restart = resolve_restart(deck, opts.restart, world);
  const std::int64_t tokens_per_step = deck.train.batch_size * deck.model.seq_len;
  const bool training = opts.eval_batches == 0;
  TrainResult result;
  if (layout.is_holder()) {
    HolderServer server(layout, setup.table, setup.owner,
                        push_contributions(*setup.catalog, setup.shape.pp), adamw_config(deck),
                        fetch_codec(deck),
                        *wire_codec_from_string(deck.pd.push_codec),
                        static_cast<int>(deck.pd.staleness), &trace);
    server.set_verbose(opts.verbose && training);
    setup.table.init = nullptr;  // frees an llm.c file read for initialization
    restore_collectively(restart, *setup.catalog, layout.holders_comm(), world, &server);
    std::unique_ptr<ckpt::CheckpointWriter> writer;
    if (training) {
      writer = make_writer(deck, *setup.catalog, layout.holders_comm());
      server.set_hooks(checkpoint_hooks(*writer, deck, layout_text(setup.shape), tokens_per_step,
                                        opts.verbose && layout.holder_index() == 0));
    }
    server.run();
  } else {
    std::unique_ptr<ParameterService> service;
    std::unique_ptr<ckpt::CheckpointWriter> writer;
    if (layout.replicated()) {
      auto replica = std::make_unique<LocalReplica>(setup.table, adamw_config(deck));
      restore_collectively(restart, *setup.catalog, MPI_COMM_SELF, world, replica.get());
      if (training && layout.compute_index() == 0) {  // one replica writes for all
        writer = make_writer(deck, *setup.catalog, MPI_COMM_SELF);
        replica->set_hooks(checkpoint_hooks(*writer, deck, layout_text(setup.shape),
                                            tokens_per_step, opts.verbose));
      }
      service = std::move(replica);
    } else {
      restore_collectively(restart, *setup.catalog, MPI_COMM_NULL, world,
                           static_cast<HolderServer*>(nullptr));
      service = std::make_unique<FetchClient>(layout, setup.table, setup.owner,
                                              fetch_codec(deck),
                                              *wire_codec_from_string(deck.pd.push_codec),
                                              deck.pd.fetch_thread);
    }
    ComputeLoop loop(deck, setup, layout, opts, std::move(service), restart.step, &trace);
    setup.table.init = nullptr;
    result = training ? loop.run() : loop.run_eval(opts.eval_batches);
  }
  if (deck.output.trace) write_traces(deck, trace, world);
  return result;
}

}  // namespace pdtrain
