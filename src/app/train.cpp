// The training run: set-up shared by every rank, then the holders' server loop or the compute
// ranks' step loop. The step loop reads like the algorithm:
//   fetch parameters of version s-1 -> forward/backward on this replica's slice of batch s
//   -> reduce gradients over replicas in a fixed order -> push -> (report step s-1's record)
#include "pdtrain/app/train.hpp"

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/data/token_source.hpp"
#include "pdtrain/io/metrics.hpp"
#include "pdtrain/kernels/blas_runtime.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/optim/adamw.hpp"
#include "pdtrain/pd/holder_server.hpp"
#include "pdtrain/pd/local_replica.hpp"
#include "pdtrain/pd/remote_holders.hpp"
#include "pdtrain/schedule/grad_reduce.hpp"
#include "pdtrain/version.hpp"

namespace pdtrain {

void rethrow_collectively(MPI_Comm comm, const Error* local) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int mine = local ? rank : INT32_MAX, first = INT32_MAX;
  MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT32_MAX) return;
  int code = local ? static_cast<int>(local->code()) : 0;
  std::string msg = local ? local->what() : "";
  int len = static_cast<int>(msg.size());
  MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, first, comm));
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, first, comm));
  msg.resize(static_cast<std::size_t>(len));
  MPI_CHECK(MPI_Bcast(msg.data(), len, MPI_CHAR, first, comm));
  throw Error(static_cast<ExitCode>(code), msg);
}

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

BlockTable block_table(const ParamCatalog& cat, const Deck& d) {
  BlockTable t;
  for (const BlockInfo& b : cat.blocks())
    t.blocks.push_back(BlockDesc{b.numel(), cat.tensor(b.tensor).weight_decay, cat.block_name(b)});
  const double init_std = d.model.init_std;
  const auto seed = static_cast<std::uint64_t>(d.run.seed);
  t.init = [&cat, init_std, seed](int id, float* out) {
    cat.init_block(cat.block(id), init_std, seed, out);
  };
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
  std::unique_ptr<data::TokenSource> source;
};

