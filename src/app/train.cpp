// The training run: set-up shared by every rank, then the holders' server loop or the compute
// ranks' step loop (app/compute_loop.cpp). What every rank builds alike is in app/setup.cpp;
// what the run prints is in app/report.cpp.
#include "pdtrain/app/train.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "pdtrain/app/checkpointing.hpp"
#include "pdtrain/app/compute_comms.hpp"
#include "pdtrain/app/model_init.hpp"
#include "pdtrain/app/sample.hpp"
#include "pdtrain/app/trajectories.hpp"
#include "pdtrain/app/compute_device.hpp"
#include "pdtrain/app/compute_loop.hpp"
#include "pdtrain/app/report.hpp"
#include "pdtrain/app/setup.hpp"
#include "pdtrain/core/agreement.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/io/output_file.hpp"
#include "pdtrain/io/run_lock.hpp"
#include "pdtrain/io/trace.hpp"
#include "pdtrain/kernels/blas_runtime.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/pd/fetch_client.hpp"
#include "pdtrain/pd/holder_server.hpp"
#include "pdtrain/pd/device_replica.hpp"

namespace pdtrain {

namespace {

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

// Defined below, in the order run_training() uses them.
std::vector<std::unique_ptr<RunLock>> lock_output_dirs(const Deck& deck);
void write_resolved_deck(const Deck& deck);
void verify_restart_point(const RestartPoint& rp, const ParamCatalog& cat, MPI_Comm world);
TraceRecorder trace_recorder(const Deck& deck, const Layout& layout);
void zeros_until_restored(BlockTable& table);
std::unique_ptr<SharedSegments> share_holder_blocks(const Deck& deck, const Setup& setup,
                                                    const Layout& layout, bool verbose);
std::string serve_parameters(const Deck& deck, Setup& setup, const Layout& layout,
                             const RunOptions& opts, const RestartPoint& restart,
                             const SharedSegments* segments, TraceRecorder* trace);
TrainResult run_compute_rank(const Deck& deck, Setup& setup, const Layout& layout,
                             const RunOptions& opts, const RestartPoint& restart,
                             kernels::ComputeBackend& backend, const CommChoice& comm,
                             const SharedSegments* segments, TraceRecorder* trace);
void write_traces(const Deck& deck, const TraceRecorder& trace, MPI_Comm world);
// One training run, the divergence guard's rewind between runs.
TrainResult train_once(const Deck& deck, MPI_Comm job, const RunOptions& opts,
                       std::int64_t* diverged_step);
void rewind(Deck& deck, RunOptions& opts, const Error& divergence, std::int64_t diverged_step,
            std::int64_t rewinds, MPI_Comm job);

}  // namespace

// With train.on_divergence = rewind, a diverged run (it ended in order, having applied and
// checkpointed nothing of the diverged step) is run again from the newest valid checkpoint
// before that step, with a lower learning rate and the step's batch skipped: all of it follows
// from the deck, so a rewound run is reproducible.
TrainResult run_training(const Deck& deck, MPI_Comm job, const RunOptions& opts) {
  Deck d;
  run_collectively(job, ErrorScope::job, [&] { d = with_model_of_init(deck); });
  RunOptions o = opts;
  for (std::int64_t rewinds = 0;; ++rewinds) {
    std::int64_t diverged_step = 0;
    try {
      return train_once(d, job, o, &diverged_step);
    } catch (const Error& e) {
      if (e.code() != ExitCode::diverged || d.train.on_divergence != "rewind" ||
          rewinds == d.train.max_rewinds)
        throw;
      rewind(d, o, e, diverged_step, rewinds + 1, job);
    }
  }
}

std::int64_t batch_of_step(std::int64_t step, const std::vector<std::int64_t>& skipped) {
  std::int64_t batch = step;
  for (std::int64_t s : skipped)
    if (s <= batch) ++batch;
  return batch;
}

namespace {

TrainResult train_once(const Deck& deck, MPI_Comm job, const RunOptions& opts,
                       std::int64_t* diverged_step) {
  Setup setup;
  std::vector<std::unique_ptr<RunLock>> locks;  // held until the run returns
  run_collectively(job, ErrorScope::job, [&] {
    setup = make_setup(deck, job, opts.eval_batches > 0);
    int job_rank = 0;
    MPI_CHECK(MPI_Comm_rank(job, &job_rank));
    if (job_rank == 0 && !opts.dry_run && opts.eval_batches == 0) {
      locks = lock_output_dirs(deck);  // before anything is written there
      write_resolved_deck(deck);
    }
  });
  const OrderedComm ordered(job, setup.job_rank);
  const MPI_Comm world = ordered.get();
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  Layout layout(setup.shape, world);
  const RestartPoint restart = resolve_restart(deck, opts.restart, world);
  if (opts.dry_run) {
    verify_restart_point(restart, *setup.catalog, world);
    if (rank == 0) print_dry_run(deck, setup, layout);
    return {};
  }
  if (rank == 0 && opts.verbose) {
    const std::string hint = kernels::blas_misdetection_hint();
    if (!hint.empty()) std::printf("hint: %s\n", hint.c_str());
  }
  // Compute ranks take their device (a GPU, or the CPU) and see whether NCCL can serve them;
  // one that cannot do what the deck asks ends the whole job. Then all agree on the transport.
  kernels::ComputeBackend backend;
  std::string why_not_nccl;
  run_collectively(world, ErrorScope::job, [&] {
    if (!layout.is_holder()) backend = make_compute_backend(deck, setup, layout);
  });
  const std::string gpu_shared = gpu_sharing_on_node(setup, layout, backend.gpu_uuid);
  run_collectively(world, ErrorScope::job, [&] {
    if (!layout.is_holder()) why_not_nccl = nccl_unavailable_here(deck, gpu_shared);
  });
  const CommChoice comm = agree_on_comm(deck, layout, why_not_nccl);
  TraceRecorder trace = trace_recorder(deck, layout);
  TrainResult result;
  if (!restart.path.empty()) zeros_until_restored(setup.table);
  std::unique_ptr<SharedSegments> segments =
      share_holder_blocks(deck, setup, layout, opts.verbose && opts.eval_batches == 0);
  if (layout.is_holder())
    result.divergence = serve_parameters(deck, setup, layout, opts, restart, segments.get(), &trace);
  else
    result = run_compute_rank(deck, setup, layout, opts, restart, backend, comm, segments.get(),
                              &trace);
  segments.reset();  // collective over each node: every rank is here, none reads them any more
  if (deck.output.trace) write_traces(deck, trace, world);
  // A diverged run ended in order: every rank learns the step, and the job ends (or rewinds)
  // with the lowest rank's account (a holder's names the block, a compute rank's the loss).
  std::int64_t earliest = result.diverged_step > 0 ? result.diverged_step : INT64_MAX;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &earliest, 1, MPI_INT64_T, MPI_MIN, world));
  *diverged_step = earliest == INT64_MAX ? 0 : earliest;
  run_collectively(world, ErrorScope::job, [&] {
    if (!result.divergence.empty()) throw Error(ExitCode::diverged, result.divergence);
  });
  return result;
}

