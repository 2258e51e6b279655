#pragma once
// The compute ranks' step loop (see compute_loop.cpp for the algorithm as code): parameters
// in through a ParameterStep (holders, or the rank's own DeviceReplica in the baseline), forward
// and backward through the pipeline on this replica's slice of the batch on the rank's compute
// backend (CPU or GPU), the fixed-order gradient reduction, the push, and on the reporter the
// step's record.
#include <cstdint>
#include <deque>
#include <memory>
#include <variant>
#include <vector>

#include "pdtrain/app/compute_comms.hpp"
#include "pdtrain/app/parameter_step.hpp"
#include "pdtrain/app/setup.hpp"
#include "pdtrain/app/stage_runner.hpp"
#include "pdtrain/app/train.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/device/host_staging.hpp"
#include "pdtrain/io/metrics.hpp"
#include "pdtrain/io/trace.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/schedule/grad_reduce.hpp"
#include "pdtrain/schedule/pipeline_executor.hpp"
#include "pdtrain/schedule/pipeline_schedule.hpp"

namespace pdtrain {

// Who owns the parameters: the holders, reached through a FetchClient (PD), or this rank's
// own replica (the baseline). The loop builds the matching ParameterStep once.
using ParameterOwner = std::variant<std::unique_ptr<FetchClient>, std::unique_ptr<DeviceReplica>>;

class ComputeLoop {
 public:
  ComputeLoop(const Deck& deck, const Setup& setup, const Layout& layout, const RunOptions& opts,
              kernels::ComputeBackend& backend, const CommChoice& comm, ParameterOwner owner,
              std::int64_t start_step, TraceRecorder* trace);

  // The step loop, from the step after start_step to run.steps (or --stop-after, or a signal).
  TrainResult run();
  // Evaluation only: the mean loss of the initial parameters over `batches` batches.
  TrainResult run_eval(std::int64_t batches);

 private:
  // One step's parts, in the order run() calls them (with step_'s).
  void forward_backward(std::int64_t step, StepRecord& rec);
  bool eval_due(std::int64_t s) const;
  double evaluate(std::int64_t batches);
  void report_known(double eta);
  bool stop_requested();
  // The divergence guard (a loss or gradient norm that is not finite ends the run).
  void check_loss(std::int64_t step, double loss);
  void check_norms();
  void note_divergence(std::int64_t step, const std::string& why);
  void end_diverged(TrainResult& result);

  double mean_over_stages(double x);
  std::vector<int> pushed_blocks() const;
  std::vector<std::int64_t> block_sizes(const std::vector<int>& blocks) const;
  void open_outputs();
  void write_fetch_figures();

  const Deck& deck_;
  const Setup& setup_;
  const Layout& layout_;
  RunOptions opts_;
  TraceRecorder* trace_;
  std::int64_t start_step_;
  kernels::ComputeBackend& backend_;
  CommChoice comm_;
  ComputeComms comms_;  // the tp group the model uses, the pipeline's neighbours
  StageParams stage_params_;
  int micro_batches_;
  PipelineKind kind_;
  std::int64_t micro_batch_, T_;
  int slots_;
  GptStage stage_;
  StageRunner runner_;
  PipelineExecutor pipeline_;
  GradReducer reducer_;
  PhaseTimers timers_;
  StepPhases phases_;
  std::unique_ptr<ParameterStep> step_;  // parameters in, gradients out
  std::unique_ptr<MetricsWriter> metrics_;
  std::deque<StepRecord> pending_;  // records waiting for their update's figures
  std::int64_t norm_checked_ = 0;   // updates whose gradient norm check_norms() has seen
  std::int64_t diverged_at_ = 0;    // the first step that diverged (agreed after each step)
  std::string divergence_;          // why, when this rank saw it
  std::deque<double> recent_losses_;  // the last train.loss_spike_window losses
};

}  // namespace pdtrain
