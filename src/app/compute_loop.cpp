// The compute ranks' step loop. It reads like the algorithm:
//   parameters of version s-1 in -> forward/backward on this replica's slice of batch s
//   -> gradients out (reduced over replicas in a fixed order, to their owner) -> (report)
// Where parameters come from and gradients go is the ParameterStep chosen once at
// construction (parameter_step.hpp): PD's holders, or the baseline's own replica.
#include "pdtrain/app/compute_loop.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <variant>

#include "pdtrain/app/report.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/core/signals.hpp"
#include "pdtrain/optim/divergence.hpp"

namespace pdtrain {

// Step k computes on parameter version max(0, k-1-staleness) (pd/staleness.hpp): with
// staleness 0 that is the version its previous step produced (exact synchronous training);
// with s > 0, after the synchronous warm-up, compute runs up to s steps ahead of the holders'
// updates.
TrainResult ComputeLoop::run() {
  TrainResult result;
  result.reporter = layout_.is_reporter();
  if (result.reporter) open_outputs();
  const std::int64_t steps = deck_.run.steps;
  const StalenessPlan staleness = staleness_plan(deck_);
  // --stop-after ends the run early with a checkpoint; the schedule still targets run.steps.
  const std::int64_t last = opts_.stop_after > 0 ? std::min(steps, opts_.stop_after) : steps;
  const double tokens_per_step = static_cast<double>(deck_.train.batch_size * T_);
  const double t_start = now_seconds();
  double t_prev = t_start;
  std::int64_t k = start_step_;
  while (k < last) {
    ++k;
    StepRecord rec;
    rec.step = k;
    rec.fetch_ms = 1e3 * step_->use_version(staleness.version_for_step(k, start_step_));
    forward_backward(k, rec);
    // Before the update where the loss can stop it: the baseline's is applied in gradients_out
    // (PD's holders update as the last pushes, sent during backward, arrive).
    rec.loss = reducer_.sum(runner_.loss_sum()) / tokens_per_step;
    check_loss(k, rec.loss);
    step_->gradients_out(k, rec);
    check_norms();
    if (eval_due(k) && diverged_at_ == 0) {  // on exactly the parameters after step k
      rec.fetch_ms += 1e3 * step_->use_version(k);
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
      result.stopped = diverged_at_ == 0;
      // Said before the checkpoint is written: should the job be killed while writing it, the
      // log says why the run ended, and the previous checkpoint is the one to resume from.
      if (result.stopped && result.reporter) {
        std::printf("stop requested by a signal: step %lld is the last; writing a checkpoint\n",
                    static_cast<long long>(k));
        std::fflush(stdout);
      }
      break;
    }
  }
  result.final_step = k;
  step_->learn_update_figures(k);
  check_norms();
  if (diverged_at_ > 0) end_diverged(result);
  if (result.reporter) {
    report_known(0.0);
    PDT_CHECK(pending_.empty(), "step " + std::to_string(pending_.empty() ? 0 : pending_.front().step) +
                                    " never learnt its update (gradient norm, lr) from the holders: "
                                    "its metrics.csv row would be lost");
    metrics_->close();  // a full disk may show only at fsync
  }
  result.params_crc32c = step_->owner().finish_and_checksum();
  result.wall_seconds = now_seconds() - t_start;
  write_fetch_figures();
  if (result.reporter && opts_.verbose)
    print_run_summary(deck_, result, start_step_, timers_, step_->figures(),
                      stage_params_.numel() * 4, *backend_.device);
  return result;
}

void ComputeLoop::forward_backward(std::int64_t step, StepRecord& rec) {
  ScopedPhase t(timers_, "compute");
  const double t0 = now_seconds();
  stage_params_.zero_grads();  // resident gradients; streamed ones are zeroed when bound
  // The loss is the mean over every token of the global batch, so each micro-batch's and
  // each replica's gradient is a partial sum and they simply add.
  runner_.train(batch_of_step(step, opts_.skipped_batches),
                1.0f / static_cast<float>(deck_.train.batch_size * T_));
  double waited = 0.0;
  const PassTimes pass = step_->train_pass(step, [&] {
    if (deck_.parallel.order == StageOrder::layer)
      runner_.train_layer_major(micro_batches_);  // one stage: no pipeline to wait for
    else
      waited = pipeline_.run_step(runner_);
  });
  backend_.device->synchronize();  // a GPU's queued work belongs to this phase
  rec.fetch_ms += 1e3 * pass.fetch_wait;
  const double elapsed = now_seconds() - t0;
  // The rest is fetch_ms and reduce_ms.
  rec.compute_ms = 1e3 * (elapsed - pass.fetch_wait - pass.streamed);
  rec.bubble = mean_over_stages(elapsed > 0 ? waited / elapsed : 0.0);
}

bool ComputeLoop::eval_due(std::int64_t s) const {
  return staleness_plan(deck_).evaluated_after(s);
}

// Mean loss over the first eval_batches validation batches, each split over the replicas and
// into micro-batches, run forward through the pipeline.
double ComputeLoop::evaluate(std::int64_t batches) {
  ScopedPhase t(timers_, "eval");
  TraceSpan span(trace_, "eval", "compute");
  runner_.eval(micro_batches_, deck_.train.batch_size);
  const int forwards = static_cast<int>(batches) * micro_batches_;
  step_->eval_pass(forwards, [&] { pipeline_.run_forward(runner_, forwards); });
  const double tokens = static_cast<double>(batches * deck_.train.batch_size * T_);
  return reducer_.sum(runner_.loss_sum()) / tokens;
}

// Reports, in step order, the records whose update (gradient norm, lr) is known.
void ComputeLoop::report_known(double eta) {
  while (!pending_.empty()) {
    if (diverged_at_ > 0 && pending_.front().step > diverged_at_) break;  // never reported
    const auto info = step_->owner().update_info(pending_.front().step);
    if (!info) break;
    pending_.front().grad_norm = info->grad_norm;
    pending_.front().lr = info->lr;
    report_step(*metrics_, pending_.front(), deck_, opts_.verbose, eta);
    pending_.pop_front();
  }
}

// Whether any rank (compute or, through its replies, holder) got a stop signal, or saw
// training diverge: all compute ranks agree, so they all end after the same step (and on the
// earliest step any of them saw diverge).
bool ComputeLoop::stop_requested() {
  constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();
  // MPI_MAX of {signal, -diverged step}: the earliest divergence wins.
  std::int64_t v[2] = {stop_signal_received() || step_->owner().holders_asked_to_stop() ? 1 : 0,
                       diverged_at_ > 0 ? -diverged_at_ : kNone};
  MPI_Request r;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MAX, layout_.compute_comm(), &r));
  wait_quietly(&r);
  if (v[1] != kNone) diverged_at_ = -v[1];
  return v[0] != 0 || v[1] != kNone;
}