// Collective over `job`: the next run after a divergence at `diverged_step` starts from the
// newest valid checkpoint before it (step 0 when there is none), with the learning rate
// lowered and the batch that step trained on skipped; rank 0 logs it.
void rewind(Deck& deck, RunOptions& opts, const Error& divergence, std::int64_t diverged_step,
            std::int64_t rewinds, MPI_Comm job) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(job, &rank));
  std::string from;
  if (rank == 0 && std::filesystem::is_directory(deck.checkpoint.dir))
    from = ckpt::find_latest_valid(deck.checkpoint.dir, true, diverged_step).path;
  broadcast_string(job, from);
  opts.restart = from.empty() ? "fresh" : from;
  deck.optimizer.lr *= deck.train.rewind_lr_factor;
  deck.optimizer.min_lr *= deck.train.rewind_lr_factor;
  const std::int64_t batch = batch_of_step(diverged_step, opts.skipped_batches);
  opts.skipped_batches.push_back(batch);
  std::sort(opts.skipped_batches.begin(), opts.skipped_batches.end());
  if (rank == 0) {
    std::printf("rewind %lld of %lld: %s\nrewind: from %s with optimizer.lr %g (x%g), "
                "skipping batch %lld (the one step %lld trained on)\n",
                static_cast<long long>(rewinds), static_cast<long long>(deck.train.max_rewinds),
                divergence.what(), from.empty() ? "step 0" : from.c_str(), deck.optimizer.lr,
                deck.train.rewind_lr_factor, static_cast<long long>(batch),
                static_cast<long long>(diverged_step));
    std::fflush(stdout);
  }
}

