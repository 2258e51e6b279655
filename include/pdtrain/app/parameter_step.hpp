#pragma once
// Where a compute rank's parameters come from and its gradients go, one object per mode, chosen
// once when the step loop is built: HolderStep (PD: the stage cache fetches from the holders
// during the passes, the gradient streamer reduces and pushes during backward) and ReplicaStep
// (the replicated baseline: the rank's own DeviceReplica on its device). The loop calls the
// same steps on either, never asking which it has.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "pdtrain/app/grad_stream.hpp"
#include "pdtrain/app/setup.hpp"
#include "pdtrain/app/stage_cache.hpp"
#include "pdtrain/core/collectives.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/io/metrics.hpp"
#include "pdtrain/io/trace.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/pd/device_replica.hpp"
#include "pdtrain/pd/fetch_client.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/schedule/grad_reduce.hpp"
#include "pdtrain/schedule/pipeline_schedule.hpp"

namespace pdtrain {

// A phase of the step that just ran from t0 to t1 (seconds): its milliseconds into the step's
// record, its seconds into the run's phase timers, its span into the trace.
class StepPhases {
 public:
  StepPhases(PhaseTimers& timers, TraceRecorder* trace) : timers_(timers), trace_(trace) {}
  // `span` null: no trace event.
  void record(double& ms, const char* phase, double t0, double t1, const char* span,
              const char* category);
  PhaseTimers& timers() { return timers_; }
  TraceRecorder* trace() const { return trace_; }

 private:
  PhaseTimers& timers_;
  TraceRecorder* trace_;
};

// What both step objects are built from: the loop's stage, reducer, groups and clocks.
struct StepParts {
  const Deck& deck;
  const Layout& layout;
  StageParams& stage;
  GradReducer& reducer;
  // The compute ranks' tensor-parallel group and pipeline (app/compute_comms): the replicated
  // baseline completes the gradients that cross stages or tp ranks over them (on device memory
  // with NCCL).
  Collectives& tp;
  Collectives& pp;
  kernels::KernelOps& ops;
  StepPhases& phases;
  PipelineKind kind;
  int micro_batches;
};

// The seconds a pass spent waiting for parameters, and (PD) reducing and pushing gradients
// during it.
struct PassTimes {
  double fetch_wait = 0.0;
  double streamed = 0.0;
};

// What the run's summary shows of the parameters' path (null where the mode has none).
struct ParameterFigures {
  const ParameterService& owner;
  const StageCache* cache = nullptr;
  std::int64_t train_fetched_bytes = 0;
  const GradStreamer* grads = nullptr;
};

class ParameterStep {
 public:
  virtual ~ParameterStep() = default;
  // The parameters' owner: update figures, stop and divergence notes, the final CRC.
  virtual ParameterService& owner() = 0;
  // Parameters in: the passes that follow compute on `version`. The replica scatters it into
  // the stage now; the holders' blocks are fetched during the passes. Returns the seconds
  // spent here.
  virtual double use_version(std::int64_t version) = 0;
  // Runs `pass` (every forward and backward of step `step`) with the parameters arriving as
  // it uses them.
  virtual PassTimes train_pass(std::int64_t step, const std::function<void()>& pass) = 0;
  // Runs `pass` (`forwards` forwards of an evaluation); returns the seconds it waited.
  virtual double eval_pass(int forwards, const std::function<void()>& pass) = 0;
  // Gradients out: step `step`'s gradients, reduced over the replicas, to the parameters'
  // owner, who applies them. Fills the record's reduce and push times.
  virtual void gradients_out(std::int64_t step, StepRecord& rec) = 0;
  // Makes sure this rank knows the owner's figures (gradient norm, lr) of every update up to
  // `version`.
  virtual void learn_update_figures(std::int64_t version) = 0;
  // The divergence guard's words: what a diverged loss at `step` means for its update, and
  // why an update whose gradient norm was not finite was not applied.
  virtual std::string after_loss_divergence(std::int64_t step) const = 0;
  virtual std::string norm_divergence(const UpdateInfo& info) const = 0;
  virtual ParameterFigures figures() const = 0;
  // The rank's per-block fetch figures under `out_dir` (PD's heat map; none in the baseline).
  virtual void write_fetch_figures(const std::string& out_dir, int world_rank) const = 0;
};

// PD: parameters from the holders through `client`.
std::unique_ptr<ParameterStep> make_parameter_step(std::unique_ptr<FetchClient> client,
                                                   StepParts parts);
// The baseline: parameters on this rank's `replica`.
std::unique_ptr<ParameterStep> make_parameter_step(std::unique_ptr<DeviceReplica> replica,
                                                   StepParts parts);

}  // namespace pdtrain