Setup make_setup(const Deck& deck, MPI_Comm world) {
  int world_size = 0;
  MPI_CHECK(MPI_Comm_size(world, &world_size));
  Setup s;
  s.shape = resolve_layout(deck, world_size);
  s.catalog = std::make_unique<ParamCatalog>(resolve_model_shape(deck.model));
  s.table = block_table(*s.catalog, deck);
  if (s.shape.holders > 0) {
    std::vector<std::int64_t> bytes;
    for (const BlockInfo& b : s.catalog->blocks()) bytes.push_back(b.bytes());
    s.owner = place_blocks(bytes, s.shape.holders);
  }
  // Every rank opens the data so that a bad file is one collective error, not a hang.
  s.source = data::make_token_source(source_spec(deck));
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

void print_dry_run(const Deck& deck, const Setup& s, const Layout& layout) {
  const ParamCatalog& cat = *s.catalog;
  std::printf("pdtrain %s dry run: %d ranks = %d holder(s) + dp %d x pp %d x tp %d compute\n",
              PDTRAIN_VERSION, s.shape.world(), s.shape.holders, s.shape.dp, s.shape.pp,
              s.shape.tp);
  std::printf("model: %lld parameters in %zu blocks (%s)\n",
              static_cast<long long>(cat.total_numel()), cat.blocks().size(),
              human_bytes(static_cast<double>(cat.total_numel()) * 4).c_str());
  for (int r = 0; r < s.shape.world(); ++r) {
    std::printf("  %s", layout.describe_rank(r).c_str());
    if (r < s.shape.holders) {
      std::int64_t n = 0, bytes = 0;
      for (std::size_t b = 0; b < s.owner.size(); ++b)
        if (s.owner[b] == r) ++n, bytes += cat.block(static_cast<int>(b)).bytes();
      std::printf(": %lld blocks, %s params + %s AdamW state\n", static_cast<long long>(n),
                  human_bytes(static_cast<double>(bytes)).c_str(),
                  human_bytes(2.0 * static_cast<double>(bytes)).c_str());
    } else {
      const double p = static_cast<double>(cat.total_numel()) * 4;
      const std::int64_t B = deck.train.batch_size / s.shape.dp;
      std::printf(": layers 0..%lld, fetches %zu blocks (%s), micro-batch %lld x %lld, "
                  "resident params+grads %s%s\n",
                  static_cast<long long>(deck.model.n_layer - 1), cat.blocks().size(),
                  human_bytes(p).c_str(), static_cast<long long>(B),
                  static_cast<long long>(deck.model.seq_len), human_bytes(2 * p).c_str(),
                  s.shape.holders == 0 ? (" + AdamW " + human_bytes(2 * p)).c_str() : "");
    }
  }
}

// The compute ranks' step loop.
class ComputeLoop {
 public:
  ComputeLoop(const Deck& deck, const Setup& setup, const Layout& layout, const RunOptions& opts)
      : deck_(deck), setup_(setup), layout_(layout), opts_(opts),
        stage_params_(*setup.catalog, StageSpec{0, deck.model.n_layer, true, true, 1, 0}),
        local_batch_(deck.train.batch_size / layout.shape().dp),
        T_(deck.model.seq_len),
        stage_(stage_params_, local_batch_, T_, no_tp_),
        reducer_(layout.dp_comm(), stage_params_.needed_blocks(), block_sizes()) {
    if (layout.replicated())
      service_ = std::make_unique<LocalReplica>(setup.table, adamw_config(deck));
    else
      service_ = std::make_unique<RemoteHolders>(layout, setup.table, setup.owner);
    packed_.resize(static_cast<std::size_t>(reducer_.total_numel()));
    seq_.resize(static_cast<std::size_t>(local_batch_ * (T_ + 1)));
    inputs_.resize(static_cast<std::size_t>(local_batch_ * T_));
    targets_.resize(inputs_.size());
  }

  TrainResult run() {
    TrainResult result;
    result.reporter = layout_.is_reporter();
    if (result.reporter) open_outputs();
    const std::int64_t steps = deck_.run.steps;
    const double t_start = now_seconds();
    fetch(0);
    double t_prev = now_seconds();
    for (std::int64_t s = 1; s <= steps; ++s) {
      StepRecord rec;
      rec.step = s;
      const double loss_sum = forward_backward(s, rec);
      reduce_and_push(s, rec);
      rec.loss = reducer_.sum(loss_sum) / static_cast<double>(deck_.train.batch_size * T_);
      const double t_fetch = now_seconds();
      const UpdateInfo info = fetch(s);  // parameters after step s
      rec.fetch_ms += 1e3 * (now_seconds() - t_fetch);
      rec.lr = info.lr;
      rec.grad_norm = info.grad_norm;
      if (eval_due(s)) rec.val_loss = evaluate();
      const double t = now_seconds();
      rec.step_ms = 1e3 * (t - t_prev);
      rec.tokens_per_s = static_cast<double>(deck_.train.batch_size * T_) / (t - t_prev);
      t_prev = t;
      if (result.reporter) report(rec, (t - t_start) / static_cast<double>(s) * (steps - s));
      result.losses.push_back(rec.loss);
      result.val_losses.push_back(rec.val_loss);
    }
    result.params_crc32c = service_->finish();
    result.wall_seconds = now_seconds() - t_start;
    if (result.reporter) print_final(result);
    return result;
  }

 private:
  std::vector<std::int64_t> block_sizes() const {
    std::vector<std::int64_t> n;
    for (int b : stage_params_.needed_blocks()) n.push_back(setup_.catalog->block(b).numel());
    return n;
  }

  UpdateInfo fetch(std::int64_t version) {
    ScopedPhase t(timers_, "fetch");
    const ParamCatalog& cat = *setup_.catalog;
    return service_->fetch(version, stage_params_.needed_blocks(), [&](int id, const float* d) {
      stage_params_.unpack_param(cat.block(id), d);
    });
  }

  // Splits `count` sequences of seq_len+1 tokens into inputs and targets.
  void split_sequences() {
    for (std::int64_t b = 0; b < local_batch_; ++b)
      for (std::int64_t t = 0; t < T_; ++t) {
        inputs_[b * T_ + t] = seq_[b * (T_ + 1) + t];
        targets_[b * T_ + t] = seq_[b * (T_ + 1) + t + 1];
      }
  }

  double forward_backward(std::int64_t step, StepRecord& rec) {
    ScopedPhase t(timers_, "compute");
    const double t0 = now_seconds();
    setup_.source->train_sequences(step, layout_.dp_rank() * local_batch_, local_batch_,
                                   seq_.data());
    split_sequences();
    stage_params_.zero_grads();
    const double loss = stage_.forward(0, inputs_.data(), nullptr, targets_.data());
    // The loss is the mean over every token of the global batch, so each replica's gradient
    // is a partial sum and replicas' gradients simply add.
    stage_.backward(0, 1.0f / static_cast<float>(deck_.train.batch_size * T_), nullptr);
    rec.compute_ms = 1e3 * (now_seconds() - t0);
    return loss;
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
    if (layout_.replicated())
      service_->push(step, reducer_.blocks(), packed_.data());
    else
      service_->push(step, reducer_.my_blocks(), mine);
    rec.push_ms = 1e3 * (now_seconds() - t1);
    timers_.add("push", now_seconds() - t1);
  }

  bool eval_due(std::int64_t s) const {
    const std::int64_t every = deck_.train.eval_every;
    return s == deck_.run.steps || (every > 0 && s % every == 0);
  }

  // Mean loss over the first eval_batches validation batches, each split over the replicas.
  double evaluate() {
    ScopedPhase t(timers_, "eval");
    double sum = 0.0;
    for (std::int64_t b = 0; b < deck_.train.eval_batches; ++b) {
      setup_.source->val_sequences(b, deck_.train.batch_size, layout_.dp_rank() * local_batch_,
                                   local_batch_, seq_.data());
      split_sequences();
      sum += stage_.forward(0, inputs_.data(), nullptr, targets_.data());
    }
    const double tokens =
        static_cast<double>(deck_.train.eval_batches * deck_.train.batch_size * T_);
    return reducer_.sum(sum) / tokens;
  }

  void open_outputs() {
    metrics_ = std::make_unique<MetricsWriter>(deck_.run.out_dir + "/metrics.csv");
    if (!opts_.verbose) return;
    const ModelShape& m = setup_.catalog->shape();
    std::printf("pdtrain %s | %s | %d ranks: %d holder(s) + %d compute (dp %d)%s\n",
                PDTRAIN_VERSION, deck_.source_name.c_str(), layout_.shape().world(),
                layout_.shape().holders, layout_.shape().compute(), layout_.shape().dp,
                layout_.replicated() ? " | replicated baseline" : " | parameter/compute decoupled");
    std::printf("model: GPT-2 %lld layers, d_model %lld, %lld heads, vocab %lld (padded %lld), "
                "seq %lld | %lld parameters | batch %lld x %lld tokens\n",
                static_cast<long long>(m.n_layer), static_cast<long long>(m.d_model),
                static_cast<long long>(m.n_head), static_cast<long long>(m.vocab_size),
                static_cast<long long>(m.padded_vocab), static_cast<long long>(m.seq_len),
                static_cast<long long>(setup_.catalog->total_numel()),
                static_cast<long long>(deck_.train.batch_size), static_cast<long long>(T_));
    std::printf("data: %s\n", setup_.source->describe().c_str());
    std::printf("output: %s\n", deck_.run.out_dir.c_str());
    std::fflush(stdout);
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
    const double tokens = static_cast<double>(deck_.run.steps * deck_.train.batch_size * T_);
    std::printf("summary: wall %.2f s | %.0f tok/s | fetch %.2f s | compute %.2f s | "
                "reduce %.2f s | push %.2f s | eval %.2f s | fetched %s | pushed %s\n",
                r.wall_seconds, tokens / r.wall_seconds, timers_.get("fetch"),
                timers_.get("compute"), timers_.get("reduce"), timers_.get("push"),
                timers_.get("eval"),
                human_bytes(static_cast<double>(service_->bytes_fetched())).c_str(),
                human_bytes(static_cast<double>(service_->bytes_pushed())).c_str());
    std::printf("final step=%lld loss=%.9g params_crc32c=%08x\n",
                static_cast<long long>(deck_.run.steps), r.losses.back(), r.params_crc32c);
    std::fflush(stdout);
  }

  const Deck& deck_;
  const Setup& setup_;
  const Layout& layout_;
  RunOptions opts_;
  NoTensorParallel no_tp_;
  StageParams stage_params_;
  std::int64_t local_batch_, T_;
  GptStage stage_;
  GradReducer reducer_;
  std::unique_ptr<ParameterService> service_;
  std::vector<float> packed_;
  std::vector<std::int32_t> seq_, inputs_, targets_;
  std::unique_ptr<MetricsWriter> metrics_;
  PhaseTimers timers_;
};

void write_resolved_deck(const Deck& deck) {
  std::filesystem::create_directories(deck.run.out_dir);
  std::ofstream f(deck.run.out_dir + "/deck.resolved.toml");
  f << deck.resolved_toml();
  if (!f) throw Error(ExitCode::runtime, "cannot write " + deck.run.out_dir + "/deck.resolved.toml");
}

}  // namespace

TrainResult run_training(const Deck& deck, MPI_Comm world, const RunOptions& opts) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  Setup setup;
  {
    std::unique_ptr<Error> err;
    try {
      setup = make_setup(deck, world);
      if (rank == 0 && !opts.dry_run) write_resolved_deck(deck);
    } catch (const Error& e) {
      err = std::make_unique<Error>(e);
    }
    rethrow_collectively(world, err.get());
  }
  Layout layout(setup.shape, world);
  if (opts.dry_run) {
    if (rank == 0) print_dry_run(deck, setup, layout);
    return {};
  }
  if (rank == 0 && opts.verbose) {
    const std::string hint = kernels::blas_misdetection_hint();
    if (!hint.empty()) std::printf("hint: %s\n", hint.c_str());
  }
  if (layout.is_holder()) {
    HolderServer server(layout, setup.table, setup.owner,
                        std::vector<int>(setup.catalog->blocks().size(), 1), adamw_config(deck));
    server.run();
    return {};
  }
  ComputeLoop loop(deck, setup, layout, opts);
  return loop.run();
}

}  // namespace pdtrain
