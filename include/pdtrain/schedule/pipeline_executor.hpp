#pragma once
// Runs a stage's pipeline action list (pipeline_schedule.hpp) with MPI point-to-point between
// neighbouring stages. Posting order: each receive is posted right before the compute that
// needs it and waited on quietly; each send is non-blocking (MPI_Isend from a buffer owned by
// the executor) and completed at the end of the step. With non-blocking sends the 1F1B and
// GPipe lists cannot deadlock (the schedule tests simulate every stage/micro-batch count), and
// tags (pipeline_tag) encode micro-batch and direction, so a message can only match its own
// receive.
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "pdtrain/io/trace.hpp"
#include "pdtrain/schedule/pipeline_schedule.hpp"

namespace pdtrain {

// What the executor asks of the model side for one stage.
class PipelineStageOps {
 public:
  virtual ~PipelineStageOps() = default;
  // Forward of micro-batch `mb`; `input` is the previous stage's output (null on stage 0).
  virtual void forward(int mb, const float* input) = 0;
  // This stage's output for `mb` (valid until its activation slot is reused).
  virtual const float* output(int mb) = 0;
  // Backward of `mb`; `doutput` is the next stage's input gradient (null on the last stage).
  virtual void backward(int mb, const float* doutput) = 0;
  // d(input) of the last backward.
  virtual const float* dinput() = 0;
};

class PipelineExecutor {
 public:
  PipelineExecutor(MPI_Comm pp_comm, PipelineKind kind, int micro_batches,
                   std::int64_t activation_numel, TraceRecorder* trace);

  // One optimizer step's forward and backward passes. Returns the seconds this stage waited for
  // its neighbours (its share of the pipeline bubble).
  double run_step(PipelineStageOps& ops);
  // Forward passes only (validation), micro-batches 0..count-1.
  void run_forward(PipelineStageOps& ops, int count);

  int stage() const { return stage_; }
  int stages() const { return stages_; }

 private:
  double recv(int from, int tag);          // into recv_; returns seconds waited
  void send(int to, int tag, const float* data);
  void finish_sends();
  void run(const std::vector<PipelineAction>& actions, PipelineStageOps& ops, double* waited);

  MPI_Comm comm_;
  PipelineKind kind_;
  int micro_batches_, stage_ = 0, stages_ = 1;
  std::int64_t numel_;
  TraceRecorder* trace_;
  std::vector<float> recv_;
  std::vector<std::vector<float>> send_bufs_;
  std::vector<MPI_Request> send_reqs_;
};

}  // namespace pdtrain