// ---------------------------------------------------------------- the divergence guard

// A loss that is not finite, or (train.loss_spike_factor > 0) above that factor times the
// median of the previous train.loss_spike_window losses, ends the run after this step (every
// rank of the last stage sees it). The baseline then applies no update of it; PD's holders
// applied it already (their gradient norm was finite, or they would have stopped themselves).
void ComputeLoop::check_loss(std::int64_t step, double loss) {
  std::string spike;
  const double factor = deck_.train.loss_spike_factor;
  const auto window = static_cast<std::size_t>(deck_.train.loss_spike_window);
  if (std::isfinite(loss) && factor > 0.0 && recent_losses_.size() == window) {
    const double m = median(std::vector<double>(recent_losses_.begin(), recent_losses_.end()));
    if (loss > factor * m) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "over %g x %g, the median of the previous %zu steps; ",
                    factor, m, window);
      spike = buf;
    }
  }
  if (std::isfinite(loss) && spike.empty()) {
    recent_losses_.push_back(loss);
    if (recent_losses_.size() > window) recent_losses_.pop_front();
    return;
  }
  const std::string where = spike + "the mean over the global batch, on compute rank " +
                            std::to_string(layout_.compute_index()) + " (world rank " +
                            std::to_string(layout_.world_rank()) + ")";
  note_divergence(step, divergence_message(step, "the loss", loss, where) +
                            step_->after_loss_divergence(step));
  step_->owner().mark_diverged(step);  // the baseline's replica does not apply this step
}

// Updates this rank has learnt of (the baseline's at once, PD's with the replies of the next
// fetch) whose gradient norm was not finite: the holders or the replica did not apply them.
void ComputeLoop::check_norms() {
  while (diverged_at_ == 0) {
    const auto info = step_->owner().update_info(norm_checked_ + 1);
    if (!info) return;
    ++norm_checked_;
    if (std::isfinite(info->grad_norm)) continue;
    note_divergence(info->version, step_->norm_divergence(*info));
  }
}

void ComputeLoop::note_divergence(std::int64_t step, const std::string& why) {
  if (diverged_at_ > 0 && diverged_at_ <= step) return;
  diverged_at_ = step;
  divergence_ = why;
}

