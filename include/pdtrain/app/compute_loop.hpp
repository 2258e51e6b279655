#pragma once
// The compute ranks' step loop (see compute_loop.cpp for the algorithm as code): parameters
// from a ParameterService (holders, or the rank's own DeviceReplica in the baseline), forward
// and backward through the pipeline on this replica's slice of the batch on the rank's compute
// backend (CPU or GPU), the fixed-order gradient reduction, the push, and on the reporter the
// step's record.
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "pdtrain/app/compute_comms.hpp"
#include "pdtrain/app/grad_stream.hpp"
#include "pdtrain/app/setup.hpp"
#include "pdtrain/app/stage_cache.hpp"
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
#include "pdtrain/pd/device_replica.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/schedule/grad_reduce.hpp"
#include "pdtrain/schedule/pipeline_executor.hpp"
#include "pdtrain/schedule/pipeline_schedule.hpp"

namespace pdtrain {

class ComputeLoop {
 public:
  // `replica`: the baseline's DeviceReplica (it is `service`), null under PD.
  ComputeLoop(const Deck& deck, const Setup& setup, const Layout& layout, const RunOptions& opts,
              kernels::ComputeBackend& backend, const CommChoice& comm,
              std::unique_ptr<ParameterService> service,
              DeviceReplica* replica, std::int64_t start_step, TraceRecorder* trace);

  // The step loop, from the step after start_step to run.steps (or --stop-after, or a signal).
  TrainResult run();
  // Evaluation only: the mean loss of the initial parameters over `batches` batches.
  TrainResult run_eval(std::int64_t batches);

 private:
  // One step's parts, in the order run() calls them.
  double ensure_version(std::int64_t version);
  void forward_backward(std::int64_t step, StepRecord& rec);
  void reduce_and_push(std::int64_t step, StepRecord& rec);
  bool eval_due(std::int64_t s) const;
  double evaluate(std::int64_t batches);
  void report_known(double eta);
  bool stop_requested();
  void learn_updates(std::int64_t version);
  // The divergence guard (a loss or gradient norm that is not finite ends the run).
  void check_loss(std::int64_t step, double loss);
  void check_norms();
  void note_divergence(std::int64_t step, const std::string& why);
  void end_diverged(TrainResult& result);

  // Parameters: a pass of the PD cache, or the baseline replica's (publish).
  template <class Body>
  double cache_pass(const std::vector<std::vector<int>>& plan, Body&& body);
  void publish(std::int64_t version);
  void update_replica(std::int64_t step, StepRecord& rec);
  double mean_over_stages(double x);
  std::vector<int> pushed_blocks() const;
  std::vector<std::int64_t> block_sizes(const std::vector<int>& blocks) const;
  void open_outputs();
  void write_heat_map();
  void trace_event(const char* name, const char* cat, double t0, double t1);

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
  std::unique_ptr<ParameterService> service_;
  DeviceReplica* replica_ = nullptr;         // baseline only (service_ itself)
  std::vector<kernels::KernelOps::Tile> tiles_;  // baseline: every block in the stage's buffers
  std::unique_ptr<StageCache> cache_;        // PD only
  std::unique_ptr<GradStreamer> grads_;      // PD only: gradients pushed during backward
  double streamed_before_ = 0.0;             // grads_->stream_seconds() at the step's start
  std::int64_t train_fetched_bytes_ = 0;     // PD: fetched by training passes (not evaluation)
  std::vector<std::vector<int>> step_plan_;  // the cache's uses in one step
  std::int64_t pass_version_ = 0;            // the version the next pass computes on
  std::vector<float> packed_;  // baseline with dp > 1: the stage's gradients, packed
  std::unique_ptr<MetricsWriter> metrics_;
  PhaseTimers timers_;
  std::int64_t have_version_ = -1;  // baseline: parameter version published to stage_params_
  std::deque<StepRecord> pending_;  // records waiting for their update's figures
  std::int64_t norm_checked_ = 0;   // updates whose gradient norm check_norms() has seen
  std::int64_t diverged_at_ = 0;    // the first step that diverged (agreed after each step)
  std::string divergence_;          // why, when this rank saw it
  std::deque<double> recent_losses_;  // the last train.loss_spike_window losses
};

}  // namespace pdtrain