// Whether `dir` is `top` or lies below it (the default checkpoint.dir, OUT/checkpoints); false
// when either cannot be resolved, so that both get locked.
bool lies_within(const std::string& dir, const std::string& top) {
  namespace fs = std::filesystem;
  std::error_code e1, e2;
  const fs::path d = fs::weakly_canonical(dir, e1), t = fs::weakly_canonical(top, e2);
  if (e1 || e2) return false;
  const fs::path rel = d.lexically_relative(t);
  return !rel.empty() && *rel.begin() != "..";
}

// One run per directory (io/run_lock): run.out_dir, and checkpoint.dir when it lies elsewhere
// (two runs with their own out_dir may share one). A lock left by a dead run is taken over.
std::vector<std::unique_ptr<RunLock>> lock_output_dirs(const Deck& deck) {
  std::vector<std::unique_ptr<RunLock>> locks;
  const auto lock = [&locks](const std::string& dir, const char* key) {
    create_output_directory(dir);
    std::string notice;
    locks.push_back(RunLock::acquire(dir, key, &notice));
    if (!notice.empty()) std::fprintf(stderr, "pdtrain: warning: %s\n", notice.c_str());
  };
  lock(deck.run.out_dir, "run.out_dir");
  if (!lies_within(deck.checkpoint.dir, deck.run.out_dir)) lock(deck.checkpoint.dir, "checkpoint.dir");
  return locks;
}

void write_resolved_deck(const Deck& deck) {
  write_file_atomically(deck.run.out_dir + "/deck.resolved.toml", deck.resolved_toml());
}

// Collective over the run: one epoch for every rank's trace, so the timelines line up in the
// merged file. Records nothing unless output.trace is set.
TraceRecorder trace_recorder(const Deck& deck, const Layout& layout) {
  double epoch = now_seconds();
  MPI_CHECK(MPI_Bcast(&epoch, 1, MPI_DOUBLE, 0, layout.world()));
  if (!deck.output.trace) return TraceRecorder();
  return TraceRecorder(layout.world_rank(), layout.is_holder() ? "holder" : "compute", epoch);
}

std::string layout_text(const LayoutShape& s) {
  return "holders=" + std::to_string(s.holders) + " dp=" + std::to_string(s.dp) +
         " tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp);
}

std::unique_ptr<ckpt::CheckpointWriter> make_writer(const Deck& deck, const ParamCatalog& cat,
                                                    MPI_Comm comm) {
  return std::make_unique<ckpt::CheckpointWriter>(
      comm, cat, ckpt::parse_codec(deck.checkpoint.codec),
      static_cast<int>(deck.checkpoint.anchor_every), deck.checkpoint.dir,
      static_cast<int>(deck.checkpoint.keep), 3,
      ckpt::BitDeltaBits{static_cast<int>(deck.checkpoint.bitdelta_bits),
                         static_cast<int>(deck.checkpoint.moment_bits)});
}

// Loads the restart state into `target` (a holder's server) for the
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

// A baseline replica reads every block it keeps (its stage shard, whatever layout wrote the
// checkpoint) on its own; a damaged checkpoint is one error for the whole job.
void restore_replica(const RestartPoint& rp, const ParamCatalog& cat, MPI_Comm world,
                     DeviceReplica& replica) {
  if (rp.path.empty()) return;
  run_collectively(world, ErrorScope::job, [&] {
    replica.restore(rp.version, read_restart_state(rp, cat, MPI_COMM_SELF, replica.kept_blocks()));
  });
}

// The dry run reads the whole restart checkpoint on rank 0 with the reader a restart uses
// (format, completeness, model shape, every block's CRC, the anchor of a delta), so a damaged
// or mismatched checkpoint fails the dry run as it would fail the run.
void verify_restart_point(const RestartPoint& rp, const ParamCatalog& cat, MPI_Comm world) {
  if (rp.path.empty()) return;
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  run_collectively(world, ErrorScope::job, [&] {
    if (rank != 0) return;
    std::vector<int> all;
    for (const BlockInfo& b : cat.blocks()) all.push_back(b.id);
    read_restart_state(rp, cat, MPI_COMM_SELF, all);
  });
}