// After a divergence at step D: no record after D is reported (their steps computed on
// parameters that did not change), the owners of the parameters write no final checkpoint, and
// the ranks that saw why say so (train.cpp ends the job with status 5).
void ComputeLoop::end_diverged(TrainResult& result) {
  while (!pending_.empty() && pending_.back().step > diverged_at_) pending_.pop_back();
  const auto kept = static_cast<std::size_t>(std::max<std::int64_t>(0, diverged_at_ - start_step_));
  if (result.losses.size() > kept) result.losses.resize(kept), result.val_losses.resize(kept);
  result.final_step = diverged_at_;
  step_->owner().mark_diverged(diverged_at_);
  result.diverged_step = diverged_at_;
  result.divergence = divergence_;
}

TrainResult ComputeLoop::run_eval(std::int64_t batches) {
  TrainResult result;
  result.reporter = layout_.is_reporter();
  step_->use_version(start_step_);
  const double loss = evaluate(batches);
  result.val_losses.push_back(loss);
  result.params_crc32c = step_->owner().finish_and_checksum();
  if (result.reporter && opts_.verbose)
    print_eval_result(deck_, batches, loss, result.params_crc32c);
  return result;
}

// ---------------------------------------------------------------- set-up and helpers

ComputeLoop::ComputeLoop(const Deck& deck, const Setup& setup, const Layout& layout,
                         const RunOptions& opts, kernels::ComputeBackend& backend,
                         const CommChoice& comm, ParameterOwner owner, std::int64_t start_step,
                         TraceRecorder* trace)
    : deck_(deck), setup_(setup), layout_(layout), opts_(opts), trace_(trace),
      start_step_(start_step),
      backend_(backend),
      comm_(comm),
      comms_(make_compute_comms(comm, layout, *backend.device)),
      // PD streams a stage's parameters through a bounded cache; the baseline keeps its whole
      // stage resident.
      stage_params_(*setup.catalog, stage_spec(deck, layout),
                    layout.replicated() ? StageParams::Storage::resident
                                        : StageParams::Storage::streamed,
                    deck.train.precision, *backend.device),
      micro_batches_(static_cast<int>(deck.parallel.micro_batches)),
      kind_(*pipeline_kind_from_string(deck.parallel.schedule)),
      micro_batch_(micro_batch_size(deck, layout.shape())),
      T_(deck.model.seq_len),
      slots_(activation_slots(deck, layout.shape(), layout.pp_rank())),
      stage_(stage_params_, micro_batch_, T_, comms_.model_tp(), slots_, recompute_mode(deck),
             *backend.ops, deck.parallel.order),
      runner_(stage_, *setup.source, layout.dp_rank() * (deck.train.batch_size / layout.shape().dp),
              micro_batch_, T_, slots_, *backend.device, comms_.pp->device_memory()),
      pipeline_(*comms_.pp, kind_, micro_batches_, micro_batch_ * T_ * deck.model.d_model,
                trace, runner_.message_memory()),
      reducer_(layout.dp_comm(), pushed_blocks(), block_sizes(pushed_blocks()), comms_.dp.get()),
      phases_(timers_, trace),
      step_(std::visit(
          [&](auto&& o) {
            return make_parameter_step(
                std::move(o), StepParts{deck, layout, stage_params_, reducer_, *comms_.tp,
                                        *comms_.pp, *backend.ops, phases_, kind_,
                                        micro_batches_});
          },
          std::move(owner))) {
  norm_checked_ = start_step;
}

// Blocks whose reduced gradient this rank's data-parallel group pushes: its stage's blocks,
// less those replicated over the tensor-parallel group on tp ranks other than 0.
std::vector<int> ComputeLoop::pushed_blocks() const {
  std::vector<int> out;
  for (int b : stage_params_.needed_blocks())
    if (stage_params_.pushes(setup_.catalog->block(b))) out.push_back(b);
  return out;
}

std::vector<std::int64_t> ComputeLoop::block_sizes(const std::vector<int>& blocks) const {
  std::vector<std::int64_t> n;
  for (int b : blocks) n.push_back(setup_.catalog->block(b).numel());
  return n;
}

// The measured bubble: the share of the pipeline phase each stage spent waiting for its
// neighbours, averaged over the stages.
double ComputeLoop::mean_over_stages(double x) {
  if (layout_.shape().pp == 1) return 0.0;
  MPI_Request r;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, layout_.pp_comm(), &r));
  wait_quietly(&r);
  return x / layout_.shape().pp;
}

void ComputeLoop::open_outputs() {
  metrics_ = std::make_unique<MetricsWriter>(deck_.run.out_dir + "/metrics.csv", start_step_);
  if (opts_.verbose) print_run_header(deck_, setup_, layout_, backend_.ops->describe(), comm_.why);
}

void ComputeLoop::write_fetch_figures() {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(layout_.world(), &rank));
  step_->write_fetch_figures(deck_.run.out_dir, rank);
}

}  // namespace pdtrain