// The holders' hooks, recording parameter trajectories too when the deck asks for them. A
// restarted run's recorder first sees the restored version (`restored`), as if it had just
// been made, so the next recorded step has the parameters it changed from.
HolderHooks with_trajectories(HolderHooks hooks, const Deck& deck, const ParamCatalog& cat,
                              MPI_Comm holders, const RestartPoint& restart,
                              const HolderHooks::BlocksGetter& restored) {
  if (deck.output.trajectory_every <= 0) return hooks;
  auto recorder = std::make_shared<TrajectoryRecorder>(
      cat, deck.output.trajectory_every, holders, deck.run.out_dir + "/trajectories.csv",
      restart.version);
  if (restart.version > 0) recorder->after_update(restart.version, restored);
  return TrajectoryRecorder::with_trajectories(std::move(hooks), std::move(recorder));
}

// A restart overwrites every block from its checkpoint (restore refuses one that lacks any), so
// computing the initial values first only cost time (GPT-2 124M: seconds on a holder's cores,
// and every replica of the baseline pays it too). Zeros stand in until the restore.
void zeros_until_restored(BlockTable& table) {
  table.init = [&table](int id, float* out) {
    std::fill(out, out + table.blocks[static_cast<std::size_t>(id)].numel, 0.0f);
  };
}

// Collective: with pd.fetch_path = auto and a fixed-width fetch codec, every holder publishes
// its blocks into a shared segment of its node (pd/shared_segments.hpp). Null for the
// replicated baseline, pd.fetch_path = mpi, lz4, or when a node's /dev/shm lacks room (said
// once, by rank 0).
std::unique_ptr<SharedSegments> share_holder_blocks(const Deck& deck, const Setup& setup,
                                                    const Layout& layout, bool verbose) {
  const WireCodec codec = fetch_codec(deck);
  if (layout.replicated() || deck.pd.fetch_path != "auto" || fused_wire_bytes(codec) == 0)
    return nullptr;
  std::string why_not;
  std::unique_ptr<SharedSegments> s = share_holder_segments(
      layout, setup.table, setup.owner, codec, staleness_plan(deck).staleness,
      setup.node[static_cast<std::size_t>(layout.world_rank())], &why_not);
  if (!s && verbose && layout.world_rank() == 0) {
    std::printf("note: fetches go by MPI message: %s (pd.fetch_path)\n", why_not.c_str());
    std::fflush(stdout);
  }
  return s;
}

// Threads for the initial values (fill_initial_values): while they are filled only the ranks
// that keep parameters work (the holders, or every replica of the baseline; compute ranks wait
// for their first fetch), so those split their node's cores; a rank bound to some cores has them,
// and a holder pd.holder_threads where the deck sets it.
int initial_value_threads(const Deck& deck, const Setup& setup, const Layout& layout) {
  const int mine = setup.node[static_cast<std::size_t>(layout.world_rank())];
  const auto keepers = layout.replicated() ? setup.node.end() : setup.node.begin() + layout.shape().holders;
  const int configured = layout.replicated() ? 0 : static_cast<int>(deck.pd.holder_threads);
  return resolve_holder_threads(configured, static_cast<int>(std::count(setup.node.begin(), keepers, mine)));
}

// What the parameters' owners (the holders, or the baseline's writing replica) do after each
// update: checkpoints, parameter trajectories and samples, over `comm` (the owners).
HolderHooks training_hooks(ckpt::CheckpointWriter& writer, const Deck& deck, const Setup& setup,
                           MPI_Comm comm, const RestartPoint& restart, bool verbose,
                           std::function<HolderHooks::OwnedBlocks()> owned) {
  const std::int64_t tokens_per_step = deck.train.batch_size * deck.model.seq_len;
  return with_training_samples(
      with_trajectories(checkpoint_hooks(writer, deck, layout_text(setup.shape), tokens_per_step,
                                         verbose),
                        deck, *setup.catalog, comm, restart, std::move(owned)),
      deck, *setup.catalog, comm);
}

// A holder: serves its blocks, applies AdamW and (training) writes checkpoints, until every
// compute rank is done. Returns why training diverged, if the holders saw it.
std::string serve_parameters(const Deck& deck, Setup& setup, const Layout& layout,
                             const RunOptions& opts, const RestartPoint& restart,
                             const SharedSegments* segments, TraceRecorder* trace) {
  const bool training = opts.eval_batches == 0;
  setup.table.init_threads = initial_value_threads(deck, setup, layout);
  HolderServer server(layout, setup.table, setup.owner,
                      push_contributions(*setup.catalog, setup.shape.pp), adamw_config(deck),
                      fetch_codec(deck), *wire_codec_from_string(deck.pd.push_codec),
                      staleness_plan(deck), trace);
  server.set_verbose(opts.verbose && training);
  server.set_update_threads(static_cast<int>(deck.pd.holder_threads),
                            static_cast<int>(std::count(setup.node.begin(), setup.node.end(),
                                                        setup.node[layout.world_rank()])));
  if (segments && segments->my_bytes() > 0) server.publish_through(segments);
  setup.table.init = nullptr;  // frees an llm.c file read for initialization
  restore_collectively(restart, *setup.catalog, layout.holders_comm(), layout.world(), &server);
  std::unique_ptr<ckpt::CheckpointWriter> writer;
  if (training) {
    writer = make_writer(deck, *setup.catalog, layout.holders_comm());
    server.set_hooks(training_hooks(*writer, deck, setup, layout.holders_comm(), restart,
                                    opts.verbose && layout.holder_index() == 0,
                                    [&server] { return server.owned_blocks(); }));
  }
  server.run();
  return server.divergence();
}

// A compute rank: its parameters come from the holders (PD) or from its own replica of its stage
// shard (the baseline, where data-parallel replica 0 writes the checkpoints); then the step loop.
TrainResult run_compute_rank(const Deck& deck, Setup& setup, const Layout& layout,
                             const RunOptions& opts, const RestartPoint& restart,
                             kernels::ComputeBackend& backend, const CommChoice& comm,
                             const SharedSegments* segments, TraceRecorder* trace) {
  const bool training = opts.eval_batches == 0;
  ParameterOwner owner;
  std::unique_ptr<ckpt::CheckpointWriter> writer;
  if (layout.replicated()) {
    setup.table.init_threads = initial_value_threads(deck, setup, layout);
    auto replica = std::make_unique<DeviceReplica>(setup.table, adamw_config(deck),
                                                   *backend.device, *backend.ops,
                                                   replica_shard(deck, *setup.catalog, layout));
    restore_replica(restart, *setup.catalog, layout.world(), *replica);
    // Data-parallel replica 0 writes for all, each block from the rank that counts it.
    if (training && layout.dp_rank() == 0) {
      const MPI_Comm writers = layout.replica_comm();
      writer = make_writer(deck, *setup.catalog, writers);
      replica->set_hooks(training_hooks(*writer, deck, setup, writers, restart,
                                        opts.verbose && layout.compute_index() == 0,
                                        [r = replica.get()] { return r->owned_blocks(); }));
    }
    owner = std::move(replica);
  } else {
    restore_collectively(restart, *setup.catalog, MPI_COMM_NULL, layout.world(),
                         static_cast<HolderServer*>(nullptr));
    owner = std::make_unique<FetchClient>(layout, setup.table, setup.owner, fetch_codec(deck),
                                          *wire_codec_from_string(deck.pd.push_codec),
                                          deck.pd.fetch_thread, segments);
  }
  ComputeLoop loop(deck, setup, layout, opts, backend, comm, std::move(owner), restart.step,
                   trace);
  setup.table.init = nullptr;
  return training ? loop.run() : loop.run_eval(opts.eval_batches);
}

// OUT/trace/rank-<r>.json from every rank, then OUT/trace/trace.json merged by rank 0.
void write_traces(const Deck& deck, const TraceRecorder& trace, MPI_Comm world) {
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &size));
  const std::string dir = deck.run.out_dir + "/trace";
  // A rank that cannot write its file is one error for the job; the agreement is also the
  // barrier before rank 0 reads every file.
  run_collectively(world, ErrorScope::job, [&] {
    create_output_directory(dir);
    trace.write(dir + "/rank-" + std::to_string(rank) + ".json");
  });
  run_collectively(world, ErrorScope::job, [&] {
    if (rank != 0) return;
    std::vector<std::string> files;
    for (int r = 0; r < size; ++r) files.push_back(dir + "/rank-" + std::to_string(r) + ".json");
    TraceRecorder::merge(files, dir + "/trace.json");
  });
}

}  // namespace

}  // namespace pdtrain
